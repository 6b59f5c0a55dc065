# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Runs on the controller: the cluster ID from the root secrets file, then init_state on the node against it; keeps the
admin kubeconfig of an initialised node on the controller, fetched only when the controller's copy differs."""

from __future__ import annotations

import base64
import os

from ansible.plugins.action import ActionBase

from ansible_collections.confidential.kubernetes.plugins.module_utils._files import file_sha256, write_private_file
from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import ADMIN_CONF
from ansible_collections.confidential.kubernetes.plugins.plugin_utils._secrets import ClusterSecretsError, load

ARGUMENT_SPEC = dict(
    secrets_file=dict(type="path", required=True),
    admin_kubeconfig=dict(type="path"),
    node_secrets_file=dict(type="path", default="/etc/confidential-kubernetes/cluster-secrets.json"),
    lock_record=dict(type="path", default="/var/lib/confidential-kubernetes/nodelock.json"),
    tcti=dict(type="str", default="auto"),
)


def _stored_digest(path: str) -> str | None:
    """The SHA-256 of the controller's copy; None when there is none or others may read it (it is written again, 0600)."""
    try:
        if os.stat(path).st_mode & 0o077:
            return None
        return file_sha256(path)
    except FileNotFoundError:
        return None


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        validation, dummy = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        params = validation.validated_parameters
        secrets_file = os.path.expanduser(params["secrets_file"])
        try:
            cluster_id = load(secrets_file, self._loader).cluster_id().hex() if os.path.exists(secrets_file) else None
        except ClusterSecretsError as exc:
            result.update(failed=True, msg=str(exc))
            return result
        module_args = dict(params, cluster_id=cluster_id)
        state = self._execute_module(
            module_name="confidential.kubernetes.init_state", module_args=module_args, task_vars=task_vars
        )
        result.update(state)
        if state.get("failed"):
            return result
        stored = False
        if state["initialised"] and params["admin_kubeconfig"]:
            path = os.path.expanduser(params["admin_kubeconfig"])
            if _stored_digest(path) != state["admin_kubeconfig_sha256"]:
                stored = True
                if not self._task.check_mode:
                    failure = self._store(path, task_vars)
                    if failure:
                        result.update(failed=True, msg=failure)
                        return result
        result.update(changed=stored, admin_kubeconfig_stored=stored)
        return result

    def _store(self, path: str, task_vars) -> str | None:
        """Fetch the node's admin kubeconfig and write it 0600; returns why it failed, or None."""
        fetched = self._execute_module(
            module_name="ansible.builtin.slurp", module_args={"src": ADMIN_CONF}, task_vars=task_vars
        )
        if fetched.get("failed"):
            return f"cannot read {ADMIN_CONF} on the node: {fetched.get('msg')}"
        write_private_file(path, base64.b64decode(fetched["content"]))
        return None
