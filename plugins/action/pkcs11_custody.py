# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Runs on the controller: wrap the plain root secrets file by a PKCS#11 token's key, or (confirmed) the reverse."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.confidential.kubernetes.plugins.plugin_utils._pkcs11 import Custody
from ansible_collections.confidential.kubernetes.plugins.plugin_utils._secrets import (
    ClusterSecretsError,
    unwrap_to_plain,
    wrap_in_token,
)

ARGUMENT_SPEC = dict(
    state=dict(type="str", default="wrapped", choices=["wrapped", "plain"]),
    secrets_file=dict(type="path", required=True),
    module=dict(type="path"),
    token_label=dict(type="str"),
    key_label=dict(type="str", default="confidential-kubernetes-root"),
    pin_env=dict(type="str", no_log=False),
    pin_file=dict(type="path", no_log=False),
    confirm=dict(type="str", default=""),
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        validation, dummy = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        params = validation.validated_parameters
        result["changed"] = False
        if self._task.check_mode:
            result.update(changed=True)
            return result
        try:
            if params["state"] == "wrapped":
                if not (params["module"] and params["token_label"] and (params["pin_env"] or params["pin_file"])):
                    raise ClusterSecretsError("state=wrapped needs module, token_label and pin_env or pin_file")
                custody = Custody(
                    params["module"], params["token_label"], params["key_label"], params["pin_env"], params["pin_file"]
                )
                cluster_id = wrap_in_token(params["secrets_file"], custody, self._loader)
            else:
                cluster_id = unwrap_to_plain(params["secrets_file"], params["confirm"], self._loader)
        except ClusterSecretsError as exc:
            result.update(failed=True, msg=str(exc))
            return result
        except OSError as exc:
            result.update(failed=True, msg=f"{exc.filename}: {exc.strerror}")
            return result
        result.update(changed=True, cluster_id=cluster_id, state=params["state"])
        return result
