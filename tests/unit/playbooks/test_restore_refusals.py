# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""restore.yml's refusals, run for real by ansible-playbook: each happens on the controller before any node task, so
local hosts stand in for the control planes (a node task would fail on them, and none may run). Among them the
attacks on the snapshot directory: "latest" re-pointed at an older genuine snapshot, a manifest whose name leaves the
node's work directory, an edited manifest field, and an older snapshot without restore_force_older."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._backup import manifest, snapshot
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import RootSecrets
from ansible_collections.confidential.kubernetes.plugins.module_utils._files import file_sha256
from ansible_collections.confidential.kubernetes.plugins.plugin_utils import _etcd_backups

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
SECRETS = RootSecrets(bytes(range(32)), bytes(range(32, 64)), bytes(range(64, 96)))
CLUSTER_ID = SECRETS.cluster_id().hex()
GOOD = "etcd-20261126T090000Z"


def _stored(backups: Path, name: str, secrets: RootSecrets = SECRETS, revision: int = 9) -> Path:
    """A snapshot as backup.yml files it: encrypted, fetched beside the directory, stored."""
    backups.mkdir(parents=True, exist_ok=True)
    fetched = backups / ".etcd-snapshot.cksnap"
    plaintext = os.urandom(3000)
    sink = io.BytesIO()
    info = snapshot.encrypt(
        snapshot.backup_key(secrets.master_key, secrets.master_salt),
        secrets.cluster_id(),
        io.BytesIO(plaintext),
        len(plaintext),
        sink,
        snapshot.MIN_CHUNK_SIZE,
        provenance=manifest.provenance(name, revision, 5, 1, "cp-0"),
    )
    fetched.write_bytes(sink.getvalue())
    reported = manifest.from_info(info, fetched.stat().st_size, file_sha256(str(fetched))).to_document()
    return Path(_etcd_backups.store(str(backups), str(fetched), reported, 9, secrets)["path"])


def _edit_manifest(directory: Path, **changes) -> None:
    path = directory / "manifest.json"
    path.write_text(json.dumps(dict(json.loads(path.read_text()), **changes)))


@pytest.fixture
def site(local_site):
    site = local_site(SECRETS, {"cp-0": "192.0.2.10", "cp-1": "192.0.2.11"}, {})
    _stored(site / "backups", GOOD)
    return site


def _restore(site: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"), ANSIBLE_NOCOLOR="1")
    run = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(site / "inventory.yml"), "confidential.kubernetes.restore", *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert "TASK [confidential.kubernetes.restore : Find the etcd static pod" not in run.stdout, run.stdout
    return run


def test_without_confirmation_it_names_the_snapshot_and_the_cluster_id(site):
    run = _restore(site)
    assert run.returncode != 0
    assert (
        f"every object written since {GOOD} (taken {GOOD[5:]}, etcd revision 9, on cp-0; authenticated) is lost"
        in run.stdout
    ), run.stdout
    assert f"Confirm with -e confirm_restore={CLUSTER_ID}" in run.stdout


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda data: data[:100] + bytes([data[100] ^ 1]) + data[101:], "chunk 0 of 3 fails authentication"),
        (lambda data: data[:-500], "truncated"),
    ],
)
def test_a_damaged_snapshot_is_refused_even_when_confirmed(site, damage, message):
    path = _stored(site / "backups", "etcd-20261126T100000Z")
    path.write_bytes(damage(path.read_bytes()))
    run = _restore(site, "-e", f"confirm_restore={CLUSTER_ID}", "-e", "restore_snapshot=etcd-20261126T100000Z")
    assert run.returncode != 0 and "snapshot refused" in run.stdout and message in run.stdout, run.stdout
    latest = _restore(site, "-e", f"confirm_restore={CLUSTER_ID}")
    assert latest.returncode != 0 and "but newer-named etcd-20261126T100000Z" in latest.stdout, latest.stdout


def test_another_clusters_snapshot_is_refused_by_name(site):
    _stored(site / "backups", "etcd-20261126T080000Z", RootSecrets(bytes(32), bytes(32), bytes(32)))
    run = _restore(site, "-e", f"confirm_restore={CLUSTER_ID}", "-e", "restore_snapshot=etcd-20261126T080000Z")
    assert run.returncode != 0 and "not of this cluster" in run.stdout, run.stdout


def test_a_play_without_every_control_plane_is_refused(site):
    run = _restore(site, "-l", "cp-0", "-e", f"confirm_restore={CLUSTER_ID}")
    assert run.returncode != 0 and "run it on exactly the control_plane group (cp-0, cp-1)" in run.stdout, run.stdout


