# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every "needs a reset" message names the same next step (module_utils/_reset.py): the reset and remove_node
playbooks and their confirmation variable, never a list of manual commands."""

from __future__ import annotations

import ast
from pathlib import Path

from ansible_collections.confidential.kubernetes.plugins.module_utils._reset import NEEDS_RESET

REPO = Path(__file__).resolve().parents[4]


def _docstrings(tree: ast.AST) -> set[int]:
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))]
    return {
        id(node.body[0].value)
        for node in nodes
        if node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }


def test_the_next_step_names_the_playbooks_and_the_confirmation_variable():
    assert NEEDS_RESET.startswith("the node needs a reset: ")
    for text in (
        "confidential.kubernetes.reset -l <node>",
        "confidential.kubernetes.remove_node",
        "-e confirm_reset=yes-reset-<node>",
        "reboot",
    ):
        assert text in NEEDS_RESET


def test_no_message_spells_its_own_reset():
    own = []
    for path in sorted((REPO / "plugins").rglob("*.py")):
        if path.name == "_reset.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
                and "needs a reset" in node.value
            ):
                own.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}")
    assert not own, "messages that spell their own reset instead of using NEEDS_RESET:\n" + "\n".join(own)
