# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The join role's kubeadm_join options are built once (__join_kubeadm_args) and reach both of its kubeadm_join tasks,
the preflight and the join: run with real ansible-playbook on this host, a scripted kubeadm keeping each configuration
it is given."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import KUBEADM_OPTIONS
from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm.preflight import PREFLIGHT_OPTIONS
from ansible_collections.confidential.kubernetes.plugins.modules import kubeadm_join

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
MODULE = "confidential.kubernetes.kubeadm_join"
# Options only the tasks themselves set: the preflight's, and what the join takes from the ticket.
TASK_OWN_OPTIONS = {
    "Check versions and kubeadm's join preflight before the node lock": {
        "preflight",
        "kubernetes_version",
        "kubelet_binary_path",
    },
    "Join with kubeadm": {"api_server_endpoint", "ca_cert_hashes", "node_name", "ignore_preflight_errors"},
}
PIN = "sha256:" + "ab" * 32


def _kubeadm_tasks() -> list[dict]:
    tasks = yaml.safe_load((REPO / "roles" / "join" / "tasks" / "joining.yml").read_text())
    return [task for task in tasks if MODULE in task]


def test_both_tasks_take_their_options_from_the_one_dict():
    tasks = _kubeadm_tasks()
    assert [task["name"] for task in tasks] == list(TASK_OWN_OPTIONS)
    for task in tasks:
        assert task["module_defaults"] == {MODULE: "{{ __join_kubeadm_args }}"}, task["name"]
        assert set(task[MODULE]) <= TASK_OWN_OPTIONS[task["name"]], task["name"]


def test_the_options_join_kubeadm_extra_may_set_are_the_modules():
    defaults = yaml.safe_load((REPO / "roles" / "join" / "defaults" / "main.yml").read_text())
    options = set(yaml.safe_load(kubeadm_join.DOCUMENTATION)["options"]) | set(KUBEADM_OPTIONS) | set(PREFLIGHT_OPTIONS)
    # The preflight's options are the role's to set (join_kubernetes_version, join_kubelet_binary_path).
    assert set(defaults["__join_kubeadm_options"]) == options - {
        "preflight",
        "kubernetes_version",
        "kubelet_binary_path",
    }


def _run(tmp_path: Path, **extra) -> tuple[subprocess.CompletedProcess, Path]:
    rendered = tmp_path / "rendered"
    rendered.mkdir()
    kubeadm, kubelet = tmp_path / "kubeadm", tmp_path / "kubelet"
    # Keeps every configuration it is given, in order, and what it was asked.
    kubeadm.write_text(
        f'#!/bin/sh\necho "$*" >> "{tmp_path}/calls"\ncase "$1" in\n  version) echo v1.31.0 ;;\n'
        f'  *) while [ "$#" -gt 0 ]; do [ "$1" = --config ] && cp "$2" "{rendered}/$(ls {rendered} | wc -l).yaml";'
        f" shift; done ;;\nesac\n"
    )
    kubelet.write_text("#!/bin/sh\necho Kubernetes v1.31.0\n")
    kubeadm.chmod(0o755)
    kubelet.chmod(0o755)
    (tmp_path / "token").write_text("abcdef.0123456789abcdef\n")
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "control_plane",
                    "gather_facts": False,
                    "vars_files": [str(REPO / "roles" / "join" / "defaults" / "main.yml")],
                    "tasks": _kubeadm_tasks(),
                }
            ]
        )
    )
    (tmp_path / "hosts").write_text("[control_plane]\ncp-1 ansible_connection=local ansible_host=192.0.2.8\n")
    variables = dict(
        ansible_python_interpreter=sys.executable,
        join_kubelet_binary_path=str(kubelet),
        join_kubernetes_version="v1.31.0",
        kubernetes_api_vip="192.0.2.100",
        __join_standing={"node_state": "rebooted"},
        __join_ticket={
            "joined": True,
            "api_server_endpoint": "192.0.2.100:6443",
            "ca_cert_hashes": [PIN],
            "node_name": "granted-cp-1",
        },
        join_kubeadm_extra={
            "binary_path": str(kubeadm),
            "token_file": str(tmp_path / "token"),
            "cri_socket": "unix:///run/containerd/containerd.sock",
            "bind_port": 8443,
        },
    )
    variables.update(extra)
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"),
        ANSIBLE_NOCOLOR="1",
        TMPDIR=str(tmp_path),
    )
    run = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(tmp_path / "hosts"), "-e", json.dumps(variables), str(playbook)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    return run, rendered


