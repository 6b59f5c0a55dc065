# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Roles and playbooks use a role only through its front doors: an entry point its argument spec declares, given only
that entry point's options, never another role's private (__-prefixed) variables."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
TASK_FILES = sorted(
    [*REPO.glob("roles/*/tasks/*.yml"), *REPO.glob("playbooks/*.yml"), *REPO.glob("extensions/molecule/*/*.yml")]
)
SPECS = {
    path.parent.parent.name: yaml.safe_load(path.read_text())["argument_specs"]
    for path in REPO.glob("roles/*/meta/argument_specs.yml")
}
INCLUDES = ("ansible.builtin.include_role", "ansible.builtin.import_role")
# Keywords of a play's role entry, which are no role variables.
ROLE_KEYWORDS = {"role", "name", "when", "tags", "vars", "become", "delegate_to"}


def _nodes(node):
    """Every task, block, play and role entry of a tasks file or playbook."""
    if isinstance(node, list):
        for item in node:
            yield from _nodes(item)
    elif isinstance(node, dict):
        yield node
        for key in ("tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue", "always", "roles"):
            yield from _nodes(node.get(key))


def _uses(path: Path):
    """(role, entry point, variables given) for each use of one of the collection's roles in ``path``."""
    for node in _nodes(yaml.safe_load(path.read_text())):
        include = next((node[key] for key in INCLUDES if key in node), None)
        if include is not None:
            yield include["name"].rpartition(".")[2], include.get("tasks_from", "main"), set(node.get("vars") or {})
        elif isinstance(node.get("role"), str) and node["role"].startswith("confidential.kubernetes."):
            yield node["role"].rpartition(".")[2], "main", set(node) - ROLE_KEYWORDS | set(node.get("vars") or {})


def _owner(path: Path) -> str | None:
    return path.parts[-3] if path.parts[-2] == "tasks" else None


@pytest.mark.parametrize("path", TASK_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_each_use_of_a_role_is_a_declared_entry_point_given_its_options(path):
    for role, entry, variables in _uses(path):
        if role == _owner(path):
            continue
        assert entry in SPECS[role], f"{path.name}: {role} has no entry point {entry} in its argument spec"
        undeclared = variables - set(SPECS[role][entry].get("options") or {}) - {"ansible_python_interpreter"}
        assert not undeclared, f"{path.name}: {role}'s entry point {entry} has no options {sorted(undeclared)}"


def _private_owner(name: str) -> str | None:
    """The role whose private variable ``name`` is (the longest role prefix: __joinservice_ is not join's)."""
    return max((role for role in SPECS if name.startswith(f"__{role}_")), key=len, default=None)


@pytest.mark.parametrize("path", TASK_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_role_sets_another_role_s_private_variables(path):
    names = [
        name
        for node in _nodes(yaml.safe_load(path.read_text()))
        for name in [*(node.get("vars") or {}), *(node.get("ansible.builtin.set_fact") or {})]
    ]
    assert not [name for name in names if _private_owner(name) not in (None, _owner(path))]


def test_the_checks_see_the_uses():
    uses = {(role, entry) for path in TASK_FILES for role, entry, dummy in _uses(path)}
    assert {("join", "state_disk"), ("join", "kube_vip"), ("reset", "confirm"), ("reset", "main")} <= uses
