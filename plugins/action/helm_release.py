# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Runs helm_release on the host; before an uninstall, asks the host whether the release exists (the module in check
mode) and, if it does, takes on the controller the backup an upgrade takes (crd_backup's), so a failed backup
uninstalls nothing and a missing release writes nothing."""

from __future__ import annotations

import os

from ansible.plugins.action import ActionBase
from ansible.utils.vars import merge_hash

from ansible_collections.confidential.kubernetes.plugins.action.crd_backup import HAS_KUBERNETES, take_backup
from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.backup import BackupError

MODULE = "confidential.kubernetes.helm_release"


def wants_uninstall(args: dict) -> bool:
    return (args.get("release_state") or args.get("state") or "present") == "absent"


class ActionModule(ActionBase):
    _supports_check_mode = True
    _supports_async = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        if wants_uninstall(args) and not self._task.check_mode:
            probe = self._probe(task_vars)
            if probe.get("failed") or not probe.get("changed"):
                return merge_hash(result, probe)
            if not HAS_KUBERNETES:
                result.update(
                    failed=True,
                    msg="the kubernetes Python library is needed on the controller for the "
                    "backup before an uninstall (requirements.txt); nothing was uninstalled",
                )
                return result
            try:
                backup = take_backup(
                    os.path.expanduser(args["backup_kubeconfig"]), None, os.path.expanduser(args["backup_dir"]), []
                )
            except BackupError as exc:
                result.update(
                    failed=True,
                    msg=f"backup failed, release {args.get('release_name', args.get('name'))} "
                    f"was not uninstalled: {exc}",
                )
                return result
            result["backup_path"] = backup["backup_path"]
        wrap_async = self._task.async_val and not self._connection.has_native_async
        result = merge_hash(
            result, self._execute_module(module_name=MODULE, task_vars=task_vars, wrap_async=wrap_async)
        )
        if not wrap_async:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        return result

    def _probe(self, task_vars) -> dict:
        """The module in check mode: changed when the release exists (and the arguments are valid)."""
        self._task.check_mode = True
        try:
            return self._execute_module(module_name=MODULE, task_vars=task_vars)
        finally:
            self._task.check_mode = False
