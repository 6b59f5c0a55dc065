# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Runs on the controller: verifies a host's evidence, and proves its AK by credential activation on that host."""

from __future__ import annotations

import base64

from ansible.plugins.action import ActionBase

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import controller
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import PolicyError
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.verifier import VerificationError

ARGUMENT_SPEC = dict(
    evidence=dict(type="raw", required=True),
    nonce=dict(type="str", required=True),
    policy=dict(type="path"),
    policy_content=dict(type="raw"),
    node_lock=dict(type="str"),
    ek_ca_file=dict(type="path"),
    nonce_ledger=dict(type="path"),
    nonce_ttl=dict(type="float", default=60.0),
    activate_credential=dict(type="bool", default=True),
    tcti=dict(type="str", default="auto"),
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        validation, args = self.validate_argument_spec(
            argument_spec=ARGUMENT_SPEC,
            required_one_of=[("policy", "policy_content")],
            mutually_exclusive=[("policy", "policy_content")],
        )
        params = validation.validated_parameters
        result["changed"] = False
        if controller.CRYPTOGRAPHY_IMPORT_ERROR:
            result.update(failed=True, msg=f"cryptography >= 47 is required on the controller: {controller.CRYPTOGRAPHY_IMPORT_ERROR}")
            return result
        try:
            policy = controller.resolve_policy(params["policy"], params["policy_content"], params["node_lock"])
            ek_cas = controller.load_ek_cas(params["ek_ca_file"])
            verified = controller.verify(params["evidence"], params["nonce"], policy, ek_cas,
                                         params["nonce_ledger"], params["nonce_ttl"])
        except PolicyError as exc:
            result.update(failed=True, verified=False, reason="policy", msg=str(exc))
            return result
        except VerificationError as exc:
            result.update(failed=True, **exc.to_result())
            return result
        result.update(verified.to_result())
        if verified.challenge is None:
            return result
        if not params["activate_credential"]:
            result.update(failed=True, verified=False, reason="activation-required",
                          msg="AK trust level 2 needs credential activation on the node, which activate_credential=false skips")
            return result
        credential = verified.challenge.credential
        answer = self._execute_module(
            module_name="confidential.kubernetes.tpm_evidence",
            module_args={"tcti": params["tcti"], "credential": {
                "blob": base64.b64encode(credential.blob).decode(),
                "encrypted_seed": base64.b64encode(credential.encrypted_seed).decode()}},
            task_vars=task_vars,
        )
        try:
            if answer.get("failed"):
                raise VerificationError("credential-activation", f"the node could not activate the AK credential: {answer.get('msg')}")
            verified.challenge.check(base64.b64decode(answer.get("activated_secret", "")))
        except VerificationError as exc:
            result.update(failed=True, **exc.to_result())
            return result
        result.update(verified=True, reason="ok")
        return result
