# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The init role's kubeadm_init options are built once (__init_kubeadm_args) and reach both of its kubeadm_init tasks,
the preflight and the init: run with real ansible-playbook in check mode on this host, a scripted kubeadm keeping each
configuration it is asked to validate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import KUBEADM_OPTIONS
from ansible_collections.confidential.kubernetes.plugins.modules import kubeadm_init

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
MODULE = "confidential.kubernetes.kubeadm_init"
# Options only the tasks themselves set: the mode, and what differs between the preflight and the init.
TASK_OWN_OPTIONS = {"preflight", "kubelet_binary_path", "ignore_preflight_errors"}


def _kubeadm_tasks() -> list[dict]:
    tasks = yaml.safe_load((REPO / "roles" / "init" / "tasks" / "initialise.yml").read_text())
    return [task for task in tasks if MODULE in task]


def test_both_tasks_take_their_options_from_the_one_dict():
    tasks = _kubeadm_tasks()
    assert len(tasks) == 2
    for task in tasks:
        assert task["module_defaults"] == {MODULE: "{{ __init_kubeadm_args }}"}, task["name"]
        assert set(task[MODULE]) <= TASK_OWN_OPTIONS, task["name"]


def test_the_options_init_kubeadm_extra_may_set_are_the_modules():
    defaults = yaml.safe_load((REPO / "roles" / "init" / "defaults" / "main.yml").read_text())
    # The module's own options and those of the doc fragment it shares with kubeadm_join.
    options = set(yaml.safe_load(kubeadm_init.DOCUMENTATION)["options"]) | set(KUBEADM_OPTIONS)
    # ca_key_algorithm has a role variable of its own; the preflight's options are the role's to set.
    assert set(defaults["__init_kubeadm_options"]) == options - {"ca_key_algorithm", "preflight", "kubelet_binary_path"}


@pytest.mark.skipif(os.path.exists("/etc/kubernetes/admin.conf"), reason="this host is a control plane")
def test_the_preflight_and_the_init_render_the_same_configuration_with_the_extras_winning(tmp_path):
    rendered = tmp_path / "rendered"
    rendered.mkdir()
    kubeadm, kubelet = tmp_path / "kubeadm", tmp_path / "kubelet"
    kubeadm.write_text(
        f'#!/bin/sh\ncase "$1" in\n  version) echo v1.31.0 ;;\n'
        f'  config) cp "$4" "{rendered}/$(ls {rendered} | wc -l).yaml" ;;\nesac\n'
    )
    kubelet.write_text("#!/bin/sh\necho Kubernetes v1.31.0\n")
    kubeadm.chmod(0o755)
    kubelet.chmod(0o755)
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "control_plane",
                    "gather_facts": False,
                    "check_mode": True,
                    "vars_files": [str(REPO / "roles" / "init" / "defaults" / "main.yml")],
                    "tasks": _kubeadm_tasks(),
                }
            ]
        )
    )
    (tmp_path / "hosts").write_text("[control_plane]\ncp-0 ansible_connection=local ansible_host=192.0.2.7\n")
    extra = dict(
        ansible_python_interpreter=sys.executable,
        init_kubelet_binary_path=str(kubelet),
        __init_state={"admin_kubeconfig_exists": True},
        init_kubeadm_extra={"binary_path": str(kubeadm), "pod_subnet": "10.1.0.0/16", "cluster_name": "lab"},
        kubernetes_image_repository="registry.example.com/k8s",
    )
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"),
        ANSIBLE_NOCOLOR="1",
        TMPDIR=str(tmp_path),
    )
    run = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(tmp_path / "hosts"), "-e", json.dumps(extra), str(playbook)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "[WARNING]" not in run.stdout + run.stderr
    preflight, init = ((rendered / f"{index}.yaml").read_text() for index in range(2))
    assert preflight == init
    init_configuration, cluster, kubelet_configuration = yaml.safe_load_all(init)
    assert init_configuration["localAPIEndpoint"]["advertiseAddress"] == "192.0.2.7"
    # The kubelet registers the address the inventory gives (ansible_host, an IP address here).
    assert init_configuration["nodeRegistration"]["kubeletExtraArgs"] == [{"name": "node-ip", "value": "192.0.2.7"}]
    assert cluster["networking"] == {"podSubnet": "10.1.0.0/16", "serviceSubnet": "10.96.0.0/12"}
    assert cluster["clusterName"] == "lab" and cluster["controlPlaneEndpoint"] == "192.0.2.7:6443"
    assert cluster["imageRepository"] == "registry.example.com/k8s"
    assert cluster["kubernetesVersion"] == "v1.31.0" and cluster["apiServer"]["certSANs"] == ["192.0.2.7"]
    assert kubelet_configuration["cgroupDriver"] == "systemd"
