# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Runs on the controller: store a fetched encrypted etcd snapshot with its manifest, or choose and check one."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.confidential.kubernetes.plugins.module_utils._backup.snapshot import SnapshotError
from ansible_collections.confidential.kubernetes.plugins.plugin_utils._etcd_backups import BackupError, select, store
from ansible_collections.confidential.kubernetes.plugins.plugin_utils._secrets import (
    SOURCE_OPTIONS,
    ClusterSecretsError,
    load_from,
)

ARGUMENT_SPEC = dict(
    state=dict(type="str", default="verified", choices=["stored", "verified"]),
    backup_dir=dict(type="path", required=True),
    snapshot=dict(type="str", default="latest"),
    manifest=dict(type="dict"),
    fetched=dict(type="path"),
    keep=dict(type="int", default=7),
    allow_older=dict(type="bool", default=False),
    **SOURCE_OPTIONS,
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        validation, dummy = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        params = validation.validated_parameters
        try:
            if not (params["secrets_file"] or params["share_files"] or params["shares"]):
                raise BackupError(
                    "secrets_file (or k share_files or shares) is needed: the cluster's root secrets on the controller"
                )
            if params["state"] == "stored":
                if params["manifest"] is None or not params["fetched"]:
                    raise BackupError("state=stored needs the manifest the node reported and the fetched file")
                if self._task.check_mode:
                    result.update(changed=True)
                    return result
                secrets = load_from(params, self._loader)
                stored = store(params["backup_dir"], params["fetched"], params["manifest"], params["keep"], secrets)
                result.update(stored, changed=True)
                return result
            secrets = load_from(params, self._loader)
            chosen = select(params["backup_dir"], params["snapshot"], secrets, params["allow_older"])
            result.update(changed=False, snapshot=chosen)
        except (BackupError, ClusterSecretsError) as exc:
            result.update(failed=True, msg=str(exc))
        except SnapshotError as exc:
            result.update(failed=True, msg=f"snapshot refused: {exc}", refused=type(exc).__name__)
        except OSError as exc:
            result.update(failed=True, msg=f"{exc.filename}: {exc.strerror}")
        return result
