# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""backup.yml against a real etcd 3.4 (local host as the control plane), run for real by ansible-playbook: directories
planted in backups/ under far-future names (a genuine snapshot copied, its manifest edited to match; random bytes; a
manifest alone) are never counted as the newest, so the genuine snapshots are kept and pruned as backup_keep says,
and the planted ones are left alone and named."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import RootSecrets

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
SECRETS = RootSecrets(bytes(range(32)), bytes(range(32, 64)), bytes(range(64, 96)))

pytestmark = pytest.mark.skipif(not (shutil.which("etcd") and shutil.which("etcdctl")), reason="needs etcd, etcdctl")


def _etcd_member_type():
    """The plugin tests' real etcd member (tests/unit/plugins/conftest.py), loaded once."""
    module = sys.modules.get("ck_plugins_conftest")
    if module is None:
        spec = importlib.util.spec_from_file_location(
            "ck_plugins_conftest", REPO / "tests" / "unit" / "plugins" / "conftest.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules["ck_plugins_conftest"] = module
        spec.loader.exec_module(module)
    return module.EtcdMember


@pytest.fixture
def member(tmp_path):
    running = _etcd_member_type()(str(tmp_path / "etcd-data")).start()
    running.ctl("put", "/registry/configmaps/default/cm-0", "x")
    yield running
    running.stop()


def _backup(site: Path, member) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"), ANSIBLE_NOCOLOR="1")
    extra = dict(
        backup_etcd_endpoint=member.client,
        backup_node_secrets_file=str(site / "secrets" / "cluster-secrets.json"),
        backup_work_dir=str(site / "work"),
        backup_keep=2,
    )
    run = subprocess.run(
        [
            ANSIBLE_PLAYBOOK,
            "-i",
            str(site / "inventory.yml"),
            "confidential.kubernetes.backup",
            "-e",
            json.dumps(extra),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    # One snapshot a second at most: the names are the UTC time to the second.
    time.sleep(1.1)
    return run


def test_planted_far_future_directories_never_prune_the_genuine_snapshots(local_site, member):
    site = local_site(SECRETS, {"cp-0": "192.0.2.10"}, {})
    backups = site / "backups"
    _backup(site, member)
    (first,) = os.listdir(backups)

    shutil.copytree(backups / first, backups / "etcd-20991231T000000Z")
    copied = backups / "etcd-20991231T000000Z" / "manifest.json"
    copied.write_text(
        json.dumps(dict(json.loads(copied.read_text()), name=copied.parent.name, time="20991231T000000Z"))
    )
    (backups / "etcd-20991230T000000Z").mkdir()
    (backups / "etcd-20991230T000000Z" / "etcd.cksnap").write_bytes(os.urandom(4096))
    (backups / "etcd-20991229T000000Z").mkdir()
    shutil.copy(backups / first / "manifest.json", backups / "etcd-20991229T000000Z" / "manifest.json")
    planted = sorted(name for name in os.listdir(backups) if name.startswith("etcd-2099"))

    second = _backup(site, member)
    message = "left alone (not authenticated snapshots of this cluster): " + ", ".join(planted)
    assert message in second.stdout, second.stdout
    third = _backup(site, member)
    genuine = sorted(name for name in os.listdir(backups) if name not in planted)
    assert len(genuine) == 2 and first not in genuine, genuine
    assert re.search(rf"removed {first}\b", third.stdout), third.stdout
    assert sorted(set(os.listdir(backups)) - set(genuine)) == planted
    for name in genuine:
        written = json.loads((backups / name / "manifest.json").read_text())
        assert written["name"] == name and written["format"] == 2 and written["member"] == "cp-0"
