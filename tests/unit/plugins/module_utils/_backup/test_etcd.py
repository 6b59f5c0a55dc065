# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Snapshot, encrypt, refuse and restore against a real etcd 3.4 and etcdctl (skipped where they are not installed)."""

from __future__ import annotations

import os
import shutil

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._backup import etcd, snapshot
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import RootSecrets

pytestmark = pytest.mark.skipif(not (shutil.which("etcd") and shutil.which("etcdctl")), reason="needs etcd, etcdctl")

SECRETS = RootSecrets(bytes(range(32)), bytes(range(32, 64)), bytes(range(64, 96)))
OTHER_SECRETS = RootSecrets(bytes(32), bytes(32), bytes(32))


@pytest.fixture(scope="module")
def member(tmp_path_factory, etcd_members):
    running = etcd_members(str(tmp_path_factory.mktemp("etcd") / "data"))
    for number in range(50):
        running.ctl("put", f"/registry/configmaps/default/cm-{number:03d}", "x" * 100)
    return running


@pytest.fixture
def encrypted(member, tmp_path):
    dest = str(tmp_path / "snap.cksnap")
    manifest = etcd.take_snapshot(member.etcdctl(), SECRETS, str(tmp_path / "work"), dest)
    return dest, manifest


def _restore_member(tmp_path, name="cp-0", peer="http://127.0.0.1:2380") -> etcd.RestoreMember:
    return etcd.RestoreMember(name, peer, f"{name}={peer}", "restore-test", str(tmp_path / "restored"))


def test_snapshot_is_encrypted_and_the_plaintext_is_gone(encrypted, tmp_path):
    dest, manifest = encrypted
    assert manifest["cluster_id"] == SECRETS.cluster_id().hex()
    assert manifest["revision"] >= 51 and manifest["size"] == os.path.getsize(dest)
    assert manifest["snapshot_size"] > 50 * 100
    assert os.listdir(tmp_path / "work") == []
    assert (os.stat(tmp_path / "work").st_mode & 0o777) == 0o700
    with open(dest, "rb") as handle:
        assert b"cm-042" not in handle.read()


def test_restore_brings_back_every_key(encrypted, tmp_path, etcd_members, free_port):
    dest, manifest = encrypted
    peer_port = free_port()
    restore = _restore_member(tmp_path, peer=f"http://127.0.0.1:{peer_port}")
    result = etcd.restore_snapshot(
        etcd.Etcdctl(), SECRETS, dest, str(tmp_path / "work"), restore, expected_revision=manifest["revision"]
    )
    assert result["revision"] == manifest["revision"] and os.listdir(tmp_path / "work") == []
    restored = etcd_members(restore.data_dir, peer_port=peer_port)
    keys = restored.ctl("get", "/registry/configmaps/", "--prefix", "--keys-only").split()
    assert len(keys) == 50
    assert [m["name"] for m in restored.etcdctl().members()] == ["cp-0"]


@pytest.mark.parametrize(
    "damage, error",
    [
        (lambda data: data[:-1000], snapshot.TruncatedError),
        (lambda data: data[:200] + bytes([data[200] ^ 1]) + data[201:], snapshot.AuthenticationError),
    ],
)
def test_damaged_snapshot_restores_nothing(encrypted, tmp_path, damage, error):
    dest, dummy = encrypted
    with open(dest, "rb") as handle:
        data = handle.read()
    with open(dest, "wb") as handle:
        handle.write(damage(data))
    restore = _restore_member(tmp_path)
    with pytest.raises(error):
        etcd.restore_snapshot(etcd.Etcdctl(), SECRETS, dest, str(tmp_path / "work"), restore)
    assert not os.path.exists(restore.data_dir) and os.listdir(tmp_path / "work") == []


def test_another_clusters_snapshot_restores_nothing(encrypted, tmp_path):
    dest, dummy = encrypted
    restore = _restore_member(tmp_path)
    with pytest.raises(snapshot.WrongClusterError, match="not of this cluster"):
        etcd.restore_snapshot(etcd.Etcdctl(), OTHER_SECRETS, dest, str(tmp_path / "work"), restore)
    assert not os.path.exists(restore.data_dir)


def test_restore_refuses_an_existing_data_dir_and_a_member_outside_the_cluster(encrypted, tmp_path):
    dest, dummy = encrypted
    os.makedirs(tmp_path / "restored")
    with pytest.raises(etcd.EtcdError, match="exists; restore only into a fresh directory"):
        etcd.restore_snapshot(etcd.Etcdctl(), SECRETS, dest, str(tmp_path / "work"), _restore_member(tmp_path))
    stray = etcd.RestoreMember("cp-9", "http://10.0.0.9:2380", "cp-0=http://10.0.0.1:2380", "t", str(tmp_path / "x"))
    with pytest.raises(etcd.EtcdError, match="member cp-9=http://10.0.0.9:2380 is not in the initial cluster"):
        etcd.restore_snapshot(etcd.Etcdctl(), SECRETS, dest, str(tmp_path / "work"), stray)


def test_manifest_revision_mismatch_is_refused(encrypted, tmp_path):
    dest, manifest = encrypted
    restore = _restore_member(tmp_path)
    with pytest.raises(etcd.EtcdError, match=f"revision {manifest['revision']}, its manifest says 7"):
        etcd.restore_snapshot(etcd.Etcdctl(), SECRETS, dest, str(tmp_path / "work"), restore, expected_revision=7)
    assert not os.path.exists(restore.data_dir) and os.listdir(tmp_path / "work") == []


def test_unhealthy_member_is_named(tmp_path, free_port):
    dead = etcd.Etcdctl(endpoint=f"http://127.0.0.1:{free_port()}", timeout=1)
    with pytest.raises(etcd.EtcdError, match=r"etcd member http://127.0.0.1:\d+: health check failed: .*unhealthy"):
        dead.health()
    with pytest.raises(etcd.EtcdError, match="etcd snapshot from"):
        etcd.take_snapshot(dead, SECRETS, str(tmp_path / "work"), str(tmp_path / "snap"))
    assert os.listdir(tmp_path / "work") == [] and not os.path.exists(tmp_path / "snap")
