# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Runs on the controller: backs up every CRD and custom resource, and the charts and values of an upgrade."""

from __future__ import annotations

import importlib.util
import json

from ansible.plugins.action import ActionBase

from ansible_collections.confidential.kubernetes.plugins.module_utils._helm import ROLE_RELEASE_OPTIONS
from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.backup import (
    BackupError,
    backup_crds,
    make_upgrade_dir,
    save_release_inputs,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.values import ValuesError, requested_values

# The client is imported when a backup is taken: loading it costs every run that skips the backup (a re-run) ~0.2 s.
HAS_KUBERNETES = importlib.util.find_spec("kubernetes") is not None

ARGUMENT_SPEC = dict(
    kubeconfig=dict(type="path", required=True),
    context=dict(type="str"),
    backup_dir=dict(type="path", required=True),
    releases=dict(type="list", elements="dict", default=[], options=ROLE_RELEASE_OPTIONS),
)


def kubernetes_get(kubeconfig: str, context: str | None):
    """An ApiGet over the official client: the raw JSON the API serves for a path."""
    from kubernetes import config as kube_config  # pylint: disable=import-outside-toplevel

    api_client = kube_config.new_client_from_config(config_file=kubeconfig, context=context)

    def api_get(path: str) -> dict:
        response = api_client.call_api(
            path,
            "GET",
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
            response_type=None,
            _preload_content=False,
            _return_http_data_only=True,
            _request_timeout=60,
        )
        return json.loads(response.data)

    return api_client, api_get


def take_backup(kubeconfig: str, context: str | None, backup_dir: str, releases: list[dict]) -> dict:
    """A new backup directory with every CRD and custom resource and the releases' inputs; raises BackupError (with
    what failed) so the caller changes nothing. Shared by crd_backup and helm_release (before an uninstall)."""
    try:
        api_client, api_get = kubernetes_get(kubeconfig, context)
    except Exception as exc:  # the kubernetes client's configuration errors have no common base class
        raise BackupError(f"cannot load {kubeconfig}: {exc}") from None
    try:
        upgrade_dir = make_upgrade_dir(backup_dir)
        counts = backup_crds(api_get, upgrade_dir)
        saved = save_release_inputs(upgrade_dir, releases)
    except OSError as exc:
        raise BackupError(str(exc)) from None
    finally:
        api_client.close()
    return dict(
        backup_path=upgrade_dir,
        crds=counts["crds"],
        custom_resources=counts["custom_resources"],
        files=len(counts["files"]) + len(saved),
    )


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        validation, dummy = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        params = validation.validated_parameters
        if not HAS_KUBERNETES:
            result.update(
                failed=True, msg="the kubernetes Python library is needed on the controller (requirements.txt)"
            )
            return result
        if self._task.check_mode:
            result.update(changed=True, backup_path=None, msg="check mode: no backup written")
            return result
        try:
            releases = [
                dict(r, merged_values=requested_values(r["values_files"], r["release_values"]))
                for r in params["releases"]
            ]
        except ValuesError as exc:
            result.update(failed=True, msg=f"backup failed, nothing was upgraded: {exc}")
            return result
        try:
            backup = take_backup(params["kubeconfig"], params["context"], params["backup_dir"], releases)
        except BackupError as exc:
            result.update(failed=True, msg=f"backup failed, nothing was upgraded: {exc}")
            return result
        result.update(changed=True, **backup)
        return result
