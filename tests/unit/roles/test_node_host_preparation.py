# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node role's host preparation as the node_state probe and fix are asked for it (the role's defaults, rendered by
real ansible-playbook from an inventory's variables): IPv6 forwarding on a dual-stack or IPv6 cluster only, and the
sysctl file that sorts last and replaces the earlier one."""

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
IPV6_FORWARDING = "net.ipv6.conf.all.forwarding"


def _preparation(tmp_path: Path, **inventory) -> dict:
    shown = ["__node_stack_sysctls", "__node_stack_sysctl_file", "__node_stack_sysctl_files_replaced"]
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "localhost",
                    "gather_facts": False,
                    "vars_files": [str(REPO / "roles" / "node" / "defaults" / "main.yml")],
                    "tasks": [
                        {
                            "ansible.builtin.copy": {
                                "content": "{{ {" + ", ".join(f"'{name}': {name}" for name in shown) + "} | to_json }}",
                                "dest": str(tmp_path / "shown.json"),
                                "mode": "0644",
                            }
                        }
                    ],
                }
            ]
        )
    )
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"), ANSIBLE_NOCOLOR="1")
    run = subprocess.run(
        [
            ANSIBLE_PLAYBOOK,
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            json.dumps(dict(ansible_python_interpreter=sys.executable, **inventory)),
            str(playbook),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads((tmp_path / "shown.json").read_text())


@pytest.mark.parametrize(
    "inventory",
    [
        {"init_pod_subnet": "10.244.0.0/16,fd00:10:244::/56", "init_service_subnet": "10.96.0.0/12,fd00:10:96::/112"},
        {"init_pod_subnet": "fd00:10:244::/56", "init_service_subnet": "fd00:10:96::/112"},
        {"init_kubeadm_extra": {"service_subnet": "10.96.0.0/12,fd00:10:96::/112"}},
        {"node_stack_ipv6_forwarding": True},
    ],
    ids=["dual-stack", "ipv6", "dual-stack through init_kubeadm_extra", "explicit"],
)
def test_a_dual_stack_or_ipv6_cluster_forwards_ipv6(tmp_path, inventory):
    sysctls = _preparation(tmp_path, **inventory)["__node_stack_sysctls"]
    assert sysctls[IPV6_FORWARDING] == 1 and sysctls["net.ipv4.ip_forward"] == 1


@pytest.mark.parametrize(
    "inventory",
    [{}, {"init_pod_subnet": "10.244.0.0/16", "init_service_subnet": "10.96.0.0/12"}],
    ids=["defaults", "ipv4 subnets"],
)
def test_an_ipv4_cluster_keeps_its_sysctls_as_they_were(tmp_path, inventory):
    assert _preparation(tmp_path, **inventory)["__node_stack_sysctls"] == {
        "net.bridge.bridge-nf-call-iptables": 1,
        "net.bridge.bridge-nf-call-ip6tables": 1,
        "net.ipv4.ip_forward": 1,
    }


def test_no_sysctls_when_the_inventory_switches_them_off_even_on_a_dual_stack_cluster(tmp_path):
    shown = _preparation(tmp_path, node_stack_sysctl=False, init_pod_subnet="10.244.0.0/16,fd00:10:244::/56")
    assert shown["__node_stack_sysctls"] == {}


def test_the_sysctl_file_sorts_after_debians_sysctl_conf_and_replaces_the_earlier_name(tmp_path):
    shown = _preparation(tmp_path, node_stack_destdir="/stage")
    name = Path(shown["__node_stack_sysctl_file"]).name
    # systemd-sysctl applies the files by name: the last one sets a key. 99-sysctl.conf is Debian's /etc/sysctl.conf.
    assert sorted([name, "99-sysctl.conf", "99-kubernetes.conf", "50-default.conf"])[-1] == name
    assert shown["__node_stack_sysctl_file"] == f"/stage/etc/sysctl.d/{name}"
    assert shown["__node_stack_sysctl_files_replaced"] == ["/stage/etc/sysctl.d/99-kubernetes.conf"]
