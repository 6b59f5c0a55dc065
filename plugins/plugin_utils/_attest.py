# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of an attestation, shared by the actions that verify evidence before they hand out anything."""

from __future__ import annotations

import base64
import os

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import controller, tpm2
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.evidence import (
    MAX_DOCUMENT_BYTES,
    EvidenceError,
    check_containers,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import MeasurementPolicy
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.tpm_evidence import (
    ActivationChallenge,
    check_ek_template,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.tpm_variant import TPM
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.variants import (
    VerificationError,
    VerificationResult,
)

# Options every attesting action takes, in its argument spec (doc fragment confidential.kubernetes._attestation).
ATTESTATION_OPTIONS = dict(
    evidence=dict(type="raw", required=True),
    nonce=dict(type="str", required=True),
    ek_ca_file=dict(type="path"),
    nonce_ledger=dict(type="path"),
    nonce_ttl=dict(type="float", default=60.0),
    activate_credential=dict(type="bool", default=True),
    tcti=dict(type="str", default="auto"),
)
# The hand-overs (seal_init_secrets, recover_secrets) consume every nonce, from the ledger attestation_nonce draws from
# by default unless told otherwise (doc fragment confidential.kubernetes._attestation.hand_over_nonce_ledger).
HAND_OVER_OPTIONS = dict(ATTESTATION_OPTIONS, nonce_ledger=dict(type="path", default=controller.DEFAULT_NONCE_LEDGER))


def evidence_argument_refusal(args: dict) -> dict | None:
    """The task's evidence checked before Ansible's argument validation walks it (recursively: a document nested a few
    hundred deep raised RecursionError there, before any of our code ran): text of at most the document size limit,
    or an object of at most MAX_CONTAINERS dicts and lists. The refusal as a result, else None."""
    evidence = args.get("evidence")
    if isinstance(evidence, (str, bytes, bytearray)):
        if len(evidence) <= MAX_DOCUMENT_BYTES:
            return None
        problem = f"evidence is larger than {MAX_DOCUMENT_BYTES} bytes"
    else:
        try:
            check_containers(evidence, "evidence")
            return None
        except EvidenceError as exc:
            problem = str(exc)
    return {"failed": True, "changed": False, "verified": False, "reason": "malformed", "msg": problem}


def ek_challenge(verified: VerificationResult) -> ActivationChallenge:
    """A credential for the evidence's EK and AK, at any AK trust level: activating it proves that the EK the evidence
    names is the TPM's own (the EK is then an identity, as the join service's registry treats it)."""
    if verified.evidence.ek_public is None:
        raise VerificationError("ek-missing", "the evidence names no EK, so the node's identity cannot be checked")
    secret = os.urandom(32)
    try:
        ek = tpm2.parse_public(verified.evidence.ek_public)
        check_ek_template(ek)
        credential = tpm2.make_credential(ek, verified.ak_name, secret)
    except tpm2.StructureError as exc:
        raise VerificationError("malformed", f"cannot make a credential for the evidence's EK: {exc}") from None
    return ActivationChallenge(verified.ak_name, credential, secret)


def attest(
    action, params: dict, policy: MeasurementPolicy, task_vars: dict, prove_ek: bool = False, any_variant: bool = False
) -> VerificationResult:
    """Verify the evidence and, at AK trust level 2 (or with ``prove_ek`` at any level), prove the AK and EK by
    credential activation on the task's host. Evidence of another variant than the TPM's (SEV-SNP, TDX) is refused
    after it verified, unless ``any_variant``: the hand-overs need the TPM's node lock and EK.

    Raises VerificationError for every refusal.
    """
    if controller.CRYPTOGRAPHY_IMPORT_ERROR:
        raise VerificationError(
            "dependency", f"cryptography >= 47 is required on the controller: {controller.CRYPTOGRAPHY_IMPORT_ERROR}"
        )
    verified = controller.verify(
        params["evidence"],
        params["nonce"],
        policy,
        controller.load_ek_cas(params["ek_ca_file"]),
        params["nonce_ledger"],
        params["nonce_ttl"],
    )
    if verified.variant != TPM.name and not any_variant:
        raise VerificationError(
            "variant",
            f"the {verified.variant} evidence verified, but this hand-over takes TPM evidence only (it needs the node "
            "lock in PCR 15 and the EK): confidential VMs get no cluster secret yet (issue 40 item 5)",
        )
    challenge = verified.challenge or (ek_challenge(verified) if prove_ek else None)
    if challenge is None:
        return verified
    if not params["activate_credential"]:
        raise VerificationError(
            "activation-required",
            "AK trust level 2 needs credential activation on the node, which activate_credential=false skips",
        )
    credential = challenge.credential
    answer = action._execute_module(
        module_name="confidential.kubernetes.tpm_evidence",
        module_args={
            "tcti": params["tcti"],
            "credential": {
                "blob": base64.b64encode(credential.blob).decode(),
                "encrypted_seed": base64.b64encode(credential.encrypted_seed).decode(),
            },
        },
        task_vars=task_vars,
    )
    if answer.get("failed"):
        raise VerificationError(
            "credential-activation", f"the node could not activate the AK credential: {answer.get('msg')}"
        )
    try:
        activated = base64.b64decode(answer.get("activated_secret", ""), validate=True)
    except ValueError:
        activated = b""
    challenge.check(activated)
    return verified._replace(challenge=None)
