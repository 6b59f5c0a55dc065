# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""containerd and the kubelet start at boot only once the state disk is open: the join role's boot_unit installs, with a
state disk, a unit that waits for the boot-time join to open it and drop-ins ordering both after that unit (After=,
Requires=). Real ansible-playbook, the units installed into a temporary directory and read back as systemd reads them."""

from __future__ import annotations

import configparser
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
WAIT_UNIT = "confidential-state-disk.service"


def _install(tmp_path: Path, **variables) -> subprocess.CompletedProcess:
    """The ordering tasks of boot_unit_install.yml, as the role runs them (its defaults, vars and templates)."""
    tasks = yaml.safe_load((REPO / "roles" / "join" / "tasks" / "boot_unit_install.yml").read_text())
    (ordering,) = (task for task in tasks if task.get("ansible.builtin.import_tasks") == "state_disk_order.yml")
    assert ordering["name"] == "Order containerd and the kubelet after the state disk is open"
    (tmp_path / "system").mkdir(exist_ok=True)
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "localhost",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "ansible.builtin.include_role": {
                                "name": "confidential.kubernetes.join",
                                "tasks_from": "state_disk_order",
                            }
                        }
                    ],
                }
            ]
        )
    )
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"),
        ANSIBLE_NOCOLOR="1",
        TMPDIR=str(tmp_path),
    )
    extra = {
        "ansible_python_interpreter": sys.executable,
        "__join_systemd_dir": str(tmp_path / "system"),
        "confidential_state_disk": {"device": "/dev/vdb", "state": "mounted"},
        **variables,
    }
    return subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", "localhost,", "-c", "local", "-e", json.dumps(extra), str(playbook)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def _unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read_string(path.read_text())
    return parser


def test_containerd_and_the_kubelet_require_and_follow_the_state_disk_unit(tmp_path):
    run = _install(tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    system = tmp_path / "system"
    for unit in ("containerd.service", "kubelet.service"):
        drop_in = _unit(system / f"{unit}.d" / "20-confidential-state-disk.conf")
        assert drop_in["Unit"]["After"] == drop_in["Unit"]["Requires"] == WAIT_UNIT, unit
    wait = _unit(system / WAIT_UNIT)
    # Done once the join has opened the disk; not ordered after the join unit (kubeadm join restarts the kubelet).
    assert wait["Service"]["Type"] == "oneshot" and wait["Service"]["RemainAfterExit"] == "yes"
    assert wait["Service"]["ExecStart"].endswith("_ticket.boot --wait /run/confidential-kubernetes/boot-status.json")
    assert wait["Unit"]["Wants"] == "confidential-join.service" and "After" not in wait["Unit"]
    assert "changed=0" in _install(tmp_path).stdout


def test_without_a_state_disk_nothing_is_ordered_and_an_earlier_ordering_goes(tmp_path):
    assert _install(tmp_path).returncode == 0
    run = _install(tmp_path, confidential_state_disk={})
    assert run.returncode == 0, run.stdout + run.stderr
    system = tmp_path / "system"
    assert not (system / WAIT_UNIT).exists()
    assert not list(system.glob("*.d/20-confidential-state-disk.conf"))
