"""The node role's lib entry point on this host with real ansible-playbook: the collection's code shipped into a
temporary directory, a re-run decided by one node_state call, and a damaged tree found and unpacked again."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
SHIPPED = "ansible_collections/confidential/kubernetes/plugins/module_utils/_node/state.py"


def _play(tmp_path: Path, *options: str) -> subprocess.CompletedProcess:
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "localhost",
                    "gather_facts": False,
                    "tasks": [
                        {"ansible.builtin.include_role": {"name": "confidential.kubernetes.node", "tasks_from": "lib"}},
                        {
                            "name": "Report node_lib_copy",
                            "ansible.builtin.debug": {"msg": "node_lib_copy changed={{ node_lib_copy is changed }}"},
                        },
                    ],
                }
            ]
        )
    )
    extra = dict(ansible_python_interpreter=sys.executable, node_lib_dir=str(tmp_path / "node" / "lib"))
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"),
        ANSIBLE_NOCOLOR="1",
        TMPDIR=str(tmp_path),
    )
    return subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", "localhost,", "-c", "local", "-e", json.dumps(extra), *options, str(playbook)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )


def _changed(stdout: str) -> int:
    return int(re.search(r"localhost\s+: ok=\d+\s+changed=(\d+)", stdout).group(1))


def _lib_copy_changed(stdout: str) -> bool:
    return bool(re.search(r'"msg": "node_lib_copy changed=True"', stdout))


def _shipping_skipped(stdout: str) -> bool:
    return bool(
        re.search(r"TASK \[confidential.kubernetes.node : Copy the collection's code\][^\n]*\nskipping: ", stdout)
    )


def test_ship_then_rerun_in_one_call_then_repair_a_damaged_tree(tmp_path):
    shipped = tmp_path / "node" / "lib" / SHIPPED
    checked = _play(tmp_path, "--check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert _changed(checked.stdout) > 0 and not shipped.exists()

    first = _play(tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert _lib_copy_changed(first.stdout)
    assert shipped.read_bytes() == (REPO / "plugins/module_utils/_node/state.py").read_bytes()
    assert not list((tmp_path / "node" / "lib").rglob("__pycache__"))

    second = _play(tmp_path)
    assert second.returncode == 0 and _changed(second.stdout) == 0, second.stdout
    assert _shipping_skipped(second.stdout) and not _lib_copy_changed(second.stdout), second.stdout

    # A damaged tree with the archive intact: unpacked again, and the code did not change (no service restart).
    shipped.write_text("# damaged\n")
    repaired = _play(tmp_path)
    assert repaired.returncode == 0 and _changed(repaired.stdout) > 0, repaired.stdout
    assert not _lib_copy_changed(repaired.stdout)
    assert shipped.read_bytes() == (REPO / "plugins/module_utils/_node/state.py").read_bytes()

    # Another archive on the node (older code): copied and unpacked, and node_lib_copy says the code changed.
    (tmp_path / "node" / "lib.tar").write_bytes(b"older code")
    replaced = _play(tmp_path)
    assert replaced.returncode == 0 and _lib_copy_changed(replaced.stdout), replaced.stdout
    final = _play(tmp_path)
    assert _changed(final.stdout) == 0 and _shipping_skipped(final.stdout), final.stdout
