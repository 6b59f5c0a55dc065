#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: seal_init_secrets
short_description: Attest the first node and seal the cluster's init secrets to it (runs on the controller)
version_added: 0.1.0
description:
  - The controller side of the init hand-over.
  - Loads the cluster's root secrets from O(secrets_file) - a 32-byte master key, a 32-byte master salt and a 32-byte
    measurement salt - or generates them on the first run (mode 0600, created exclusively, never overwritten). An
    ansible-vault encrypted file is decrypted with the play's vault secrets. Losing this file loses the ability to
    recover the cluster.
  - Verifies the node's evidence exactly like M(confidential.kubernetes.verify_evidence), with PCR 15 required to be
    zero (a fresh node) or the mark of this very cluster (a re-run). Only then seals the secrets to the ephemeral key
    of the evidence with HPKE (flow V(init), bound to the nonce and O(verifier_id)).
  - The secrets never enter Ansible variables; only the sealed envelope and the (public) cluster ID are returned.
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
  - confidential.kubernetes._attributes.action
  - confidential.kubernetes._attestation
  - confidential.kubernetes._attestation.hand_over_nonce_ledger
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  idempotent:
    support: full
    details:
      - Reports a change only when it generated the secrets file.
options:
  policy:
    description: The measurement policy file on the controller.
    type: path
    required: true
  secrets_file:
    description: The cluster secrets file on the controller (0600; ansible-vault encrypted files are read too).
    type: path
    required: true
  verifier_id:
    description: This verifier's identity, bound into the HPKE context.
    type: str
    default: confidential.kubernetes/controller
  cluster_config:
    description: Non-secret cluster configuration to send along with the secrets.
    type: dict
    default: {}
seealso:
  - module: confidential.kubernetes.init_ticket
  - module: confidential.kubernetes.verify_evidence
"""

EXAMPLES = r"""
- name: Attest the first control plane and seal the init secrets to it
  confidential.kubernetes.seal_init_secrets:
    evidence: "{{ init_evidence.evidence }}"
    nonce: "{{ init_nonce.nonce }}"
    policy: measurement-policy.yml
    ek_ca_file: ek-ca.pem
    secrets_file: "{{ playbook_dir }}/secrets/cluster-secrets.json"
  register: init_sealed
"""

RETURN = r"""
sealed:
  description: The HPKE envelope (base64) only the attested node can open.
  returned: success
  type: str
cluster_id:
  description: The cluster ID (hex), derived from the measurement secret and salt.
  returned: success
  type: str
secrets_created:
  description: Whether this run generated the secrets file.
  returned: success
  type: bool
attestation:
  description: The verification result (as M(confidential.kubernetes.verify_evidence) returns it).
  returned: success
  type: dict
"""