def test_latest_repointed_at_an_older_genuine_snapshot_is_refused(site):
    backups = site / "backups"
    _stored(backups, "etcd-20261126T080000Z", revision=5)
    shutil.copytree(backups / "etcd-20261126T080000Z", backups / "etcd-20991231T000000Z")
    _edit_manifest(backups / "etcd-20991231T000000Z", name="etcd-20991231T000000Z", time="20991231T000000Z")
    run = _restore(site, "-e", f"confirm_restore={CLUSTER_ID}")
    assert run.returncode != 0, run.stdout
    assert f"the newest authenticated snapshot is {GOOD}, but newer-named etcd-20991231T000000Z" in run.stdout
    named = _restore(site, "-e", f"confirm_restore={CLUSTER_ID}", "-e", "restore_snapshot=etcd-20991231T000000Z")
    assert named.returncode != 0 and "it was renamed or copied, and is refused" in named.stdout, named.stdout
    genuine = _restore(site, "-e", f"restore_snapshot={GOOD}")
    assert "Not this cluster's authenticated snapshots, never chosen: etcd-20991231T000000Z" in genuine.stdout
    assert f"every object written since {GOOD} (taken {GOOD[5:]}, etcd revision 9" in genuine.stdout, genuine.stdout


def test_a_manifest_name_leaving_the_work_directory_is_refused_and_nothing_is_touched(site, tmp_path):
    victim = tmp_path / "victim.cksnap"
    victim.write_bytes(b"someone else's file")
    work = tmp_path / "work" / "restore"
    _edit_manifest(site / "backups" / GOOD, name="../../victim")
    run = _restore(site, "-e", f"confirm_restore={CLUSTER_ID}", "-e", f"restore_work_dir={work}")
    assert run.returncode != 0 and "authenticated header in name: it was altered" in run.stdout, run.stdout
    assert victim.read_bytes() == b"someone else's file" and not work.exists()


@pytest.mark.parametrize("field, value", [("revision", 10), ("member", "cp-1"), ("time", "20261126T093000Z")])
def test_a_tampered_manifest_field_is_refused(site, field, value):
    _edit_manifest(site / "backups" / GOOD, **{field: value})
    run = _restore(site, "-e", f"confirm_restore={CLUSTER_ID}", "-e", f"restore_snapshot={GOOD}")
    assert run.returncode != 0 and f"authenticated header in {field}: it was altered" in run.stdout, run.stdout


def test_an_older_snapshot_needs_restore_force_older(site):
    _stored(site / "backups", "etcd-20261126T100000Z", revision=20)
    run = _restore(site, "-e", f"confirm_restore={CLUSTER_ID}", "-e", f"restore_snapshot={GOOD}")
    assert run.returncode != 0, run.stdout
    assert (
        f"refusing {GOOD} (taken {GOOD[5:]}, etcd revision 9): it is older than the newest snapshot "
        "etcd-20261126T100000Z (etcd revision 20)" in run.stdout
    ), run.stdout
    assert "Set restore_force_older=true" in run.stdout
    forced = _restore(site, "-e", f"restore_snapshot={GOOD}", "-e", "restore_force_older=true")
    assert forced.returncode != 0 and "Confirm with -e confirm_restore=" in forced.stdout, forced.stdout
    assert "it is older than the newest snapshot etcd-20261126T100000Z" in forced.stdout


def test_a_format1_snapshot_restores_only_by_name_with_restore_force_older(site):
    """A snapshot as this collection wrote it before the manifest was authenticated still reaches the confirmation."""
    directory = site / "backups" / "etcd-20261125T090000Z"
    directory.mkdir()
    plaintext = os.urandom(3000)
    sink = io.BytesIO()
    snapshot.encrypt(
        snapshot.backup_key(SECRETS.master_key, SECRETS.master_salt),
        SECRETS.cluster_id(),
        io.BytesIO(plaintext),
        len(plaintext),
        sink,
        snapshot.MIN_CHUNK_SIZE,
    )
    (directory / "etcd.cksnap").write_bytes(sink.getvalue())
    path = str(directory / "etcd.cksnap")
    old = dict(version=1, name=directory.name, cluster_id=CLUSTER_ID, time=directory.name[5:], revision=3)
    (directory / "manifest.json").write_text(
        json.dumps(dict(old, member="cp-0", size=os.path.getsize(path), sha256=file_sha256(path)))
    )
    refused = _restore(site, "-e", f"restore_snapshot={directory.name}")
    assert refused.returncode != 0 and "its time and revision are not authenticated (format 1)" in refused.stdout
    forced = _restore(site, "-e", f"restore_snapshot={directory.name}", "-e", "restore_force_older=true")
    assert forced.returncode != 0, forced.stdout
    assert (
        f"every object written since {directory.name} (taken {directory.name[5:]}, etcd revision 3, on cp-0; "
        "format 1, not authenticated;" in forced.stdout
    ), forced.stdout
