# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's snapshot directory: store and prune only this cluster's authenticated snapshots, choose latest
or by name, and refuse before any restore: a planted or re-pointed directory, an altered manifest, an older
snapshot without allow_older, a damaged file."""

from __future__ import annotations

import io
import json
import os
import shutil

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._backup import manifest, snapshot
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import RootSecrets
from ansible_collections.confidential.kubernetes.plugins.module_utils._files import file_sha256
from ansible_collections.confidential.kubernetes.plugins.plugin_utils import _etcd_backups as backups

SECRETS = RootSecrets(bytes(range(32)), bytes(range(32, 64)), bytes(range(64, 96)))
OTHER = RootSecrets(bytes(32), bytes(32), bytes(32))
PLAINTEXT = os.urandom(5000)


def _key(secrets: RootSecrets = SECRETS) -> bytes:
    return snapshot.backup_key(secrets.master_key, secrets.master_salt)


def _encrypted(path, name: str, secrets: RootSecrets = SECRETS, revision: int = 42) -> dict:
    """Write the snapshot ``name`` as the node encrypts it to ``path``; returns the manifest the node reports."""
    sink = io.BytesIO()
    info = snapshot.encrypt(
        _key(secrets),
        secrets.cluster_id(),
        io.BytesIO(PLAINTEXT),
        len(PLAINTEXT),
        sink,
        snapshot.MIN_CHUNK_SIZE,
        provenance=manifest.provenance(name, revision, 7, 12345, "cp-0"),
    )
    path.write_bytes(sink.getvalue())
    return manifest.from_info(info, path.stat().st_size, file_sha256(str(path))).to_document()


def _fetched(backup_dir, name: str, secrets: RootSecrets = SECRETS, revision: int = 42) -> dict:
    """A snapshot directory without its manifest.json, and the manifest the node reported."""
    (backup_dir / name).mkdir(parents=True)
    return _encrypted(backup_dir / name / manifest.SNAPSHOT_FILE, name, secrets, revision)


def _stored(backup_dir, name, secrets=SECRETS, keep=7, revision=42):
    """As backup.yml files it: fetched beside the directory, then stored."""
    backup_dir.mkdir(parents=True, exist_ok=True)
    fetched = backup_dir / ".etcd-snapshot.cksnap"
    reported = _encrypted(fetched, name, secrets, revision)
    return backups.store(str(backup_dir), str(fetched), reported, keep, secrets)


def _format1(backup_dir, name: str) -> None:
    """A snapshot as this collection wrote it before the manifest was authenticated (format 1, manifest version 1)."""
    directory = backup_dir / name
    directory.mkdir(parents=True)
    sink = io.BytesIO()
    snapshot.encrypt(_key(), SECRETS.cluster_id(), io.BytesIO(PLAINTEXT), len(PLAINTEXT), sink, snapshot.MIN_CHUNK_SIZE)
    path = directory / manifest.SNAPSHOT_FILE
    path.write_bytes(sink.getvalue())
    document = dict(
        version=1,
        name=name,
        cluster_id=SECRETS.cluster_id().hex(),
        time=name[5:],
        revision=9,
        member="cp-0",
        size=path.stat().st_size,
        sha256=file_sha256(str(path)),
    )
    (directory / manifest.MANIFEST_FILE).write_text(json.dumps(document))


def _edit_manifest(directory, **changes) -> None:
    path = directory / manifest.MANIFEST_FILE
    path.write_text(json.dumps(dict(json.loads(path.read_text()), **changes)))


def test_store_writes_the_authenticated_manifest_and_keeps_the_newest(tmp_path):
    names = [f"etcd-20261126T0{hour}0000Z" for hour in range(1, 6)]
    for name in names[:4]:
        _stored(tmp_path, name)
    result = _stored(tmp_path, names[4], keep=3)
    assert result["pruned"] == names[:2] and result["kept"] == names[2:]
    assert sorted(os.listdir(tmp_path)) == names[2:]
    written = json.loads((tmp_path / names[4] / "manifest.json").read_text())
    assert written["revision"] == 42 and written["name"] == names[4] and written["time"] == names[4][5:]
    assert written["version"] == 2 and written["format"] == 2 and written["member"] == "cp-0"
    assert (os.stat(tmp_path / names[4] / "manifest.json").st_mode & 0o777) == 0o600


def test_store_refuses_a_fetched_file_that_is_not_what_the_node_wrote(tmp_path):
    fetched = tmp_path / ".etcd-snapshot.cksnap"
    reported = _encrypted(fetched, "etcd-20261126T090000Z")
    with pytest.raises(backups.BackupError, match="is not the one the node wrote"):
        backups.store(str(tmp_path), str(fetched), dict(reported, sha256="0" * 64), 3, SECRETS)
    assert os.listdir(tmp_path) == [fetched.name]


def test_store_refuses_a_reported_manifest_its_header_does_not_say(tmp_path):
    fetched = tmp_path / ".etcd-snapshot.cksnap"
    reported = _encrypted(fetched, "etcd-20261126T090000Z")
    for forged in (dict(reported, revision=99), dict(reported, name="etcd-20991231T000000Z")):
        with pytest.raises(backups.BackupError, match="not what the snapshot's authenticated header says"):
            backups.store(str(tmp_path), str(fetched), forged, 3, SECRETS)
    with pytest.raises(backups.BackupError, match="is not etcd-<YYYYmmddTHHMMSSZ>"):
        backups.store(str(tmp_path), str(fetched), dict(reported, name="../../victim"), 3, SECRETS)
    assert os.listdir(tmp_path) == [fetched.name]
    os.symlink(fetched, tmp_path / "link")
    with pytest.raises(backups.BackupError, match="not a regular file"):
        backups.store(str(tmp_path), str(tmp_path / "link"), reported, 3, SECRETS)


def test_planted_far_future_directories_never_prune_the_real_ones(tmp_path):
    real = [f"etcd-20261126T0{hour}0000Z" for hour in range(1, 4)]
    for name in real[:2]:
        _stored(tmp_path, name)
    # A genuine older snapshot copied under far-future names (its manifest edited to match, or not), random bytes
    # under another, and another cluster's genuine snapshot: none is backup's, so none counts as the newest.
    shutil.copytree(tmp_path / real[0], tmp_path / "etcd-20991231T000000Z")
    _edit_manifest(tmp_path / "etcd-20991231T000000Z", name="etcd-20991231T000000Z", time="20991231T000000Z")
    shutil.copytree(tmp_path / real[0], tmp_path / "etcd-20991230T000000Z")
    (tmp_path / "etcd-20991229T000000Z").mkdir()
    (tmp_path / "etcd-20991229T000000Z" / "etcd.cksnap").write_bytes(os.urandom(4096))
    _fetched(tmp_path, "etcd-20991228T000000Z", OTHER)
    planted = sorted(name for name in os.listdir(tmp_path) if name.startswith("etcd-2099"))

    result = _stored(tmp_path, real[2], keep=2)
    assert result["pruned"] == real[:1] and result["kept"] == real[1:]
    assert sorted(result["unauthenticated"]) == planted
    assert "renamed or copied" in result["unauthenticated"]["etcd-20991230T000000Z"]
    assert sorted(os.listdir(tmp_path)) == sorted(real[1:] + planted)


def test_latest_is_never_repointed_at_an_older_genuine_snapshot(tmp_path):
    _stored(tmp_path, "etcd-20261126T080000Z", revision=40)
    _stored(tmp_path, "etcd-20261126T090000Z", revision=50)
    chosen = backups.select(str(tmp_path), "latest", SECRETS)
    assert chosen["name"] == "etcd-20261126T090000Z" and chosen["revision"] == 50 and chosen["authenticated"]
    # "latest" pointed at the older genuine snapshot: copied under a newer name, its manifest made to match.
    shutil.copytree(tmp_path / "etcd-20261126T080000Z", tmp_path / "etcd-20261127T000000Z")
    _edit_manifest(tmp_path / "etcd-20261127T000000Z", name="etcd-20261127T000000Z", time="20261127T000000Z")
    with pytest.raises(backups.BackupError, match="newer-named etcd-20261127T000000Z .* renamed or copied"):
        backups.select(str(tmp_path), "latest", SECRETS)
    with pytest.raises(backups.BackupError, match="taken at 20261126T080000Z .authenticated., so its directory is"):
        backups.select(str(tmp_path), "etcd-20261127T000000Z", SECRETS, allow_older=True)
    assert backups.select(str(tmp_path), "etcd-20261126T090000Z", SECRETS)["revision"] == 50


def test_a_damaged_newest_snapshot_never_makes_an_older_one_latest(tmp_path):
    _stored(tmp_path, "etcd-20261126T080000Z", revision=40)
    _stored(tmp_path, "etcd-20261126T090000Z", revision=50)
    path = tmp_path / "etcd-20261126T090000Z" / manifest.SNAPSHOT_FILE
    data = bytearray(path.read_bytes())
    data[200] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(backups.BackupError, match="newer-named etcd-20261126T090000Z .*fails authentication"):
        backups.select(str(tmp_path), "latest", SECRETS)


def test_a_traversing_name_in_the_manifest_is_refused_and_never_used(tmp_path):
    _stored(tmp_path, "etcd-20261126T090000Z")
    _edit_manifest(tmp_path / "etcd-20261126T090000Z", name="../../../tmp/victim")
    with pytest.raises(backups.BackupError, match="differs from the snapshot's authenticated header in name"):
        backups.select(str(tmp_path), "etcd-20261126T090000Z", SECRETS)
    # A name that only starts like one (re.match with $ accepts a trailing newline), or a path that leaves it.
    for wanted in ("etcd-20261126T090000Z\n", f"{tmp_path}/etcd-20261126T090000Z/..", "etcd-x"):
        with pytest.raises(backups.BackupError, match="is not etcd-<YYYYmmddTHHMMSSZ>"):
            backups.select(str(tmp_path), wanted, SECRETS)


@pytest.mark.parametrize(
    "field, value",
    [
        ("revision", 41),
        ("time", "20261126T100000Z"),
        ("member", "cp-9"),
        ("total_keys", 1),
        ("snapshot_size", 1),
        ("sha256", "0" * 64),
        ("size", 1),
    ],
)
def test_a_tampered_manifest_field_is_refused_by_name(tmp_path, field, value):
    _stored(tmp_path, "etcd-20261126T090000Z")
    _edit_manifest(tmp_path / "etcd-20261126T090000Z", **{field: value})
    with pytest.raises(backups.BackupError, match=f"authenticated header in {field}: it was altered"):
        backups.select(str(tmp_path), "latest" if field != "time" else "etcd-20261126T090000Z", SECRETS)


def test_an_older_snapshot_is_refused_without_allow_older(tmp_path):
    _stored(tmp_path, "etcd-20261126T080000Z", revision=40)
    _stored(tmp_path, "etcd-20261126T090000Z", revision=50)
    with pytest.raises(
        backups.BackupError,
        match=r"refusing etcd-20261126T080000Z \(taken 20261126T080000Z, etcd revision 40\): it is older than the "
        r"newest snapshot etcd-20261126T090000Z \(etcd revision 50\).*restore_force_older=true",
    ):
        backups.select(str(tmp_path), "etcd-20261126T080000Z", SECRETS)
    chosen = backups.select(str(tmp_path), str(tmp_path / "etcd-20261126T080000Z"), SECRETS, allow_older=True)
    assert chosen["revision"] == 40 and "older than the newest" in chosen["older"]
    assert backups.select(str(tmp_path), "etcd-20261126T090000Z", SECRETS)["older"] == ""


def test_a_format1_snapshot_restores_by_name_with_allow_older_and_is_never_pruned(tmp_path):
    _format1(tmp_path, "etcd-20261125T090000Z")
    with pytest.raises(backups.BackupError, match="format 1 .* restores only by name.*etcd-20261125T090000Z"):
        backups.select(str(tmp_path), "latest", SECRETS)
    with pytest.raises(backups.BackupError, match="not authenticated .format 1.*restore_force_older"):
        backups.select(str(tmp_path), "etcd-20261125T090000Z", SECRETS)
    chosen = backups.select(str(tmp_path), "etcd-20261125T090000Z", SECRETS, allow_older=True)
    assert chosen["revision"] == 9 and not chosen["authenticated"] and chosen["snapshot_size"] == len(PLAINTEXT)
    _edit_manifest(tmp_path / "etcd-20261125T090000Z", name="../victim")
    with pytest.raises(backups.BackupError, match="format-1 snapshot whose manifest"):
        backups.select(str(tmp_path), "etcd-20261125T090000Z", SECRETS, allow_older=True)
    _edit_manifest(tmp_path / "etcd-20261125T090000Z", name="etcd-20261125T090000Z")
    result = _stored(tmp_path, "etcd-20261126T090000Z", keep=1)
    assert result["pruned"] == [] and result["format1"] == ["etcd-20261125T090000Z"]
    assert (tmp_path / "etcd-20261125T090000Z").is_dir()


def test_choose_by_name_names_what_there_is(tmp_path):
    _stored(tmp_path, "etcd-20261126T080000Z")
    (tmp_path / "not-a-snapshot").mkdir()
    with pytest.raises(backups.BackupError, match="there are: etcd-20261126T080000Z"):
        backups.select(str(tmp_path), "etcd-20990101T000000Z", SECRETS)
    with pytest.raises(backups.BackupError, match="no etcd snapshot in"):
        backups.select(str(tmp_path / "empty"), "latest", SECRETS)


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
    _stored(tmp_path, "etcd-20261126T090000Z")
    path = tmp_path / "etcd-20261126T090000Z" / manifest.SNAPSHOT_FILE
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(error, match=message):
        backups.select(str(tmp_path), "etcd-20261126T090000Z", SECRETS)


def test_another_clusters_snapshot_is_refused_by_its_manifest_and_by_its_header(tmp_path):
    _fetched(tmp_path, "etcd-20261126T090000Z", OTHER)
    directory = tmp_path / "etcd-20261126T090000Z"
    manifest.write(
        str(directory), manifest.Manifest.from_document(_fetched(tmp_path, "etcd-20261126T100000Z", OTHER), "test")
    )
    _edit_manifest(directory, name="etcd-20261126T090000Z", time="20261126T090000Z")
    with pytest.raises(snapshot.WrongClusterError, match="not of this cluster"):
        backups.select(str(tmp_path), "etcd-20261126T090000Z", SECRETS)
    _edit_manifest(directory, cluster_id=SECRETS.cluster_id().hex())
    with pytest.raises(snapshot.WrongClusterError, match="not of this cluster"):
        backups.select(str(tmp_path), "etcd-20261126T090000Z", SECRETS)


def test_genuine_file_under_another_manifest_is_refused(tmp_path):
    _stored(tmp_path, "etcd-20261126T080000Z")
    _stored(tmp_path, "etcd-20261126T090000Z")
    older = (tmp_path / "etcd-20261126T080000Z" / manifest.SNAPSHOT_FILE).read_bytes()
    (tmp_path / "etcd-20261126T090000Z" / manifest.SNAPSHOT_FILE).write_bytes(older)
    with pytest.raises(backups.BackupError, match="renamed or copied"):
        backups.select(str(tmp_path), "etcd-20261126T090000Z", SECRETS)


def test_missing_manifest_is_named(tmp_path):
    _fetched(tmp_path, "etcd-20261126T090000Z")
    with pytest.raises(backups.BackupError, match="manifest.json is missing"):
        backups.select(str(tmp_path), "etcd-20261126T090000Z", SECRETS)
