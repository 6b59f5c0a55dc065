# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""backup.yml when no etcd member answers, run for real by ansible-playbook with local hosts as control planes: the
play fails naming every member's error, takes no snapshot and writes nothing to the controller."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))


@pytest.mark.skipif(not shutil.which("etcdctl"), reason="needs etcdctl")
def test_no_healthy_member_is_named_and_nothing_is_written(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = sock.getsockname()[1]
    hosts = {"cp-0": {"ansible_host": "192.0.2.10"}, "cp-1": {"ansible_host": "192.0.2.11"}}
    inventory = {
        "all": {
            "vars": {
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                "confidential_node_python": sys.executable,
                "backup_etcd_endpoint": f"http://127.0.0.1:{dead}",
            },
            "children": {
                "control_plane": {"hosts": hosts},
                "workers": {"hosts": {}},
                "cluster": {"children": {"control_plane": {}, "workers": {}}},
            },
        }
    }
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"), ANSIBLE_NOCOLOR="1")
    run = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(tmp_path / "inventory.yml"), "confidential.kubernetes.backup"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert run.returncode != 0, run.stdout
    message = run.stdout.split("No healthy etcd member to snapshot:", 1)[1].split("\n\n")[0]
    for host in hosts:
        assert f"{host}: etcd member http://127.0.0.1:{dead}: health check failed" in message, message
    assert "restore a snapshot (playbook restore.yml)" in message
    assert not (tmp_path / "backups").exists()
