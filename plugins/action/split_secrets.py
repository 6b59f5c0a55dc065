# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Runs on the controller: split the root secrets into k-of-n share files, or remove the plain file once split."""

from __future__ import annotations

import os

from ansible.plugins.action import ActionBase

from ansible_collections.confidential.kubernetes.plugins.module_utils._files import (
    create_file_exclusively,
    read_bounded,
    write_private_file,
)
from ansible_collections.confidential.kubernetes.plugins.plugin_utils import _shares
from ansible_collections.confidential.kubernetes.plugins.plugin_utils._secrets import (
    ClusterSecretsError,
    load,
    load_shares,
    split_marker,
)

ARGUMENT_SPEC = dict(
    state=dict(type="str", default="split", choices=["split", "plain_removed"]),
    secrets_file=dict(type="path", required=True),
    # A re-split: the secrets reconstructed in memory from k shares of the current split, no plain file needed.
    split_from_share_files=dict(type="list", elements="path", default=[]),
    split_from_shares=dict(type="list", elements="str", default=[], no_log=True),
    share_dir=dict(type="path"),
    threshold=dict(type="int", default=3),
    count=dict(type="int", default=5),
    share_files=dict(type="list", elements="path", default=[]),
    confirm=dict(type="str", default=""),
)


def share_path(share_dir: str, index: int, count: int) -> str:
    return os.path.join(os.path.expanduser(share_dir), f"share-{index}-of-{count}.txt")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        validation, dummy = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        params = validation.validated_parameters
        try:
            if params["state"] == "split":
                result.update(self._split(params))
            else:
                result.update(self._remove_plain(params))
        except (ClusterSecretsError, _shares.ShareError) as exc:
            result.update(failed=True, changed=False, msg=str(exc))
        except OSError as exc:
            result.update(failed=True, changed=False, msg=f"{exc.filename}: {exc.strerror}")
        return result

    def _split(self, params: dict) -> dict:
        if not params["share_dir"]:
            raise ClusterSecretsError("state=split needs share_dir, where the n share files are written")
        if params["split_from_share_files"] or params["split_from_shares"]:
            secrets = load_shares(params["split_from_share_files"], params["split_from_shares"])
        else:
            secrets = load(params["secrets_file"], self._loader)
        shares = _shares.split(secrets, params["threshold"], params["count"])
        paths = [share_path(params["share_dir"], share.index, share.count) for share in shares]
        existing = [path for path in paths if os.path.lexists(path)]
        if existing:
            raise ClusterSecretsError(
                f"{existing[0]} exists: a split is never written over another; move the old shares away first"
            )
        cluster_id = secrets.cluster_id().hex()
        if not self._task.check_mode:
            for share, path in zip(shares, paths):
                create_file_exclusively(path, share.file_text().encode(), 0o600)
            # Read back what is on disk: only shares that reconstruct these very secrets count as written.
            if load_shares(paths, [], cluster_id) != secrets:
                raise ClusterSecretsError(f"the shares written to {params['share_dir']} do not reconstruct the secrets")
        return dict(changed=True, cluster_id=cluster_id, share_files=paths, threshold=shares[0].threshold)

    def _remove_plain(self, params: dict) -> dict:
        secrets = load(params["secrets_file"], self._loader)
        cluster_id = secrets.cluster_id().hex()
        if params["confirm"] != cluster_id:
            raise ClusterSecretsError(
                f"refusing to remove {params['secrets_file']}: confirm with the cluster ID {cluster_id}"
            )
        if not params["share_files"]:
            raise ClusterSecretsError("state=plain_removed needs the share files that replace the secrets file")
        if load_shares(params["share_files"], [], cluster_id) != secrets:
            raise ClusterSecretsError("the share files do not reconstruct the secrets file's secrets: nothing removed")
        first = _shares.Share.parse(read_bounded(os.path.expanduser(params["share_files"][0]), 65536).decode(), "share")
        if not self._task.check_mode:
            write_private_file(
                os.path.expanduser(params["secrets_file"]), split_marker(cluster_id, first.threshold, first.count)
            )
        return dict(changed=True, cluster_id=cluster_id, removed=params["secrets_file"])
