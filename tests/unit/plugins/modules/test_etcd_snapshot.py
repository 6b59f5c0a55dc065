# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""etcd_snapshot and etcd_restore end to end against a real etcd 3.4: what they return, and what they refuse."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import RootSecrets
from ansible_collections.confidential.kubernetes.plugins.modules import etcd_restore, etcd_snapshot

from module_runner import module_outcome, run_main  # noqa: F401 pylint: disable=unused-import

pytestmark = pytest.mark.skipif(not (shutil.which("etcd") and shutil.which("etcdctl")), reason="needs etcd, etcdctl")

SECRETS = RootSecrets(bytes(range(32)), bytes(range(32, 64)), bytes(range(64, 96)))


def _secrets_file(path, secrets: RootSecrets = SECRETS, mode: int = 0o600) -> str:
    path.write_text(json.dumps(secrets.to_document()))
    os.chmod(path, mode)
    return str(path)


@pytest.fixture(scope="module")
def member(tmp_path_factory, etcd_members):
    running = etcd_members(str(tmp_path_factory.mktemp("etcd") / "data"))
    running.ctl("put", "/registry/configmaps/default/kept", "value")
    return running


def _snapshot(member, tmp_path, **extra) -> dict:
    return run_main(
        etcd_snapshot.main,
        dict(
            endpoint=member.client,
            secrets_file=_secrets_file(tmp_path / "s.json"),
            work_dir=str(tmp_path / "work"),
            dest=str(tmp_path / "snap.cksnap"),
            **extra,
        ),
    )


def test_snapshot_check_mode_only_checks_health(member, tmp_path):
    result = _snapshot(member, tmp_path, _ansible_check_mode=True)
    assert result["changed"] and not result["failed"] and result["members"][0]["name"] == "cp-0"
    assert not (tmp_path / "snap.cksnap").exists()


def test_snapshot_then_restore(member, tmp_path, free_port):
    saved = _snapshot(member, tmp_path)
    assert not saved["failed"] and saved["cluster_id"] == SECRETS.cluster_id().hex()
    assert saved["size"] == os.path.getsize(tmp_path / "snap.cksnap") and saved["revision"] >= 2
    peer = f"http://127.0.0.1:{free_port()}"
    args = dict(
        src=str(tmp_path / "snap.cksnap"),
        secrets_file=str(tmp_path / "s.json"),
        work_dir=str(tmp_path / "w"),
        member_name="cp-0",
        peer_urls=peer,
        initial_cluster=f"cp-0={peer}",
        initial_cluster_token="t",
        data_dir=str(tmp_path / "restored"),
        expected_revision=saved["revision"],
    )
    checked = run_main(etcd_restore.main, dict(args, _ansible_check_mode=True))
    assert not checked["failed"] and not checked["changed"] and not (tmp_path / "restored").exists()
    restored = run_main(etcd_restore.main, args)
    assert restored["changed"] and restored["revision"] == saved["revision"]
    assert (tmp_path / "restored" / "member").is_dir()
    again = run_main(etcd_restore.main, args)
    assert again["failed"] and "exists; restore only into a fresh directory" in again["msg"]


def test_restore_names_another_clusters_snapshot(member, tmp_path):
    _snapshot(member, tmp_path)
    other = _secrets_file(tmp_path / "other.json", RootSecrets(bytes(32), bytes(32), bytes(32)))
    result = run_main(
        etcd_restore.main, dict(src=str(tmp_path / "snap.cksnap"), secrets_file=other, _ansible_check_mode=True)
    )
    assert result["failed"] and result["refused"] == "WrongClusterError" and "not of this cluster" in result["msg"]


def test_unhealthy_member_and_readable_secrets_are_refused(member, tmp_path, free_port):
    dead = run_main(etcd_snapshot.main, dict(endpoint=f"http://127.0.0.1:{free_port()}", state="healthy"))
    assert dead["failed"] and "health check failed" in dead["msg"]
    loose = _secrets_file(tmp_path / "loose.json", mode=0o644)
    result = run_main(
        etcd_snapshot.main,
        dict(endpoint=member.client, secrets_file=loose, work_dir=str(tmp_path / "work"), dest=str(tmp_path / "snap")),
    )
    assert result["failed"] and "loose.json" in result["msg"] and not (tmp_path / "snap").exists()
