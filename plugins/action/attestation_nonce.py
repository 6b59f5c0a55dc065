# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Runs on the controller: draws a single-use, expiring verifier nonce."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import controller
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.nonces import NonceLimitError

ARGUMENT_SPEC = dict(
    nonce_ledger=dict(type="path", default=controller.DEFAULT_NONCE_LEDGER),
    nonce_ttl=dict(type="float", default=60.0),
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        validation, dummy = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        params = validation.validated_parameters
        try:
            nonce = controller.nonce_store(params["nonce_ledger"], params["nonce_ttl"]).issue()
        except OSError as exc:
            result.update(failed=True, msg=f"cannot write the nonce ledger: {exc}")
            return result
        except NonceLimitError as exc:
            result.update(failed=True, msg=f"nonce ledger {params['nonce_ledger']} is full: {exc}")
            return result
        result.update(changed=False, nonce=nonce.hex(), expires_in=params["nonce_ttl"])
        return result
