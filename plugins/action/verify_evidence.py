# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Runs on the controller: verifies a host's evidence, and proves its AK by credential activation on that host."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import controller
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import PolicyError
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.verifier import VerificationError
from ansible_collections.confidential.kubernetes.plugins.plugin_utils._attest import (
    ATTESTATION_OPTIONS,
    attest,
    evidence_argument_refusal,
)

ARGUMENT_SPEC = dict(
    ATTESTATION_OPTIONS,
    policy=dict(type="path"),
    policy_content=dict(type="raw"),
    node_lock=dict(type="str"),
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        refusal = evidence_argument_refusal(self._task.args)
        if refusal:
            result.update(refusal)
            return result
        validation, dummy = self.validate_argument_spec(
            argument_spec=ARGUMENT_SPEC,
            required_one_of=[("policy", "policy_content")],
            mutually_exclusive=[("policy", "policy_content")],
        )
        params = validation.validated_parameters
        result["changed"] = False
        try:
            policy = controller.resolve_policy(params["policy"], params["policy_content"], params["node_lock"])
            result.update(attest(self, params, policy, task_vars, any_variant=True).to_result())
        except PolicyError as exc:
            result.update(failed=True, verified=False, reason="policy", msg=str(exc))
        except VerificationError as exc:
            result.update(failed=True, **exc.to_result())
        return result
