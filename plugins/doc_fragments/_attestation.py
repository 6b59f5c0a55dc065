# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # The options of every attesting action (plugin_utils._attest.ATTESTATION_OPTIONS): verify_evidence,
    # seal_init_secrets and recover_secrets. Their nonce_ledger is documented by one of the two sections below.
    DOCUMENTATION = r"""
options:
  evidence:
    description: The node's evidence document, as returned by M(confidential.kubernetes.tpm_evidence) (a dict or a JSON string).
    type: raw
    required: true
  nonce:
    description: The 32-byte nonce (64 hex characters) the evidence must be bound to.
    type: str
    required: true
  ek_ca_file:
    description: PEM file on the controller with the CA certificates that issue EK certificates. Needed at AK trust level 2.
    type: path
  nonce_ttl:
    description: Lifetime of a nonce in seconds, checked when the nonce is consumed from O(nonce_ledger).
    type: float
    default: 60
  activate_credential:
    description:
      - Run the credential activation round trip with the host, which proves that the AK (and the EK) sit in its TPM.
      - Without it, evidence at AK trust level 2, and every hand-over that must prove the node's EK, fail
        (V(activation-required)).
    type: bool
    default: true
  tcti:
    description: The host's TCTI, for the credential activation round trip.
    type: str
    default: auto
"""

    # verify_evidence: the ledger is optional.
    OPTIONAL_NONCE_LEDGER = r"""
options:
  nonce_ledger:
    description:
      - The controller's nonce ledger (0600 file). When given, the nonce must have been drawn from it by
        M(confidential.kubernetes.attestation_nonce) and is consumed, so a stale (V(nonce-stale)) or replayed
        (V(nonce-reused)) nonce fails. When omitted, no ledger is consulted.
    type: path
"""

    # seal_init_secrets and recover_secrets hand out secrets: their nonce is always consumed, by default from the ledger
    # attestation_nonce draws from by default (module_utils._attestation.controller.DEFAULT_NONCE_LEDGER).
    HAND_OVER_NONCE_LEDGER = r"""
options:
  nonce_ledger:
    description:
      - The controller's nonce ledger (0600 file) the nonce is consumed from, once. The nonce must have been drawn from
        it by M(confidential.kubernetes.attestation_nonce), whose default ledger is the default here, so a stale
        (V(nonce-stale)) or replayed (V(nonce-reused)) nonce fails.
    type: path
    default: ~/.cache/confidential-kubernetes/nonce-ledger
"""