@pytest.mark.skipif(
    os.path.exists("/etc/kubernetes/kubelet.conf") or os.path.exists("/etc/kubernetes/admin.conf"),
    reason="this host is a node of a cluster",
)
def test_the_preflight_and_the_join_get_the_same_options_with_the_extras_winning(tmp_path):
    run, rendered = _run(tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "[WARNING]" not in run.stdout + run.stderr
    # The preflight's configuration, then the join's (validated, then joined with).
    preflight, validated, joined = (yaml.safe_load((rendered / f"{index}.yaml").read_text()) for index in range(3))
    assert validated == joined
    assert preflight["nodeRegistration"] == {"name": "cp-1", "criSocket": "unix:///run/containerd/containerd.sock"}
    # The kubelet registers the address the inventory gives (ansible_host, an IP address here).
    assert joined["nodeRegistration"] == {
        "name": "granted-cp-1",
        "criSocket": "unix:///run/containerd/containerd.sock",
        "kubeletExtraArgs": [{"name": "node-ip", "value": "192.0.2.8"}],
    }
    endpoint = {"advertiseAddress": "192.0.2.8", "bindPort": 8443}
    assert preflight["controlPlane"]["localAPIEndpoint"] == joined["controlPlane"]["localAPIEndpoint"] == endpoint
    assert joined["discovery"]["bootstrapToken"]["apiServerEndpoint"] == "192.0.2.100:6443"
    assert joined["discovery"]["bootstrapToken"]["caCertHashes"] == [PIN]
    calls = (tmp_path / "calls").read_text().splitlines()
    # With kube-vip its manifest is in place when kubeadm join looks, not yet when the preflight does.
    (preflight_call,) = (call for call in calls if call.startswith("join phase preflight"))
    (join_call,) = (call for call in calls if call.startswith("join --config"))
    assert "--ignore-preflight-errors" not in preflight_call
    assert join_call.endswith(" --ignore-preflight-errors=DirAvailable--etc-kubernetes-manifests")
    assert not (tmp_path / "token").exists()


@pytest.mark.skipif(os.path.exists("/etc/kubernetes/kubelet.conf"), reason="this host is a node of a cluster")
def test_a_worker_advertises_nothing_and_the_extras_win_over_the_ticket(tmp_path):
    run, rendered = _run(
        tmp_path,
        join_control_plane=False,
        join_kubeadm_extra={
            "binary_path": str(tmp_path / "kubeadm"),
            "token_file": str(tmp_path / "token"),
            "node_name": "worker-9",
            "api_server_endpoint": "192.0.2.1:6443",
        },
    )
    assert run.returncode == 0, run.stdout + run.stderr
    preflight, dummy, joined = (yaml.safe_load((rendered / f"{index}.yaml").read_text()) for index in range(3))
    assert "controlPlane" not in preflight and "controlPlane" not in joined
    assert preflight["nodeRegistration"]["name"] == joined["nodeRegistration"]["name"] == "worker-9"
    assert joined["discovery"]["bootstrapToken"]["apiServerEndpoint"] == "192.0.2.1:6443"


@pytest.mark.skipif(os.path.exists("/etc/kubernetes/kubelet.conf"), reason="this host is a node of a cluster")
@pytest.mark.parametrize(
    "variables,expected",
    [
        ({"ansible_host": "worker-1.example.org"}, []),
        ({"ansible_host": "2001:db8::8"}, [{"name": "node-ip", "value": "2001:db8::8"}]),
        (
            {"ansible_host": "worker-1.example.org", "kubernetes_node_ip": "198.51.100.8"},
            [{"name": "node-ip", "value": "198.51.100.8"}],
        ),
        (
            {"kubelet_extra_args": {"node-labels": "pool=gpu"}},
            [{"name": "node-ip", "value": "192.0.2.8"}, {"name": "node-labels", "value": "pool=gpu"}],
        ),
        ({"kubelet_extra_args": {"node-ip": "10.0.0.8"}}, [{"name": "node-ip", "value": "10.0.0.8"}]),
    ],
    ids=["a host name", "an IPv6 address", "kubernetes_node_ip", "other kubelet flags", "the extras' node-ip wins"],
)
def test_the_kubelet_gets_the_inventorys_address_as_its_node_ip(tmp_path, variables, expected):
    variables = dict(variables)
    kubelet_extra_args = variables.pop("kubelet_extra_args", None)
    extra = {"binary_path": str(tmp_path / "kubeadm"), "token_file": str(tmp_path / "token")}
    if kubelet_extra_args:
        extra["kubelet_extra_args"] = kubelet_extra_args
    run, rendered = _run(tmp_path, join_control_plane=False, join_kubeadm_extra=extra, **variables)
    assert run.returncode == 0, run.stdout + run.stderr
    # The preflight's configuration has no kubelet flags (kubeadm's join preflight starts no kubelet).
    validated, joined = (yaml.safe_load((rendered / f"{index}.yaml").read_text()) for index in (1, 2))
    for configuration in (validated, joined):
        assert configuration["nodeRegistration"].get("kubeletExtraArgs", []) == expected
