# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # The state disk inside the sealed hand-overs (init_ticket, join_ticket).
    DOCUMENTATION = r"""
options:
  state_disk:
    description:
      - The LUKS2 state disk. Formatted with a throw-away key if it is not LUKS yet, then re-keyed to the key derived
        from the master secret and its lower-case LUKS UUID (see M(confidential.kubernetes.state_disk)).
    type: dict
    suboptions:
      device:
        description: Block device or file.
        type: path
        required: true
      state:
        description:
          - V(formatted), or also V(opened) (mapped) or V(mounted); mapping needs device-mapper.
          - V(mounted) keeps the node's cluster state on the disk (C(/etc/kubernetes), C(/var/lib/etcd), C(/var/lib/kubelet),
            C(/var/lib/containerd), bind-mounted from it; see M(confidential.kubernetes.state_disk)).
        type: str
        choices: [formatted, opened, mounted]
        default: formatted
      name:
        description: The device-mapper name.
        type: str
        default: state
      mount_path:
        description: Where the filesystem is mounted for V(mounted).
        type: path
        default: /var/lib/confidential-kubernetes/state
      pbkdf_memory:
        description: argon2id memory cost in KiB (cryptsetup's default when omitted).
        type: int
      pbkdf_iterations:
        description: argon2id iterations (cryptsetup's default when omitted).
        type: int
"""
