"""Before the node lock, init and join refuse a state disk that will not hold the node's cluster state unless the
inventory allows it (confidential_state_disk_allow_unmapped), and then say so once per node. Real Ansible, local."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
HAS_DEVICE_MAPPER = os.path.exists("/sys/class/misc/device-mapper")


def check(tmp_path: Path, **extra) -> subprocess.CompletedProcess:
    disk = tmp_path / "state-disk.img"
    disk.write_bytes(b"")
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "Check",
                    "ansible.builtin.include_role": {
                        "name": "confidential.kubernetes.join",
                        "tasks_from": "state_disk",
                    },
                },
                {"name": "Past the check", "ansible.builtin.debug": {"msg": "not stopped"}},
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"),
        ANSIBLE_NOCOLOR="1",
        TMPDIR=str(tmp_path),
    )
    variables = dict(
        ansible_python_interpreter=sys.executable, confidential_state_disk={"device": str(disk), "state": "formatted"}
    )
    variables.update(extra)
    return subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", "localhost,", "-c", "local", "-e", json.dumps(variables), str(tmp_path / "play.yml")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def test_a_formatted_only_disk_is_refused_naming_the_variable(tmp_path):
    run = check(tmp_path)
    assert run.returncode != 0
    assert (
        "is only formatted, not mounted" in run.stdout and "confidential_state_disk_allow_unmapped: true" in run.stdout
    )
    assert "the node was not locked" in run.stdout and "not stopped" not in run.stdout


def test_the_allowance_goes_on_with_one_warning(tmp_path):
    run = check(tmp_path, confidential_state_disk_allow_unmapped=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("WARNING localhost: the state disk") == 1 and "not stopped" in run.stdout


def test_mounted_needs_device_mapper_or_the_allowance(tmp_path):
    run = check(tmp_path, confidential_state_disk={"device": str(tmp_path / "state-disk.img"), "state": "mounted"})
    if HAS_DEVICE_MAPPER:
        assert run.returncode == 0 and "WARNING" not in run.stdout, run.stdout
    else:
        assert run.returncode != 0 and "this host has no device-mapper to map the state disk" in run.stdout


def test_a_missing_device_is_refused_first(tmp_path):
    run = check(
        tmp_path,
        confidential_state_disk={"device": str(tmp_path / "nothing.img"), "state": "mounted"},
        confidential_state_disk_allow_unmapped=True,
    )
    assert run.returncode != 0 and "nothing.img does not exist" in run.stdout


def test_a_device_named_by_a_link_is_the_device_it_names(tmp_path):
    # /dev/disk/by-id/... and /dev/disk/by-uuid/... are links to the block device: the check follows them.
    (tmp_path / "by-id").mkdir()
    (tmp_path / "by-id" / "virtio-state").symlink_to(tmp_path / "state-disk.img")
    run = check(
        tmp_path,
        confidential_state_disk={"device": str(tmp_path / "by-id" / "virtio-state"), "state": "formatted"},
        confidential_state_disk_allow_unmapped=True,
    )
    assert run.returncode == 0 and "not stopped" in run.stdout, run.stdout


def test_a_dangling_link_is_refused_as_missing(tmp_path):
    (tmp_path / "gone").symlink_to(tmp_path / "no-such-disk")
    run = check(
        tmp_path,
        confidential_state_disk={"device": str(tmp_path / "gone"), "state": "formatted"},
        confidential_state_disk_allow_unmapped=True,
    )
    assert run.returncode != 0 and "gone does not exist" in run.stdout
