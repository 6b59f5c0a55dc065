"""The optional kube-vip static pod: off by default, and with kubernetes_api_vip a manifest kube-vip can run (real Ansible,
rendering only: the lab's kubelet stand-in cannot run kube-vip)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))


def installed_kubeadm(tmp_path: Path, version: str) -> str:
    """A kubeadm that answers ``version -o short`` as the installed one of ``version`` would."""
    kubeadm = tmp_path / "kubeadm"
    kubeadm.write_text(f'#!/bin/sh\n[ "$*" = "version -o short" ] && echo {version}\n')
    kubeadm.chmod(0o755)
    return str(kubeadm)


def render(tmp_path: Path, **extra) -> subprocess.CompletedProcess:
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "Render",
                    "ansible.builtin.include_role": {"name": "confidential.kubernetes.join", "tasks_from": "kube_vip"},
                }
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
    extra = dict(
        ansible_python_interpreter=sys.executable, join_kube_vip_manifest_dir=str(tmp_path / "manifests"), **extra
    )
    return subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", "localhost,", "-c", "local", "-e", json.dumps(extra), str(tmp_path / "play.yml")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def test_off_by_default(tmp_path):
    run = render(tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert not (tmp_path / "manifests").exists()


def test_with_a_vip_the_manifest_is_a_pinned_static_pod_for_it(tmp_path):
    run = render(
        tmp_path,
        kubernetes_api_vip="192.0.2.100",
        kubernetes_api_endpoint="192.0.2.100:8443",
        kube_vip_interface="eth1",
        kubernetes_version="v1.31.4",
        join_kube_vip_before_init=True,
        join_kube_vip_kubeadm=installed_kubeadm(tmp_path, "v1.31.4"),
    )
    assert run.returncode == 0, run.stdout + run.stderr
    manifest = tmp_path / "manifests" / "kube-vip.yaml"
    assert oct(manifest.stat().st_mode & 0o777) == "0o600"
    pod = yaml.safe_load(manifest.read_text())
    assert (pod["kind"], pod["metadata"]["namespace"], pod["spec"]["hostNetwork"]) == ("Pod", "kube-system", True)
    container = pod["spec"]["containers"][0]
    image, tag = container["image"].rsplit(":", 1)
    assert image == "ghcr.io/kube-vip/kube-vip" and tag.startswith("v") and tag != "latest"
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["address"] == "192.0.2.100" and env["port"] == "8443" and env["vip_interface"] == "eth1"
    assert env["cp_enable"] == "true" and env["vip_leaderelection"] == "true"
    # The first control plane of Kubernetes >= 1.29: admin.conf has no rights until the API runs.
    assert pod["spec"]["volumes"][0]["hostPath"]["path"] == "/etc/kubernetes/super-admin.conf"
    assert set(container["securityContext"]["capabilities"]["add"]) == {"NET_ADMIN", "NET_RAW"}

    again = render(
        tmp_path,
        kubernetes_api_vip="192.0.2.100",
        kubernetes_api_endpoint="192.0.2.100:8443",
        kube_vip_interface="eth1",
        kubernetes_version="v1.31.4",
        join_kube_vip_before_init=True,
        join_kube_vip_kubeadm=installed_kubeadm(tmp_path, "v1.31.4"),
    )
    assert "changed=0" in again.stdout
    # After kubeadm init the init role renders it again for admin.conf, and a re-run keeps that.
    for dummy in range(2):
        after = render(
            tmp_path,
            kubernetes_api_vip="192.0.2.100",
            kubernetes_api_endpoint="192.0.2.100:8443",
            kube_vip_interface="eth1",
            kubernetes_version="v1.31.4",
            join_kube_vip_before_init=False,
        )
        assert (
            yaml.safe_load(manifest.read_text())["spec"]["volumes"][0]["hostPath"]["path"]
            == "/etc/kubernetes/admin.conf"
        )
    assert "changed=0" in after.stdout


def test_joining_control_planes_and_older_versions_use_admin_conf_and_port_6443(tmp_path):
    run = render(tmp_path, kubernetes_api_vip="192.0.2.100", kubernetes_version="1.20.2")
    assert run.returncode == 0, run.stdout + run.stderr
    pod = yaml.safe_load((tmp_path / "manifests" / "kube-vip.yaml").read_text())
    env = {item["name"]: item["value"] for item in pod["spec"]["containers"][0]["env"]}
    assert env["port"] == "6443" and "vip_interface" not in env
    assert pod["spec"]["volumes"][0]["hostPath"]["path"] == "/etc/kubernetes/admin.conf"


def test_the_entry_point_refuses_a_wrong_option_before_rendering(tmp_path):
    run = render(tmp_path, kubernetes_api_vip="192.0.2.100", join_kube_vip_before_init="sometimes")
    assert run.returncode != 0
    assert "join_kube_vip_before_init" in run.stdout and not (tmp_path / "manifests").exists()


@pytest.mark.parametrize(
    "kubernetes_version,installed,kubeconfig",
    [
        ("1.31.4", "v1.28.15", "admin.conf"),
        ("1.28.15", "v1.29.0", "super-admin.conf"),
        ("", "v1.30.2", "super-admin.conf"),
    ],
    ids=["kubernetes_version newer", "kubernetes_version older", "no kubernetes_version"],
)
def test_the_first_control_planes_kubeconfig_follows_the_installed_kubeadm(
    tmp_path, kubernetes_version, installed, kubeconfig
):
    run = render(
        tmp_path,
        kubernetes_api_vip="192.0.2.100",
        kubernetes_version=kubernetes_version,
        join_kube_vip_before_init=True,
        join_kube_vip_kubeadm=installed_kubeadm(tmp_path, installed),
    )
    assert run.returncode == 0, run.stdout + run.stderr
    pod = yaml.safe_load((tmp_path / "manifests" / "kube-vip.yaml").read_text())
    assert pod["spec"]["volumes"][0]["hostPath"]["path"] == f"/etc/kubernetes/{kubeconfig}"


def test_a_kubeadm_that_cannot_tell_its_version_fails_before_rendering(tmp_path):
    run = render(
        tmp_path,
        kubernetes_api_vip="192.0.2.100",
        join_kube_vip_before_init=True,
        join_kube_vip_kubeadm=str(tmp_path / "no-kubeadm"),
    )
    assert run.returncode != 0 and "no-kubeadm" in run.stdout
    assert not (tmp_path / "manifests" / "kube-vip.yaml").exists()
