"""The preflight's checks: each unsupported value is named with what is supported and what fixes it; supported values
pass. The action through ansible-playbook on this controller (no round trip: the host is never connected to)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ansible_collections.confidential.kubernetes.plugins.action.preflight import requires_ansible
from ansible_collections.confidential.kubernetes.plugins.module_utils._node.preflight import (
    controller_problems,
    node_problems,
    satisfies,
)

REPO = Path(__file__).resolve().parents[5]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))


@pytest.mark.parametrize(
    "version, specifier, expected",
    [
        ("2.17.0", ">=2.17.0", True),
        ("2.16.14", ">=2.17.0", False),
        ("2.20.1", ">=2.17.0,<2.21", True),
        ("2.21.0", ">=2.17.0,<2.21", False),
        ("2.19.0rc1", ">=2.19", True),
        ("2.18", "==2.18.0", True),
        ("2.18.1", "!=2.18.1", False),
    ],
)
def test_requires_ansible_comparisons(version, specifier, expected):
    assert satisfies(version, specifier) is expected


def test_unreadable_requirement_is_an_error():
    with pytest.raises(ValueError, match="cannot read the requirement '~=2.17'"):
        satisfies("2.18.0", "~=2.17")


def test_supported_controller_passes():
    assert controller_problems((3, 10, 0), "2.17.0", ">=2.17.0") == []
    assert controller_problems((3, 13, 1), "2.20.0", ">=2.17.0") == []


def test_old_controller_python_named_with_the_fix():
    (problem,) = controller_problems((3, 9, 18), "2.17.0", ">=2.17.0")
    assert "the controller runs Python 3.9.18" in problem and "Python 3.10 or newer" in problem
    assert "pip install -r requirements.txt" in problem


def test_old_ansible_core_named_with_the_requirement():
    (problem,) = controller_problems((3, 11, 2), "2.16.14", ">=2.17.0")
    assert "ansible-core 2.16.14" in problem and "requires ansible-core >=2.17.0 (meta/runtime.yml)" in problem


@pytest.mark.parametrize("machine", ["x86_64", "aarch64", "amd64", "arm64"])
def test_machines_the_versions_table_builds_for_pass(machine):
    assert node_problems("cp-0", machine, "3.11.2") == []


@pytest.mark.parametrize("machine", ["armv7l", "riscv64", "ppc64le", "s390x"])
def test_other_machines_are_named(machine):
    (problem,) = node_problems("worker-1", machine, "3.11.2")
    assert problem.startswith(f"worker-1: the node's architecture is {machine};")
    assert "aarch64, amd64, arm64, x86_64" in problem


def test_old_node_python_names_ansible_python_interpreter():
    (problem,) = node_problems("worker-1", "x86_64", "3.9.2")
    assert problem.startswith("worker-1: Ansible runs Python 3.9.2 on the node;")
    assert "ansible_python_interpreter" in problem and "node_python" in problem


def test_nothing_reported_nothing_checked():
    assert node_problems("cp-0", None, None) == []


def test_every_problem_at_once():
    assert len(node_problems("cp-0", "riscv64", "3.8.10")) == 2


def test_runtime_requirement_is_the_collections():
    runtime = yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())
    assert requires_ansible() == runtime["requires_ansible"]


def _play(tmp_path: Path, task: dict) -> subprocess.CompletedProcess:
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump([{"hosts": "unreachable-node", "gather_facts": False, "tasks": [task]}]))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"), ANSIBLE_NOCOLOR="1")
    # ssh to a TEST-NET address that is never dialled: the action needs no connection.
    return subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", "unreachable-node,", "-e", json.dumps({"ansible_host": "192.0.2.1"}), str(playbook)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def test_action_checks_this_controller_and_a_node_without_connecting(tmp_path):
    passed = _play(
        tmp_path, {"confidential.kubernetes.preflight": dict(node_architecture="x86_64", node_python_version="3.11.2")}
    )
    assert passed.returncode == 0 and "changed=0" in passed.stdout, passed.stdout + passed.stderr
    failed = _play(
        tmp_path, {"confidential.kubernetes.preflight": dict(node_architecture="riscv64", node_python_version="3.11.2")}
    )
    assert failed.returncode != 0
    assert (
        "unreachable-node: the node's architecture is riscv64" in failed.stdout
        and "Nothing was changed." in failed.stdout
    )
