# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's snapshot directory: store and prune, choose latest or by name, and refuse before any restore."""

from __future__ import annotations

import io
import json
import os

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._backup import snapshot
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import RootSecrets
from ansible_collections.confidential.kubernetes.plugins.module_utils._files import file_sha256
from ansible_collections.confidential.kubernetes.plugins.plugin_utils import _etcd_backups as backups

SECRETS = RootSecrets(bytes(range(32)), bytes(range(32, 64)), bytes(range(64, 96)))
OTHER = RootSecrets(bytes(32), bytes(32), bytes(32))
PLAINTEXT = os.urandom(5000)


def _fetched(backup_dir, name: str, secrets: RootSecrets = SECRETS) -> dict:
    """A snapshot as backup.yml leaves it after the fetch, and the manifest the node reported."""
    directory = backup_dir / name
    directory.mkdir(parents=True)
    sink = io.BytesIO()
    snapshot.encrypt(
        snapshot.backup_key(secrets.master_key, secrets.master_salt),
        secrets.cluster_id(),
        io.BytesIO(PLAINTEXT),
        len(PLAINTEXT),
        sink,
        snapshot.MIN_CHUNK_SIZE,
    )
    (directory / backups.SNAPSHOT_FILE).write_bytes(sink.getvalue())
    path = str(directory / backups.SNAPSHOT_FILE)
    return dict(
        cluster_id=secrets.cluster_id().hex(),
        time="2026-11-26T09:00:00Z",
        revision=42,
        member="cp-0",
        size=os.path.getsize(path),
        sha256=file_sha256(path),
    )


def _stored(backup_dir, name, secrets=SECRETS, keep=7):
    return backups.store(str(backup_dir), name, _fetched(backup_dir, name, secrets), keep)


def test_store_writes_the_manifest_and_keeps_the_newest(tmp_path):
    names = [f"etcd-20261126T0{hour}0000Z" for hour in range(1, 6)]
    for name in names[:4]:
        _stored(tmp_path, name)
    result = _stored(tmp_path, names[4], keep=3)
    assert result["pruned"] == names[:2] and result["kept"] == names[2:]
    assert sorted(os.listdir(tmp_path)) == names[2:]
    manifest = json.loads((tmp_path / names[4] / "manifest.json").read_text())
    assert manifest["revision"] == 42 and manifest["name"] == names[4] and manifest["version"] == 1
    assert (os.stat(tmp_path / names[4] / "manifest.json").st_mode & 0o777) == 0o600


def test_store_refuses_a_fetched_file_that_is_not_what_the_node_wrote(tmp_path):
    manifest = _fetched(tmp_path, "etcd-20261126T090000Z")
    manifest["sha256"] = "0" * 64
    with pytest.raises(backups.BackupError, match="is not the one the node wrote"):
        backups.store(str(tmp_path), "etcd-20261126T090000Z", manifest, 3)
    assert not (tmp_path / "etcd-20261126T090000Z" / "manifest.json").exists()


def test_choose_latest_and_by_name(tmp_path):
    _stored(tmp_path, "etcd-20261126T080000Z")
    _stored(tmp_path, "etcd-20261126T090000Z")
    (tmp_path / "not-a-snapshot").mkdir()
    assert backups.choose(str(tmp_path), "latest").endswith("etcd-20261126T090000Z")
    chosen = backups.verify(backups.choose(str(tmp_path), "etcd-20261126T080000Z"), SECRETS)
    assert chosen["name"] == "etcd-20261126T080000Z" and chosen["snapshot_size"] == len(PLAINTEXT)
    with pytest.raises(backups.BackupError, match="there are: etcd-20261126T080000Z, etcd-20261126T090000Z"):
        backups.choose(str(tmp_path), "etcd-20990101T000000Z")
    with pytest.raises(backups.BackupError, match="no etcd snapshot in"):
        backups.choose(str(tmp_path / "empty"), "latest")


def _damaged(tmp_path, damage) -> str:
    _stored(tmp_path, "etcd-20261126T090000Z")
    path = tmp_path / "etcd-20261126T090000Z" / backups.SNAPSHOT_FILE
    path.write_bytes(damage(path.read_bytes()))
    return str(tmp_path / "etcd-20261126T090000Z")


@pytest.mark.parametrize(
    "damage, error, message",
    [
        (lambda data: data[:-10], snapshot.TruncatedError, "truncated"),
        (
            lambda data: data[:300] + bytes([data[300] ^ 0x10]) + data[301:],
            snapshot.AuthenticationError,
            "fails authentication",
        ),
    ],
)
def test_damaged_snapshot_is_refused(tmp_path, damage, error, message):
    with pytest.raises(error, match=message):
        backups.verify(_damaged(tmp_path, damage), SECRETS)


def test_another_clusters_snapshot_is_refused_by_its_manifest_and_by_its_header(tmp_path):
    _stored(tmp_path, "etcd-20261126T090000Z", secrets=OTHER)
    directory = str(tmp_path / "etcd-20261126T090000Z")
    with pytest.raises(snapshot.WrongClusterError, match="not of this cluster"):
        backups.verify(directory, SECRETS)
    manifest_path = tmp_path / "etcd-20261126T090000Z" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["cluster_id"] = SECRETS.cluster_id().hex()
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(snapshot.WrongClusterError, match="not of this cluster"):
        backups.verify(directory, SECRETS)


def test_genuine_file_under_another_manifest_is_refused(tmp_path):
    _stored(tmp_path, "etcd-20261126T080000Z")
    _stored(tmp_path, "etcd-20261126T090000Z")
    older = (tmp_path / "etcd-20261126T080000Z" / backups.SNAPSHOT_FILE).read_bytes()
    (tmp_path / "etcd-20261126T090000Z" / backups.SNAPSHOT_FILE).write_bytes(older)
    with pytest.raises(backups.BackupError, match="not the file its manifest describes"):
        backups.verify(str(tmp_path / "etcd-20261126T090000Z"), SECRETS)


def test_missing_manifest_is_named(tmp_path):
    _fetched(tmp_path, "etcd-20261126T090000Z")
    with pytest.raises(backups.BackupError, match="manifest.json is missing"):
        backups.verify(str(tmp_path / "etcd-20261126T090000Z"), SECRETS)
