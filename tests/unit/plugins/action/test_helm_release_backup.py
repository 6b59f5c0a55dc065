"""helm_release's action through ansible-playbook: state=absent backs up every CRD and custom resource to the controller
before it uninstalls, and a missing release or check mode writes and removes nothing. Real helm 3 and 4 against the real
API server on loopback (tests/control_plane.py); the controller is the host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helm_charts import make_chart

pytest.importorskip("kubernetes")

REPO = Path(__file__).resolve().parents[4]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
GADGET = """\
apiVersion: lab.example.com/v1
kind: Gadget
metadata: {name: blue, namespace: NAMESPACE}
spec: {size: 3}
"""


@pytest.fixture
def namespace(helm_binary) -> str:
    """A namespace of its own for each helm, on the session's one control plane."""
    return "action-absent-" + helm_binary.rsplit("-", 1)[1].replace(".", "-")


def play(tmp_path: Path, task: dict, *flags: str) -> tuple[subprocess.CompletedProcess, dict]:
    """One helm_release task on localhost; returns the run and the task's registered result."""
    result_file = tmp_path / "result.json"
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "localhost",
                    "gather_facts": False,
                    "tasks": [
                        dict(task, register="outcome", ignore_errors=True),
                        {
                            "ansible.builtin.copy": {"content": "{{ outcome | to_json }}", "dest": str(result_file)},
                            "check_mode": False,
                        },
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
    run = subprocess.run(
        [
            ANSIBLE_PLAYBOOK,
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            json.dumps(dict(ansible_python_interpreter=sys.executable)),
            str(playbook),
            *flags,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run, json.loads(result_file.read_text())


def helm_list(cluster, helm_binary, namespace) -> list[str]:
    every_status = ["--all"] if "helm-3" in helm_binary else []
    listed = subprocess.run(
        [
            helm_binary,
            "list",
            *every_status,
            "-n",
            namespace,
            "--kubeconfig",
            str(cluster.admin_kubeconfig),
            "-o",
            "json",
        ],
        capture_output=True,
        check=True,
        timeout=60,
    )
    return [release["name"] for release in json.loads(listed.stdout or b"[]")]


def test_absent_backs_up_then_uninstalls(kube_control_plane, helm_binary, namespace, tmp_path):
    cluster = kube_control_plane
    common = dict(
        release_name="web",
        release_namespace=namespace,
        kubeconfig=str(cluster.admin_kubeconfig),
        binary_path=helm_binary,
        wait_timeout="30s",
    )
    absent = dict(
        common, state="absent", backup_dir=str(tmp_path / "upgrades"), backup_kubeconfig=str(cluster.admin_kubeconfig)
    )
    # Installed through the action too, asynchronously as the upgrade role runs it.
    dummy, installed = play(
        tmp_path,
        {
            "confidential.kubernetes.helm_release": dict(
                common, chart_ref=str(make_chart(tmp_path, version="1.0.0")), create_namespace=True
            ),
            "async": 300,
            "poll": 1,
        },
    )
    assert installed["changed"] and installed["status"]["status"] == "deployed", installed
    gadget = GADGET.replace("NAMESPACE", namespace).encode()
    cluster.kubectl("apply", "-f", "-", stdin=gadget)
    try:
        dummy, checked = play(tmp_path, {"confidential.kubernetes.helm_release": absent}, "--check")
        assert checked["changed"] and checked["action"] == "uninstall" and "backup_path" not in checked, checked
        assert not (tmp_path / "upgrades").exists() and helm_list(cluster, helm_binary, namespace) == ["web"]

        unreachable = dict(absent, backup_kubeconfig=str(tmp_path / "missing.conf"))
        dummy, refused = play(tmp_path, {"confidential.kubernetes.helm_release": unreachable})
        assert refused["failed"] and refused["msg"].startswith(
            "backup failed, release web was not uninstalled: cannot load"
        )
        assert helm_list(cluster, helm_binary, namespace) == ["web"], "no backup, no uninstall"

        dummy, removed = play(tmp_path, {"confidential.kubernetes.helm_release": absent})
        assert (removed["changed"], removed["action"], removed["status"]) == (True, "uninstall", None), removed
        assert helm_list(cluster, helm_binary, namespace) == []
        backup = Path(removed["backup_path"])
        assert backup.parent == tmp_path / "upgrades" and backup.name.startswith("upgrade-")
        assert (
            yaml.safe_load((backup / "backups/crds/gadgets.lab.example.com.yaml").read_text())["kind"]
            == "CustomResourceDefinition"
        )
        saved = yaml.safe_load((backup / f"backups/lab.example.com/v1/{namespace}/Gadget/blue.yaml").read_text())
        assert (saved["metadata"]["name"], saved["spec"]) == ("blue", {"size": 3})
    finally:
        cluster.kubectl("delete", "-f", "-", stdin=gadget)

    run, again = play(tmp_path, {"confidential.kubernetes.helm_release": absent})
    assert (again["changed"], again["action"]) == (False, "none") and "backup_path" not in again, again
    assert len(list((tmp_path / "upgrades").iterdir())) == 1, "a missing release writes no backup"
