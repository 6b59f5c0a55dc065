# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drills' bring-up inventory: the docs' worked example with the lab's hosts, overriding only what the lab must."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests" / "drills"))

import quickstart  # noqa: E402 pylint: disable=wrong-import-position

LAB = {
    "all": {
        "vars": {
            "ansible_user": "root",
            "ansible_python_interpreter": "/opt/venv/bin/python",
            "ansible_ssh_private_key_file": "/lab/ssh/id_ed25519",
            "confidential_measurement_policy_file": "/lab/measurement-policy.yml",
            "confidential_ek_ca_file": "/lab/ca/ek-ca.pem",
            "confidential_state_disk": {"device": "/srv/state-disk.img", "state": "formatted"},
            "kubernetes_version": "1.20.2",
            "kubernetes_mirror_url": "http://10.77.0.1:8080",
        },
        "children": {
            "control_plane": {"hosts": {"cp-0": {"ansible_host": "10.77.0.10"}}},
            "workers": {
                "hosts": {"worker-0": {"ansible_host": "10.77.0.20"}, "worker-1": {"ansible_host": "10.77.0.21"}}
            },
            "cluster": {"children": {"control_plane": {}, "workers": {}}},
        },
    }
}


def test_the_worked_example_is_read_from_the_docs():
    example = quickstart.worked_example()
    assert set(quickstart.LAB_OVERRIDES) <= set(example["all"]["vars"])
    assert {"control_plane", "workers", "cluster"} <= set(example["all"]["children"])


def test_the_example_stands_except_the_overrides_and_the_lab_adds_only_its_own():
    example = quickstart.worked_example()
    inventory = quickstart.docs_inventory(copy.deepcopy(example), LAB)
    variables = inventory["all"]["vars"]
    for name, value in example["all"]["vars"].items():
        expected = LAB["all"]["vars"][name] if name in quickstart.LAB_OVERRIDES else value
        assert variables[name] == expected, name
    assert variables["confidential_measurement_policy_file"].startswith("{{ inventory_dir }}/")
    assert variables["ansible_ssh_private_key_file"] == "/lab/ssh/id_ed25519"
    assert "ansible_python_interpreter" not in variables
    hosts = inventory["all"]["children"]
    assert hosts["control_plane"]["hosts"] == {"cp-0": {"ansible_host": "10.77.0.10"}}
    assert list(hosts["workers"]["hosts"]) == ["worker-0", "worker-1"]
    assert hosts["cluster"] == example["all"]["children"]["cluster"]


def test_an_example_without_an_overridden_variable_is_refused(tmp_path):
    example = quickstart.worked_example()
    del example["all"]["vars"]["confidential_state_disk"]
    with pytest.raises(AssertionError, match="no longer sets confidential_state_disk"):
        quickstart.docs_inventory(example, LAB)


def test_a_page_without_the_worked_example_is_refused(tmp_path):
    page = tmp_path / "inventory.md"
    page.write_text("# The inventory\n\n## Worked example\n\nNo block here.\n\n## Next\n\n```yaml\na: 1\n```\n")
    with pytest.raises(AssertionError, match="no YAML block under '## Worked example'"):
        quickstart.worked_example(page)


def _site_output(*paths: str) -> str:
    return "".join(f"TASK [a task] ***\ntask path: {path}:7\nok: [cp-0]\n" for path in paths)


def test_site_tasks_must_come_from_the_collection_the_path_names(monkeypatch):
    monkeypatch.setenv("ANSIBLE_COLLECTIONS_PATH", "/tmp/installed:/other")
    root = "/tmp/installed/ansible_collections/confidential/kubernetes"
    output = _site_output(f"{root}/roles/init/tasks/main.yml", f"{root}/roles/node/tasks/main.yml")
    assert quickstart.collection_task_files(output) == 2

    source = str(REPO / "roles" / "join" / "tasks" / "main.yml")
    with pytest.raises(AssertionError, match=f"ran tasks from outside {root}/: \\['{source}'\\]"):
        quickstart.collection_task_files(output + _site_output(source))
    with pytest.raises(AssertionError, match="did not run the init role"):
        quickstart.collection_task_files(_site_output(f"{root}/roles/node/tasks/main.yml"))
    monkeypatch.delenv("ANSIBLE_COLLECTIONS_PATH")
    with pytest.raises(AssertionError, match="ANSIBLE_COLLECTIONS_PATH is not set"):
        quickstart.collection_task_files(output)
