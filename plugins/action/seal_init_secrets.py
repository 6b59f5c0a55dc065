# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Runs on the controller: attest the first node, then seal the cluster's init secrets to its ephemeral key."""

from __future__ import annotations

import base64
import json
import os

from ansible.plugins.action import ActionBase

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import controller
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import (
    NODE_LOCK_PCR,
    PolicyError,
    node_lock_mark,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.verifier import VerificationError
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto import seal
from ansible_collections.confidential.kubernetes.plugins.plugin_utils._attest import (
    HAND_OVER_OPTIONS,
    attest,
    evidence_argument_refusal,
)
from ansible_collections.confidential.kubernetes.plugins.plugin_utils._secrets import (
    ClusterSecretsError,
    load,
    load_or_create,
)

ARGUMENT_SPEC = dict(
    HAND_OVER_OPTIONS,
    policy=dict(type="path", required=True),
    secrets_file=dict(type="path", required=True),
    verifier_id=dict(type="str", default="confidential.kubernetes/controller"),
    cluster_config=dict(type="dict", default={}),
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
        validation, dummy = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        params = validation.validated_parameters
        result["changed"] = False
        try:
            existing = (
                load(params["secrets_file"], self._loader)
                if os.path.exists(os.path.expanduser(params["secrets_file"]))
                else None
            )
            policy = controller.resolve_policy(params["policy"], None, None)
            # A first node is fresh (PCR 15 zero), or already locked for this very cluster on a re-run.
            allowed = [bytes(32)] + ([node_lock_mark(existing.cluster_id())] if existing else [])
            verified = attest(self, params, policy.with_rule(NODE_LOCK_PCR, allowed), task_vars)
            # Only an attested node makes the controller generate the cluster's secrets.
            secrets, created = (existing, False) if existing else load_or_create(params["secrets_file"], self._loader)
            cluster_id = secrets.cluster_id()
            payload = dict(secrets.to_document(), cluster_config=params["cluster_config"])
            sealed = seal.seal(
                json.dumps(payload).encode(),
                verified.evidence.user_data,
                "init",
                bytes.fromhex(params["nonce"]),
                params["verifier_id"],
            )
        except (ClusterSecretsError, PolicyError, seal.SealError) as exc:
            result.update(failed=True, msg=str(exc))
            return result
        except VerificationError as exc:
            result.update(failed=True, **exc.to_result())
            result["msg"] = f"attestation of {task_vars.get('inventory_hostname')} failed, no secret was sealed: {exc}"
            return result
        result.update(
            changed=created,
            secrets_created=created,
            cluster_id=cluster_id.hex(),
            sealed=base64.b64encode(sealed).decode(),
            verifier_id=params["verifier_id"],
            attestation=verified.to_result(),
        )
        return result
