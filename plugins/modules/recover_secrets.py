#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: recover_secrets
short_description: Attest a control plane that waits for keys and seal the key of its own state disk to it (controller)
version_added: 0.2.0
description:
  - The controller side of the recover hand-over (C(recover.yml)), for a control plane that was rebooted while no join
    service could serve its rejoin (every control plane lost power).
  - Verifies the node's evidence like M(confidential.kubernetes.verify_evidence), with PCR 15 required to be zero (a
    rebooted node, not yet marked), and proves the EK the evidence names by credential activation on the node at every
    AK trust level. Then checks, in the controller's node enrolment O(enrolment_file), that this EK is enrolled as the
    control plane O(node_name), that its bound disk is known (enrolled, or else bound at its join as
    O(bindings_mirrors) agree), and that O(disk_uuid) (what the node reports) is that disk.
  - Only then seals to the ephemeral key of the evidence (HPKE, flow V(recover), bound to the nonce and O(verifier_id))
    the key of the bound disk and the measurement secret and salt - no more. The master secret never travels; a
    control plane keeps the root secrets for its join service from its join.
  - A refused node gets nothing; the result names the reason (C(refused)) and, for failing measurements, the PCRs.
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
  - confidential.kubernetes._root_secrets
  - confidential.kubernetes._attributes.action
  - confidential.kubernetes._attestation
  - confidential.kubernetes._attestation.hand_over_nonce_ledger
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  idempotent:
    support: none
    details:
      - Every run seals a new hand-over to new evidence; C(recover.yml) calls it only for a node that waits for keys.
options:
  policy:
    description: The measurement policy file on the controller (its PCR 15 rule is replaced by "zero").
    type: path
    required: true
  enrolment_file:
    description: The controller's node enrolment (the joinservice role's C(enrol) entry point writes it).
    type: path
    required: true
  node_name:
    description: The control plane's name, as enrolled.
    type: str
    required: true
  disk_uuid:
    description: The LUKS UUID of the state disk the node reports (M(confidential.kubernetes.recover_ticket)).
    type: str
    required: true
  bindings_mirrors:
    description:
      - The disk-binding mirrors (C(/etc/confidential-kubernetes/disk-bindings.json)) of the B(other) control planes,
        host name to file content. For a control plane enrolled before its first join (so without a disk in
        O(enrolment_file)), the disk its join bound, as these agree on under its current enrolment, is its bound disk.
    type: dict
    default: {}
  verifier_id:
    description: This verifier's identity, bound into the HPKE context.
    type: str
    default: confidential.kubernetes/controller
seealso:
  - module: confidential.kubernetes.recover_ticket
  - module: confidential.kubernetes.seal_init_secrets
"""

EXAMPLES = r"""
- name: Attest the control plane and seal the key of its own state disk to it
  confidential.kubernetes.recover_secrets:
    evidence: "{{ evidence.evidence }}"
    nonce: "{{ nonce.nonce }}"
    policy: measurement-policy.yml
    ek_ca_file: ek-ca.pem
    secrets_file: secrets/cluster-secrets.json
    enrolment_file: secrets/node-enrolment.json
    node_name: cp-0
    disk_uuid: "{{ standing.disk_uuid }}"
  register: sealed
"""

RETURN = r"""
sealed:
  description: The HPKE envelope (base64) only the attested node can open.
  returned: success
  type: str
cluster_id:
  description: The cluster ID (hex).
  returned: success
  type: str
disk_uuid:
  description: The enrolled state disk whose key was sealed.
  returned: success
  type: str
refused:
  description: Why the node got nothing (evidence, not-enrolled, not-a-control-plane, name-not-granted, disk-not-bound).
  returned: failure
  type: str
mismatches:
  description: The PCRs that failed the policy (pcr, expected, actual), when the evidence failed on measurements.
  returned: failure
  type: list
  elements: dict
attestation:
  description: The verification result (as M(confidential.kubernetes.verify_evidence) returns it).
  returned: success
  type: dict
"""
