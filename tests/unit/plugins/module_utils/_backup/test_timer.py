# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The snapshot timer's program, run as systemd runs it (python -m, its own process), against a real etcd 3.4:
snapshots kept on disk, the newest N kept, each one decrypting with the format's reader."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._backup import snapshot, timer
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import RootSecrets
from ansible_collections.confidential.kubernetes.plugins.plugin_utils import _etcd_backups

pytestmark = pytest.mark.skipif(not (shutil.which("etcd") and shutil.which("etcdctl")), reason="needs etcd, etcdctl")

SECRETS = RootSecrets(bytes(range(32)), bytes(range(32, 64)), bytes(range(64, 96)))
MODULE = "ansible_collections.confidential.kubernetes.plugins.module_utils._backup.timer"
# The directory holding ansible_collections/, as the unit's PYTHONPATH holds the node's copy of the code.
ENV = dict(os.environ, PYTHONPATH=str(Path(timer.__file__).parents[6]), PYTHONDONTWRITEBYTECODE="1")


@pytest.fixture(scope="module")
def member(tmp_path_factory, etcd_members):
    running = etcd_members(str(tmp_path_factory.mktemp("etcd") / "data"))
    for number in range(20):
        running.ctl("put", f"/registry/configmaps/default/cm-{number:03d}", "x" * 100)
    return running


@pytest.fixture
def secrets_file(tmp_path) -> str:
    path = tmp_path / "cluster-secrets.json"
    path.write_text(json.dumps(SECRETS.to_document()))
    path.chmod(0o600)
    return str(path)


def _cli(member, secrets_file: str, directory: Path, work: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            MODULE,
            "--dir",
            str(directory),
            "--endpoint",
            member.client,
            "--secrets-file",
            secrets_file,
            "--work-dir",
            str(work),
            "--member",
            "cp-0",
            *extra,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env=ENV,
    )


def test_two_runs_keep_the_newest_and_decrypt(member, secrets_file, tmp_path):
    directory, work = tmp_path / "state" / "etcd-backups", tmp_path / "work"
    # An older snapshot, as an earlier day's run left it, and the debris of a run that crashed.
    old = timer.run(member.etcdctl(), secrets_file, str(directory), 5, str(work), "cp-0", now=86400.0)
    assert old["snapshot"].endswith("etcd-19700102T000000Z")
    (directory / ".etcd-19700102T000001Z.part").mkdir()

    runs = []
    for dummy in range(2):
        runs.append(_cli(member, secrets_file, directory, work, "--keep", "2"))
        assert runs[-1].returncode == 0, runs[-1].stderr
        member.ctl("put", "/registry/configmaps/default/later", "y")
        if dummy == 0:
            # One snapshot a second at most: the names are the UTC time to the second.
            subprocess.run(["sleep", "1.1"], check=True)
    first, second = (json.loads(run.stdout) for run in runs)
    assert first["pruned"] == [] and second["pruned"] == ["etcd-19700102T000000Z"]
    kept = sorted(os.listdir(directory))
    assert kept == sorted(os.path.basename(r["snapshot"]) for r in (first, second))
    assert (directory.stat().st_mode & 0o777) == 0o700 and os.listdir(work) == []
    assert second["revision"] > first["revision"]

    key = snapshot.backup_key(SECRETS.master_key, SECRETS.master_salt)
    for name in kept:
        manifest = json.loads((directory / name / "manifest.json").read_text())
        ciphertext = directory / name / "etcd.cksnap"
        assert manifest["name"] == name and manifest["member"] == "cp-0"
        assert manifest["cluster_id"] == SECRETS.cluster_id().hex() and manifest["size"] == ciphertext.stat().st_size
        assert (ciphertext.stat().st_mode & 0o777) == 0o600
        assert b"cm-007" not in ciphertext.read_bytes()
        plaintext = tmp_path / f"{name}.db"
        info = snapshot.decrypt_file(key, SECRETS.cluster_id(), str(ciphertext), str(plaintext))
        assert info.plaintext_size == manifest["snapshot_size"] and b"cm-007" in plaintext.read_bytes()
        status = json.loads(
            subprocess.run(
                ["etcdctl", "snapshot", "status", str(plaintext), "-w", "json"],
                capture_output=True,
                text=True,
                check=True,
                env=dict(os.environ, ETCDCTL_API="3"),
            ).stdout
        )
        assert status["revision"] == manifest["revision"]
        # The controller's restore check takes the directory as it is (copied into backups/).
        chosen = _etcd_backups.select(str(directory), str(directory / name), SECRETS, allow_older=True)
        assert chosen["revision"] == manifest["revision"] and chosen["authenticated"]


def test_no_healthy_member_or_bad_secrets_keep_what_was_there(member, secrets_file, tmp_path):
    directory, work = tmp_path / "backups", tmp_path / "work"
    assert _cli(member, secrets_file, directory, work).returncode == 0
    before = sorted(os.listdir(directory))
    subprocess.run(["sleep", "1.1"], check=True)  # not refused as a second snapshot in the same second

    down = subprocess.run(
        [
            sys.executable,
            "-m",
            MODULE,
            "--dir",
            str(directory),
            "--endpoint",
            "http://127.0.0.1:1",
            "--secrets-file",
            secrets_file,
            "--work-dir",
            str(work),
            "--timeout",
            "2",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env=ENV,
    )
    assert down.returncode == 1 and "etcd snapshot from http://127.0.0.1:1 failed" in down.stderr

    Path(secrets_file).chmod(0o644)
    loose = _cli(member, secrets_file, directory, work)
    assert loose.returncode == 1 and "cluster secrets file" in loose.stderr

    zero = _cli(member, secrets_file, directory, work, "--keep", "0")
    assert zero.returncode == 1 and "--keep must be at least 1, got 0" in zero.stderr
    assert sorted(os.listdir(directory)) == before and os.listdir(work) == []


def test_planted_directories_on_the_node_never_make_the_timer_prune_its_snapshots(member, secrets_file, tmp_path):
    directory, work = tmp_path / "state" / "etcd-backups", tmp_path / "work"
    first = timer.run(member.etcdctl(), secrets_file, str(directory), 2, str(work), "cp-0", now=86400.0)
    # Far-future names: a genuine snapshot copied (manifest edited to match), and a directory of random bytes.
    shutil.copytree(first["snapshot"], directory / "etcd-20991231T000000Z")
    copied = directory / "etcd-20991231T000000Z" / "manifest.json"
    copied.write_text(
        json.dumps(dict(json.loads(copied.read_text()), name=copied.parent.name, time="20991231T000000Z"))
    )
    (directory / "etcd-20991230T000000Z").mkdir()
    (directory / "etcd-20991230T000000Z" / "etcd.cksnap").write_bytes(os.urandom(2048))
    second = timer.run(member.etcdctl(), secrets_file, str(directory), 2, str(work), "cp-0", now=2 * 86400.0)
    third = timer.run(member.etcdctl(), secrets_file, str(directory), 2, str(work), "cp-0", now=3 * 86400.0)
    assert second["pruned"] == [] and third["pruned"] == ["etcd-19700102T000000Z"]
    assert third["kept"] == ["etcd-19700103T000000Z", "etcd-19700104T000000Z"]
    assert third["unauthenticated"] == ["etcd-20991230T000000Z", "etcd-20991231T000000Z"]
    assert sorted(os.listdir(directory)) == sorted(third["kept"] + third["unauthenticated"])
