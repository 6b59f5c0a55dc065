#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: node_enrolment
short_description: Enrol nodes' TPMs with their names, roles and disks in the controller's node enrolment file
version_added: 0.2.0
description:
  - The join service grants a node its name, its role and its state disk from this file (identity, role and disk are
    granted, never claimed). The controller enrols its inventory hosts from their TPMs' endorsement
    keys (M(confidential.kubernetes.tpm_identity)); the C(joinservice) role pushes the file to every control plane and
    fails when a join service does not load it.
  - Each node replaces any entry with the same EK or the same name; other entries stay. The file is merged under an
    exclusive lock (C(<enrolment_file>.lock)), so concurrent runs do not lose each other's nodes, and written
    atomically with mode 0600.
  - A node given without a disk UUID (its state disk is not LUKS yet because it never joined, or it was reset) gets a
    new enrolment ID, which voids disk bindings made under an older one, so that it can bind its new disk at its next
    join. A node given with its disk UUID is bound to that disk; only its EK gets that disk's key, by join or rejoin.
  - Runs on the controller. Returns nothing secret.
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
  - confidential.kubernetes._attributes.action
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  idempotent:
    support: partial
    details:
      - Nodes enrolled without a disk get a new enrolment ID at every run (and report a change) until they have joined.
options:
  enrolment_file:
    description: The node enrolment file on the controller.
    type: path
    required: true
  absent:
    description: Node names to remove from the enrolment (nodes taken out of the cluster for good); their TPMs get nothing more.
    type: list
    elements: str
    default: []
  disk_bindings:
    description:
      - The cluster's disk bindings, each the content of a join service's mirror C(disk-bindings.json) (the
        C(joinservice) role reads every control plane's).
      - A node whose O(nodes[].disk_uuid) is bound to another TPM, here or in the enrolment file, is refused with both
        nodes named, and nothing changes; a bound disk is released only by C(remove_node.yml).
    type: list
    elements: str
    default: []
  nodes:
    description: The nodes to enrol.
    type: list
    elements: dict
    default: []
    suboptions:
      ek:
        description: The node's identity, the C(ek) that M(confidential.kubernetes.tpm_identity) returns.
        type: str
        required: true
      node_name:
        description: The Kubernetes node name the join service grants this TPM.
        type: str
        required: true
      control_plane:
        description: Whether this TPM may join as a control plane (and get the control-plane PKI and root secrets).
        type: bool
        default: false
      disk_uuid:
        description: The LUKS UUID of the node's state disk, when it has one; the disk is then bound to this TPM.
        type: str
      ek_certificate:
        description: The EK certificate (DER, base64), recorded for audit; it must certify the EK.
        type: str
seealso:
  - module: confidential.kubernetes.tpm_identity
  - name: The joinservice role
    description: Enrols the inventory (entry point C(enrol)) and pushes the enrolment to every join service.
    link: https://github.com/confidential-kubernetes/confidential.kubernetes/blob/main/docs/roles/joinservice.md
"""

EXAMPLES = r"""
- name: Read the node's TPM identity
  confidential.kubernetes.tpm_identity:
  register: identity

- name: Enrol the node (on the controller)
  confidential.kubernetes.node_enrolment:
    enrolment_file: "{{ inventory_dir }}/secrets/node-enrolment.json"
    nodes:
      - ek: "{{ identity.ek }}"
        node_name: "{{ inventory_hostname }}"
        control_plane: "{{ inventory_hostname in groups['control_plane'] }}"
        ek_certificate: "{{ identity.ek_certificate }}"
  delegate_to: localhost
"""

RETURN = r"""
enrolment_file:
  description: The enrolment file.
  returned: success
  type: str
digest:
  description: SHA-256 (hex) of the enrolment file; a join service that loaded it reports the same digest.
  returned: success
  type: str
nodes:
  description: Every enrolled node after the merge, by name.
  returned: success
  type: dict
  sample:
    worker-1: {ek: 80cd394f3e92b809..., control_plane: false, disk_uuid: 0d3b1c4e-9f2a-4e57-8a61-2f4c9b7d5e13}
"""
