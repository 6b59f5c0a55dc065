# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""restore.yml's refusals, run for real by ansible-playbook: each happens on the controller before any node task, so
local hosts stand in for the control planes (a node task would fail on them, and none may run)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._backup import snapshot
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import RootSecrets
from ansible_collections.confidential.kubernetes.plugins.module_utils._files import file_sha256
from ansible_collections.confidential.kubernetes.plugins.plugin_utils import _etcd_backups

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
SECRETS = RootSecrets(bytes(range(32)), bytes(range(32, 64)), bytes(range(64, 96)))
CLUSTER_ID = SECRETS.cluster_id().hex()
GOOD = "etcd-20261126T090000Z"


def _stored(backups: Path, name: str, secrets: RootSecrets = SECRETS) -> Path:
    directory = backups / name
    directory.mkdir(parents=True)
    plaintext = os.urandom(3000)
    sink = io.BytesIO()
    snapshot.encrypt(
        snapshot.backup_key(secrets.master_key, secrets.master_salt),
        secrets.cluster_id(),
        io.BytesIO(plaintext),
        len(plaintext),
        sink,
        snapshot.MIN_CHUNK_SIZE,
    )
    (directory / "etcd.cksnap").write_bytes(sink.getvalue())
    path = str(directory / "etcd.cksnap")
    manifest = dict(
        cluster_id=secrets.cluster_id().hex(),
        time=name[5:],
        revision=9,
        member="cp-0",
        size=os.path.getsize(path),
        sha256=file_sha256(path),
    )
    _etcd_backups.store(str(backups), name, manifest, 9)
    return directory / "etcd.cksnap"


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
    assert f"every object written since {GOOD} (etcd revision 9, taken on cp-0)" in run.stdout
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
    run = _restore(site, "-e", f"confirm_restore={CLUSTER_ID}")
    assert run.returncode != 0 and "snapshot refused" in run.stdout and message in run.stdout, run.stdout


def test_another_clusters_snapshot_is_refused_by_name(site):
    _stored(site / "backups", "etcd-20261126T080000Z", RootSecrets(bytes(32), bytes(32), bytes(32)))
    run = _restore(site, "-e", f"confirm_restore={CLUSTER_ID}", "-e", "restore_snapshot=etcd-20261126T080000Z")
    assert run.returncode != 0 and "not of this cluster" in run.stdout, run.stdout


def test_a_play_without_every_control_plane_is_refused(site):
    run = _restore(site, "-l", "cp-0", "-e", f"confirm_restore={CLUSTER_ID}")
    assert run.returncode != 0 and "run it on exactly the control_plane group (cp-0, cp-1)" in run.stdout, run.stdout
