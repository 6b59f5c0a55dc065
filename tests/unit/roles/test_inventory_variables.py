# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every variable an operator sets is checked: each one README.md and docs/ name belongs to an argument spec; each
inventory snippet of the docs passes the node role's inventory entry point; and every playbook's first check (the
second play of playbooks/groups.yml, run for real by ansible-playbook against local hosts) fails naming a typo in a
variable name or in a key of confidential_state_disk. The init role refuses a first control plane without a state
disk unless confidential_cluster_state_unencrypted gives it up."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
CHECK = REPO / "roles" / "node" / "tasks" / "inventory.yml"


def _check_vars(task_name: str) -> dict:
    """The vars of the inventory check's task of that name."""
    return next(task for task in yaml.safe_load(CHECK.read_text()) if task["name"] == task_name)["vars"]


_PREFIX_NAMES = _check_vars("Refuse variables with this collection's prefixes that no argument spec knows")[
    "__node_prefix_names"
]
PREFIXES = re.compile(f"({'|'.join(_PREFIX_NAMES)})_|remove_node$|confirm_reset$")
SPECS = {
    path.parent.parent.name: yaml.safe_load(path.read_text())["argument_specs"]
    for path in sorted(REPO.glob("roles/*/meta/argument_specs.yml"))
}
# A name in backquotes, a YAML key, or an extra variable on a command line.
NAMED = r"`([a-z][a-z0-9_]*[a-z0-9])\b|^\s*-?\s*([a-z][a-z0-9_]*[a-z0-9]):|-e ([a-z][a-z0-9_]*)="
KNOWN = {
    name for entry_points in SPECS.values() for spec in entry_points.values() for name in spec.get("options") or {}
}
INVENTORY_SPEC = SPECS["node"]["inventory"]["options"]
# Names with the collection's prefixes that the docs use for something other than a variable an operator sets:
# modules, playbooks, the roles' entry points and what the roles register for the operator to read.
NOT_VARIABLES = (
    {path.stem for path in (REPO / "plugins" / "modules").glob("*.py")}
    | {path.stem for path in (REPO / "playbooks").glob("*.yml")}
    | {name for entry_points in SPECS.values() for name in entry_points}
    | {"upgrade_results", "upgrade_backup_path", "upgrade_kubernetes_plan", "joinservice_api_host"}
)


def _named_in_docs() -> dict[str, str]:
    named = {}
    for path in DOCS:
        text = path.read_text()
        for match in re.finditer(NAMED, text, re.M):
            name = next(group for group in match.groups() if group)
            if PREFIXES.match(name) and name not in NOT_VARIABLES:
                named.setdefault(name, f"{path.relative_to(REPO)}:{text.count(chr(10), 0, match.start()) + 1}")
    return named


def test_the_docs_name_the_inventory_variables():
    named = _named_in_docs()
    for name in (
        "confidential_state_disk",
        "kubernetes_version",
        "measurements_golden_node",
        "confirm_reset",
        "kubernetes_mirror_url",
        "confidential_cni_values",
    ):
        assert name in named


def test_every_variable_the_docs_name_belongs_to_an_argument_spec():
    unknown = [f"{where}: {name}" for name, where in sorted(_named_in_docs().items()) if name not in KNOWN]
    assert not unknown, "variables the docs name that no argument spec knows:\n" + "\n".join(unknown)


def test_the_check_reads_every_role_s_argument_spec():
    check_vars = _check_vars("Read the options of the collection's argument specs")
    assert sorted(check_vars["__node_roles"]) == sorted(SPECS)


def _inventory_snippets() -> list[tuple[str, dict]]:
    snippets = []
    for path in DOCS:
        text = path.read_text()
        for match in re.finditer(r"^```yaml\n(.*?)^```", text, re.M | re.S):
            doc = yaml.safe_load(match.group(1))
            if isinstance(doc, dict) and "all" in doc and isinstance(doc["all"], dict):
                snippets.append((f"{path.relative_to(REPO)}:{text.count(chr(10), 0, match.start()) + 1}", doc))
    return snippets


def _variables(group: dict):
    """Every variable set at any level of an inventory: group vars, host vars, children's."""
    yield from (group.get("vars") or {}).items()
    for host in (group.get("hosts") or {}).values():
        yield from (host or {}).items()
    for child in (group.get("children") or {}).values():
        yield from _variables(child or {})


