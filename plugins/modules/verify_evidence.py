#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: verify_evidence
short_description: Verify a node's TPM evidence against a measurement policy (runs on the controller)
version_added: 0.1.0
description:
  - Runs on the controller in pure Python; no TSS library is needed there.
  - Checks, in this order, each with its own reason code - document shape and size (V(malformed)); signature scheme
    against the AK type (V(signature-scheme)); AK attributes restricted, sign, fixedTPM (V(ak-attributes)); the quote
    signature (V(signature)); TPMS_ATTEST magic (V(magic)) and type (V(attest-type)); C(extraData) against
    C(SHA-256(nonce || SHA-256(user_data))) in constant time (V(nonce)); the quote's PCR selection covers every policy
    PCR (V(pcr-selection)); the recomputed PCR digest (V(pcr-digest)); the TCG event log the evidence carries (a
    malformed one is V(malformed)) replayed per PCR and bank against the quoted PCRs (V(event-log-mismatch)); each PCR
    against the policy (V(pcr-policy), with every mismatch listed); then AK trust (V(ek-certificate),
    V(credential-activation)).
  - When the policy enrols a golden event log and the evidence carries a log, each PCR that fails the policy names the
    events that differ from the golden log (type, description, old and new digest; changed, added or removed).
  - At AK trust level 2 (policy C(ak_trust=ek-certificate), the default) the EK certificate must be issued by a CA in
    O(ek_ca_file), and the AK is proven to sit in the same TPM by credential activation - this action makes a credential
    for the AK name under the EK and has the host activate it with M(confidential.kubernetes.tpm_evidence).
  - With O(nonce_ledger) the nonce must have been drawn by M(confidential.kubernetes.attestation_nonce) and is consumed,
    so a stale (V(nonce-stale)) or replayed (V(nonce-reused)) nonce fails.
  - The task fails when the evidence is not verified; the failure result still carries every mismatch and warning.
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
  - confidential.kubernetes._attributes.action
  - confidential.kubernetes._attributes.INFO_MODULE
  - confidential.kubernetes._attestation
  - confidential.kubernetes._attestation.optional_nonce_ledger
attributes:
  idempotent:
    support: full
options:
  policy:
    description: Path (on the controller) of the measurement policy, JSON or YAML, this collection's format or Constellation's.
    type: path
  policy_content:
    description: The measurement policy itself, as a dict or a JSON/YAML string. Mutually exclusive with O(policy).
    type: raw
  node_lock:
    description:
      - Expectation for PCR 15, the node lock. V(unlocked) requires 32 zero bytes (a fresh node); a 64-hex cluster ID
        requires C(SHA-256(0^32 || SHA-256(cluster_id))). Overrides a PCR 15 rule of the policy.
    type: str
seealso:
  - module: confidential.kubernetes.tpm_evidence
  - module: confidential.kubernetes.attestation_nonce
  - module: confidential.kubernetes.measurements
"""

EXAMPLES = r"""
- name: Draw a nonce on the controller
  confidential.kubernetes.attestation_nonce:
    nonce_ledger: "{{ playbook_dir }}/.state/nonce-ledger"
  register: attestation_nonce

- name: Produce evidence on the node
  confidential.kubernetes.tpm_evidence:
    nonce: "{{ attestation_nonce.nonce }}"
  register: node_evidence

- name: Verify it on the controller, requiring a fresh (unlocked) node
  confidential.kubernetes.verify_evidence:
    evidence: "{{ node_evidence.evidence }}"
    nonce: "{{ attestation_nonce.nonce }}"
    nonce_ledger: "{{ playbook_dir }}/.state/nonce-ledger"
    policy: measurement-policy.yml
    ek_ca_file: ek-ca.pem
    node_lock: unlocked
"""

RETURN = r"""
verified:
  description: Whether the evidence passed every check.
  returned: always
  type: bool
reason:
  description: V(ok), or the code of the first failed check (see the description).
  returned: always
  type: str
  sample: pcr-policy
msg:
  description: What failed, in words, naming every mismatching PCR.
  returned: when the evidence is not verified
  type: str
  sample: PCR(s) 8 do not match the measurement policy
mismatches:
  description:
    - Every PCR that does not match an enforced policy rule (pcr, actual, allowed, warn_only), with C(events), the
      events that differ from the policy's golden event log (pcr, change, type, description, old_digest, new_digest,
      summary), when both logs are there.
    - For V(event-log-mismatch), every PCR whose replay differs (pcr, bank, quoted, replayed).
  returned: always
  type: list
  elements: dict
  sample:
    - pcr: 8
      actual: 5f3a4a1c0f0d2e6b9a7c8d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c
      allowed: [b77314521b36e4cbd9edb307f7a418aaf67490d1e20649f8f3d8cdd633cc359e]
      warn_only: false
      events:
        - pcr: 8
          change: changed
          type: EV_IPL
          description: "kernel_cmdline: ro quiet -> kernel_cmdline: ro quiet lab.tamper=1"
          old_digest: 61b6b2ed0a6b5e6a5e7b6cfb1bc5b4f8a9f1c5ba4b7c3b2d2e6b3cf4e1f2a3b4
          new_digest: 0c2b8d37c48fc07e8e2d2a1b4b6f16b5d7c9b3a1e4d5f6a7b8c9d0e1f2a3b4c5
          summary: "PCR 8: EV_IPL kernel_cmdline: ro quiet -> kernel_cmdline: ro quiet lab.tamper=1 digest changed"
warnings:
  description: PCRs that do not match a warn-only rule.
  returned: always
  type: list
  elements: dict
ak_name:
  description: The TPM name of the attestation key (hex).
  returned: when the signature checks passed
  type: str
ak_trust_level:
  description: 1 (PCRs only) or 2 (EK certificate and credential activation).
  returned: when the signature checks passed
  type: int
pcrs:
  description: The quoted PCR values of the policy bank (index -> hex).
  returned: when the PCR digest matched
  type: dict
"""
