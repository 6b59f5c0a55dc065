# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Runs on the controller: store a fetched encrypted etcd snapshot with its manifest, or choose and check one."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.confidential.kubernetes.plugins.module_utils._backup.snapshot import SnapshotError
from ansible_collections.confidential.kubernetes.plugins.plugin_utils._etcd_backups import (
    BackupError,
    choose,
    store,
    verify,
)
from ansible_collections.confidential.kubernetes.plugins.plugin_utils._secrets import ClusterSecretsError, load

ARGUMENT_SPEC = dict(
    state=dict(type="str", default="verified", choices=["stored", "verified"]),
    backup_dir=dict(type="path", required=True),
    snapshot=dict(type="str", default="latest"),
    manifest=dict(type="dict"),
    keep=dict(type="int", default=7),
    secrets_file=dict(type="path"),
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        validation, dummy = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        params = validation.validated_parameters
        try:
            if params["state"] == "stored":
                if params["manifest"] is None:
                    raise BackupError("state=stored needs the manifest the node reported")
                if self._task.check_mode:
                    result.update(changed=True)
                    return result
                result.update(store(params["backup_dir"], params["snapshot"], params["manifest"], params["keep"]))
                result.update(changed=True)
                return result
            if not params["secrets_file"]:
                raise BackupError("state=verified needs secrets_file, the cluster's root secrets on the controller")
            secrets = load(params["secrets_file"], self._loader)
            result.update(changed=False, snapshot=verify(choose(params["backup_dir"], params["snapshot"]), secrets))
        except (BackupError, ClusterSecretsError) as exc:
            result.update(failed=True, msg=str(exc))
        except SnapshotError as exc:
            result.update(failed=True, msg=f"snapshot refused: {exc}", refused=type(exc).__name__)
        except OSError as exc:
            result.update(failed=True, msg=f"{exc.filename}: {exc.strerror}")
        return result