@pytest.mark.parametrize(
    ("where", "inventory"), _inventory_snippets(), ids=lambda value: value if isinstance(value, str) else ""
)
def test_every_inventory_snippet_passes_the_inventory_argument_spec(where, inventory):
    variables = dict(_variables(inventory["all"]))
    unknown = sorted(name for name in variables if PREFIXES.match(name) and name not in KNOWN)
    assert not unknown, f"{where}: {', '.join(unknown)} belong to no argument spec"
    checked = {name: value for name, value in variables.items() if name in INVENTORY_SPEC}
    result = ArgumentSpecValidator(INVENTORY_SPEC).validate(checked)
    assert not result.error_messages, f"{where}: {result.error_messages}"


def _run(tmp_path: Path, variables: dict, plays: list, *extra: str) -> subprocess.CompletedProcess:
    inventory = {
        "all": {
            "vars": {
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                "confidential_measurement_policy_file": str(tmp_path / "policy.yml"),
                **variables,
            },
            "children": {
                "control_plane": {"hosts": {"cp-0": {"ansible_host": "192.0.2.10"}}},
                "cluster": {"children": {"control_plane": {}}},
            },
        }
    }
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory, sort_keys=False))
    (tmp_path / "play.yml").write_text(yaml.safe_dump(plays))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"), ANSIBLE_NOCOLOR="1")
    return subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(tmp_path / "inventory.yml"), str(tmp_path / "play.yml"), *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


REACHED = {"hosts": "cluster", "gather_facts": False, "tasks": [{"ansible.builtin.debug": {"msg": "REACHED"}}]}
GROUPS = {"import_playbook": "confidential.kubernetes.groups"}
DISK = {"device": "/dev/vdb", "state": "mounted"}


def test_an_inventory_of_known_variables_passes_and_is_checked_once(tmp_path):
    run = _run(
        tmp_path,
        {"confidential_state_disk": DISK, "kubernetes_version": "1.36.4", "init_kubeadm_timeout": 60},
        [GROUPS, GROUPS, REACHED],
        "-e",
        "measurements_merge=true",
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "REACHED" in run.stdout
    checks = run.stdout.split("PLAY [Check the inventory's variables]")[1:]
    assert len(checks) == 2 and "skipping: no hosts matched" in checks[1]


@pytest.mark.parametrize(
    ("variables", "extra", "message"),
    [
        ({"kubernetes_verison": "1.36.4"}, [], "cp-0: kubernetes_verison is not a variable of confidential.kubernetes"),
        ({"confidential_state_dsk": DISK}, [], "cp-0: confidential_state_dsk is not a variable"),
        ({}, ["-e", "measurements_golden_nod=cp-0"], "cp-0: measurements_golden_nod is not a variable"),
        (
            {"confidential_state_disk": {"device": "/dev/vdb", "stat": "mounted"}},
            [],
            "confidential_state_disk.stat. Supported parameters include: device, mount_path, name",
        ),
        (
            {"confidential_state_disk": {"device": "/dev/vdb", "state": "mapped"}},
            [],
            "value of state must be one of: formatted, opened, mounted, got: mapped found in confidential_state_disk",
        ),
        ({"confidential_progress_interval": "often"}, [], "confidential_progress_interval"),
    ],
    ids=[
        "typo in a name",
        "typo in confidential_state_disk's name",
        "typo in an extra variable",
        "typo in a state disk key",
        "wrong state disk choice",
        "wrong type",
    ],
)
def test_a_wrong_variable_fails_naming_it_before_anything_runs(tmp_path, variables, extra, message):
    run = _run(tmp_path, variables, [GROUPS, REACHED], *extra)
    assert run.returncode != 0
    assert message in run.stdout, run.stdout
    assert "REACHED" not in run.stdout


def test_a_variable_of_another_role_is_left_alone_when_listed(tmp_path):
    variables = {"node_exporter_version": "1.8.0", "confidential_unchecked_variables": ["node_exporter_version"]}
    run = _run(tmp_path, variables, [GROUPS, REACHED])
    assert run.returncode == 0, run.stdout + run.stderr
    assert "REACHED" in run.stdout


INIT = {
    "hosts": "control_plane[0]",
    "gather_facts": False,
    "tasks": [{"ansible.builtin.include_role": {"name": "confidential.kubernetes.init"}}],
}


def test_the_first_control_plane_without_a_state_disk_is_refused_naming_the_opt_out(tmp_path):
    run = _run(tmp_path, {}, [INIT])
    assert run.returncode != 0
    assert "cp-0: the first control plane has no state disk (confidential_state_disk is not set)" in run.stdout
    assert "confidential_cluster_state_unencrypted: true. Nothing was changed." in run.stdout


def test_the_opt_out_passes_the_state_disk_check(tmp_path):
    run = _run(tmp_path, {"confidential_cluster_state_unencrypted": True}, [INIT], "--check")
    assert "the first control plane has no state disk" not in run.stdout
    assert "Refuse a first control plane without a state disk, unless explicitly given up" in run.stdout
