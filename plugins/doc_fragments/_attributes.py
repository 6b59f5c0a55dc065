# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # Standard documentation fragment
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
  idempotent:
    description:
      - When run twice in a row outside check mode, with the same arguments, the second invocation indicates no change.
      - This assumes that the system controlled/queried by the module has not changed in a relevant way.
"""

    # Should be used together with the standard fragment: a module whose work is done by its action plugin.
    ACTION = r"""
options: {}
attributes:
  action:
    support: full
    description: Indicates this has a corresponding action plugin so some parts of the options can be executed on the controller.
"""

    # Should be used together with the standard fragment
    INFO_MODULE = r"""
options: {}
attributes:
  check_mode:
    support: full
    details:
      - This action does not modify state.
  diff_mode:
    support: N/A
    details:
      - This action does not modify state.
"""

    TPM = r"""
options:
  tcti:
    description:
      - How to reach the TPM, as a TSS2 TCTI string.
      - V(auto) uses C(device:/dev/tpmrm0) when that device exists (real hosts) and
        C(swtpm:path=/run/tpm/swtpm.sock) otherwise (a software TPM, swtpm, listening there).
    type: str
    default: auto
requirements:
  - tpm2-pytss (with the tpm2-tss libraries) on the node
  - cryptography >= 47 on the node
"""
