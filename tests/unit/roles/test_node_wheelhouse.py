"""The node role's main entry point on this host: the environment from a controller-built wheelhouse, no index."""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/usr/bin/apt-get").exists(), reason="runs the role's apt task on this Debian host"
)


def _play(tmp_path: Path, **variables) -> subprocess.CompletedProcess:
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        yaml.safe_dump(
            [{"hosts": "localhost", "gather_facts": False, "roles": [{"role": "confidential.kubernetes.node"}]}]
        )
    )
    extra = dict(ansible_python_interpreter=sys.executable, node_venv=str(tmp_path / "node" / "venv"), **variables)
    controller_tmp = tmp_path / "controller-tmp"
    controller_tmp.mkdir(exist_ok=True)
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"),
        ANSIBLE_NOCOLOR="1",
        TMPDIR=str(controller_tmp),
    )
    return subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", "localhost,", "-c", "local", "-e", json.dumps(extra), str(playbook)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
        check=False,
    )


def _changed(stdout: str) -> int:
    return int(re.search(r"localhost\s+: ok=\d+\s+changed=(\d+)", stdout).group(1))


def test_a_node_python_the_controller_cannot_build_for_fails_naming_both(tmp_path):
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    other = next(
        (
            p
            for p in sorted(glob.glob("/root/.pyenv/versions/3.*/bin/python3")) + ["/usr/bin/python3.13"]
            if Path(p).exists() and f"/{here}." not in p and "python3.11" not in p
        ),
        None,
    )
    if other is None:
        pytest.skip("no Python of another version on this host")
    tag = subprocess.run(
        [other, "-c", "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    run = _play(tmp_path, node_python=other)
    assert run.returncode != 0
    assert (
        f"the node's Python is {tag} {os.uname().machine} but the controller's is cp{here.replace('.', '')}"
        in run.stdout
    )
    assert not (tmp_path / "node").exists()


def test_the_environment_comes_from_the_wheelhouse_and_a_rerun_changes_nothing(tmp_path):
    first = _play(tmp_path, node_python="/usr/bin/python3")
    assert first.returncode == 0, first.stdout + first.stderr
    wheels = {p.name.split("-")[0].lower() for p in (tmp_path / "node" / "wheelhouse").glob("*.whl")}
    assert {"cryptography", "grpcio", "protobuf", "pyyaml", "tpm2_pytss"} <= wheels
    assert "Push and unpack the wheelhouse" in first.stdout  # one archive per node, not one copy per wheel
    assert not list((tmp_path / "controller-tmp").glob("*.wheelhouse.tar")), "the controller's archive was left behind"
    check = subprocess.run(
        [
            str(tmp_path / "node/venv/bin/python"),
            "-c",
            "import tpm2_pytss, grpc, yaml; from cryptography.hazmat.primitives import hpke",
        ],
        check=False,
    )
    assert check.returncode == 0
    second = _play(tmp_path, node_python="/usr/bin/python3")
    assert second.returncode == 0 and _changed(second.stdout) == 0, second.stdout
