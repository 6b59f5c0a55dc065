"""The playbooks' inventory handling, run for real by ansible-playbook against local hosts: kubespray's group names
are accepted, and control planes without an IP address to advertise are refused before anything runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
# The playbooks an operator runs; the ones only imported by them are left out (prompt_shares.yml, imported by recover,
# restore and split_secrets after groups.yml, targets only localhost).
IMPORTED_ONLY = ("groups.yml", "addresses.yml", "prompt_shares.yml")
PLAYBOOKS = sorted(p for p in (REPO / "playbooks").glob("*.yml") if p.name not in IMPORTED_ONLY)


def _run(tmp_path: Path, inventory: dict, plays: list) -> subprocess.CompletedProcess:
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory, sort_keys=False))
    (tmp_path / "play.yml").write_text(yaml.safe_dump(plays))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"), ANSIBLE_NOCOLOR="1")
    return subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(tmp_path / "inventory.yml"), str(tmp_path / "play.yml")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def _inventory(groups: dict) -> dict:
    return {
        "all": {
            "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
            "children": groups,
        }
    }


KUBESPRAY = _inventory(
    {
        "kube_control_plane": {
            "hosts": {"cp-b": {"ansible_host": "192.0.2.11"}, "cp-a": {"ansible_host": "192.0.2.10"}}
        },
        # kubespray lists schedulable control planes under kube_node too: they stay control planes only.
        "kube_node": {"hosts": {"cp-b": {}, "w-1": {"ansible_host": "192.0.2.20"}}},
        "k8s_cluster": {"children": {"kube_control_plane": {}, "kube_node": {}}},
    }
)

REPORT = {
    "hosts": "control_plane[0]",
    "gather_facts": False,
    "tasks": [
        {
            "ansible.builtin.debug": {
                "msg": "GROUPS {{ groups['control_plane'] | join(',') }} {{ groups['workers'] | join(',') }}"
                " {{ groups['cluster'] | join(',') }}"
            }
        }
    ],
}


def test_a_kubespray_inventory_fills_the_collection_groups_in_order(tmp_path):
    run = _run(tmp_path, KUBESPRAY, [{"import_playbook": "confidential.kubernetes.groups"}, REPORT])
    assert run.returncode == 0, run.stdout + run.stderr
    assert "ok: [cp-b]" in run.stdout.split("TASK [ansible.builtin.debug]")[1]
    assert "GROUPS cp-b,cp-a w-1 cp-b,cp-a,w-1" in run.stdout


def test_an_inventory_with_the_collection_groups_is_left_alone(tmp_path):
    inventory = _inventory(
        {
            "control_plane": {"hosts": {"cp-0": {"ansible_host": "192.0.2.10"}}},
            "workers": {"hosts": {"w-0": {"ansible_host": "192.0.2.20"}}},
            "cluster": {"children": {"control_plane": {}, "workers": {}}},
        }
    )
    run = _run(tmp_path, inventory, [{"import_playbook": "confidential.kubernetes.groups"}, REPORT])
    assert run.returncode == 0, run.stdout + run.stderr
    assert "GROUPS cp-0 w-0 cp-0,w-0" in run.stdout


def test_imported_again_in_the_same_run_the_group_and_address_plays_match_no_host(tmp_path):
    """site.yml imports groups.yml and addresses.yml once per playbook it imports: only the first import does work."""
    plays = [
        {"import_playbook": "confidential.kubernetes.groups"},
        {"import_playbook": "confidential.kubernetes.addresses"},
        {"import_playbook": "confidential.kubernetes.groups"},
        {"import_playbook": "confidential.kubernetes.addresses"},
        REPORT,
    ]
    run = _run(tmp_path, KUBESPRAY, plays)
    assert run.returncode == 0, run.stdout + run.stderr
    sections = run.stdout.split("PLAY [")[1:]
    assert [section.split("]")[0] for section in sections][:6] == [
        "Accept kubespray's group names",
        "Check the inventory's variables",
        "Check the control planes' addresses",
    ] * 2
    assert ["skipping: no hosts matched" in section for section in sections[:6]] == [False] * 3 + [True] * 3, run.stdout
    assert "ok: [cp-b]" in sections[2] and "ok: [cp-a]" in sections[2]
    assert "GROUPS cp-b,cp-a w-1 cp-b,cp-a,w-1" in run.stdout


@pytest.mark.parametrize("playbook", PLAYBOOKS, ids=lambda p: p.name)
def test_every_playbook_accepts_kubespray_group_names_first(playbook):
    plays = yaml.safe_load(playbook.read_text())
    assert plays[0].get("ansible.builtin.import_playbook") == "groups.yml"


@pytest.mark.parametrize("playbook", ["site.yml", "init.yml", "join.yml"])
def test_site_init_and_join_check_the_addresses_before_any_node_play(playbook):
    plays = yaml.safe_load((REPO / "playbooks" / playbook).read_text())
    assert plays[1].get("ansible.builtin.import_playbook") == "addresses.yml"


@pytest.mark.parametrize(
    ("host", "message"),
    [
        ({}, 'cp-0: ansible_host is not set, so init_advertise_address defaults to the host name "cp-0"'),
        (
            {"ansible_host": "cp0.example.com"},
            'cp-0: init_advertise_address (from ansible_host) is "cp0.example.com", not an IP address; set ansible_host',
        ),
        (
            {"ansible_host": "192.0.2.10", "init_advertise_address": "api.example.com"},
            'cp-0: init_advertise_address is "api.example.com", not an IP address; set init_advertise_address',
        ),
        ({"ansible_host": "192.0.2.300"}, 'init_advertise_address (from ansible_host) is "192.0.2.300", not an IP'),
    ],
)
def test_a_control_plane_without_an_ip_address_is_refused_naming_host_and_variable(tmp_path, host, message):
    inventory = _inventory({"kube_control_plane": {"hosts": {"cp-0": host, "cp-1": {"ansible_host": "fd00::11"}}}})
    run = _run(
        tmp_path,
        inventory,
        [
            {"import_playbook": "confidential.kubernetes.groups"},
            {"import_playbook": "confidential.kubernetes.addresses"},
            {"hosts": "cluster", "gather_facts": False, "tasks": [{"ansible.builtin.debug": {"msg": "REACHED"}}]},
        ],
    )
    assert run.returncode != 0
    assert message in run.stdout
    assert "REACHED" not in run.stdout and "fatal: [cp-1]" not in run.stdout


def test_join_advertise_address_is_checked_on_the_further_control_planes(tmp_path):
    inventory = _inventory(
        {
            "control_plane": {
                "hosts": {"cp-0": {"ansible_host": "192.0.2.10"}, "cp-1": {"ansible_host": "cp1.example.com"}}
            }
        }
    )
    run = _run(tmp_path, inventory, [{"import_playbook": "confidential.kubernetes.addresses"}])
    assert run.returncode != 0
    assert 'cp-1: join_advertise_address (from ansible_host) is "cp1.example.com"' in run.stdout
    assert "fatal: [cp-0]" not in run.stdout
