#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: pkcs11_custody
short_description: Wrap the controller's root secrets file by a PKCS#11 token's AES key, or back to plain (controller)
version_added: 0.2.0
description:
  - With O(state=wrapped), encrypts the plain secrets file O(secrets_file) with AES-256-GCM on the PKCS#11 token
    O(token_label) of the module O(module), under the AES key O(key_label), which must be non-extractable and
    sensitive (else refused), checks that the token decrypts it back, and replaces the file (0600). The wrapped file
    names the module, token, key and PIN source (not secret; authenticated as GCM additional data).
  - Every controller task that needs the root secrets then unwraps them in memory (python-pkcs11 on the controller),
    reading the PIN from the environment variable O(pin_env) or the 0600 file O(pin_file), never from argv.
  - With O(state=plain) and O(confirm) set to the cluster ID, writes the plain file back.
  - A wrong PIN, a missing token or key, an extractable key or a tampered wrapped file each fail naming what was
    wrong, and change nothing.
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
  - confidential.kubernetes._attributes.action
attributes:
  check_mode:
    support: partial
    details:
      - Reports a change and touches neither the token nor the file; nothing is checked.
  diff_mode:
    support: none
  idempotent:
    support: none
    details:
      - Wrapping a wrapped file (or unwrapping a plain one) is refused.
options:
  state:
    description: V(wrapped) wraps the plain file; V(plain) unwraps it for good.
    type: str
    choices: [wrapped, plain]
    default: wrapped
  secrets_file:
    description: The cluster's root secrets file on the controller. A path, not a secret.
    type: path
    required: true
  module:
    description: The PKCS#11 module (shared library) on the controller, for example C(/usr/lib/softhsm/libsofthsm2.so).
    type: path
  token_label:
    description: The token's label.
    type: str
  key_label:
    description: The label of the token's AES key (non-extractable, sensitive).
    type: str
    default: confidential-kubernetes-root
  pin_env:
    description: The name of the environment variable that holds the user PIN (the name, not the PIN).
    type: str
  pin_file:
    description: A file (0600) that holds the user PIN (the path, not the PIN).
    type: path
  confirm:
    description: With O(state=plain), the cluster ID (64 hex characters); anything else is refused.
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: Wrap the root secrets by the HSM's key
  confidential.kubernetes.pkcs11_custody:
    secrets_file: "{{ inventory_dir }}/secrets/cluster-secrets.json"
    module: /usr/lib/softhsm/libsofthsm2.so
    token_label: cluster-root
    pin_env: CK_PKCS11_PIN
"""

RETURN = r"""
cluster_id:
  description: The cluster ID (hex).
  returned: success
  type: str
state:
  description: The custody the file is now in.
  returned: success
  type: str
"""
