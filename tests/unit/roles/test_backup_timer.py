# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The backup role's timer entry point on this host with real ansible-playbook (units written into a temporary
directory; this host runs no systemd): installed when enabled, unchanged on a re-run, a bad schedule refused before
anything is written, removed when disabled; the rendered ExecStart runs the shipped program."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
UNITS = ("confidential-etcd-backup.service", "confidential-etcd-backup.timer")

pytestmark = pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="needs systemd-analyze")


def _play(tmp_path: Path, **variables) -> subprocess.CompletedProcess:
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
                                "name": "confidential.kubernetes.backup",
                                "tasks_from": "timer",
                            }
                        }
                    ],
                }
            ]
        )
    )
    extra = dict(
        ansible_python_interpreter=sys.executable,
        backup_timer_python=sys.executable,
        backup_timer_lib_dir=str(tmp_path / "lib"),
        backup_timer_dir=str(tmp_path / "state" / "etcd-backups"),
        backup_node_secrets_file=str(tmp_path / "cluster-secrets.json"),
        backup_etcd_endpoint="http://127.0.0.1:1",
        backup_timer_schedule="*-*-* 02:30:00",
        backup_timer_keep=3,
        __backup_timer_unit_dir=str(tmp_path / "units"),
        __backup_timer_systemd=False,
    )
    extra.update(variables)
    (tmp_path / "units").mkdir(exist_ok=True)
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"),
        ANSIBLE_NOCOLOR="1",
        TMPDIR=str(tmp_path),
    )
    return subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", "localhost,", "-c", "local", "-e", json.dumps(extra), str(playbook)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )


def _changed(stdout: str) -> int:
    return int(re.search(r"localhost\s+: ok=\d+\s+changed=(\d+)", stdout).group(1))


def _exec_start(unit: str) -> list:
    joined = re.sub(r"\\\n\s*", " ", unit)
    return shlex.split(re.search(r"^ExecStart=(.*)$", joined, re.M).group(1))


def test_install_rerun_remove(tmp_path):
    units = tmp_path / "units"
    first = _play(tmp_path, backup_timer_enabled=True)
    assert first.returncode == 0, first.stdout + first.stderr
    assert _changed(first.stdout) > 0
    service, timer = ((units / name).read_text() for name in UNITS)
    assert "OnCalendar=*-*-* 02:30:00\n" in timer and "Persistent=true\n" in timer
    assert "Unit=confidential-etcd-backup.service\n" in timer and "WantedBy=timers.target\n" in timer
    assert "Type=oneshot\n" in service and f"ReadWritePaths={tmp_path}/state/etcd-backups\n" in service
    assert (tmp_path / "state" / "etcd-backups").stat().st_mode & 0o777 == 0o700
    verify = subprocess.run(
        ["systemd-analyze", "verify", *(str(units / name) for name in UNITS)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert "confidential-etcd-backup" not in verify.stderr, verify.stderr

    argv = _exec_start(service)
    assert argv[:3] == [
        sys.executable,
        "-m",
        "ansible_collections.confidential.kubernetes.plugins.module_utils._backup.timer",
    ]
    assert argv[argv.index("--keep") + 1] == "3" and argv[argv.index("--member") + 1] == "localhost"
    # The unit's command, with the unit's PYTHONPATH (the shipped code): it parses and names what is missing.
    env = dict(os.environ, PYTHONPATH=re.search(r"^Environment=PYTHONPATH=(.*)$", service, re.M).group(1))
    run = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=120)
    assert run.returncode == 1 and f"{tmp_path}/cluster-secrets.json" in run.stderr, run.stderr

    second = _play(tmp_path, backup_timer_enabled=True)
    assert second.returncode == 0 and _changed(second.stdout) == 0, second.stdout

    removed = _play(tmp_path)
    assert removed.returncode == 0 and _changed(removed.stdout) > 0, removed.stdout
    assert not any((units / name).exists() for name in UNITS)
    assert (tmp_path / "state" / "etcd-backups").is_dir()
    again = _play(tmp_path)
    assert again.returncode == 0 and _changed(again.stdout) == 0, again.stdout


@pytest.mark.parametrize(
    "variables, message",
    [
        (
            dict(backup_timer_schedule="every tuesday"),
            'backup_timer_schedule "every tuesday" is not a systemd OnCalendar=',
        ),
        (dict(backup_timer_keep=0), "backup_timer_keep must be at least 1, got 0"),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(tmp_path, variables, message):
    refused = _play(tmp_path, backup_timer_enabled=True, **variables)
    assert refused.returncode != 0 and message in refused.stdout, refused.stdout
    assert list((tmp_path / "units").iterdir()) == [] and not (tmp_path / "lib").exists()
