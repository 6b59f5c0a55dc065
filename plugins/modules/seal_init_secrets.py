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
  evidence:
    description: The node's evidence from M(confidential.kubernetes.tpm_evidence).
    type: raw
    required: true
  nonce:
    description: The nonce (64 hex characters) the evidence is bound to.
    type: str
    required: true
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
  ek_ca_file:
    description: PEM file with the CA certificates that issue EK certificates (AK trust level 2).
    type: path
  nonce_ledger:
    description:
      - The controller's nonce ledger the nonce is consumed from (once; a replay is refused as C(nonce-reused)).
      - The default is the ledger M(confidential.kubernetes.attestation_nonce) draws from by default.
    type: path
    default: ~/.cache/confidential-kubernetes/nonce-ledger
  nonce_ttl:
    description: Lifetime of a nonce in seconds.
    type: float
    default: 60
  activate_credential:
    description: At AK trust level 2, run the credential activation round trip with the node.
    type: bool
    default: true
  tcti:
    description: The node's TCTI, for the credential activation round trip.
    type: str
    default: auto
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
