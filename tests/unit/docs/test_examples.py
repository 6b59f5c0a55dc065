# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every example an operator copies runs: each YAML snippet of README.md and docs/ parses; each playbook snippet and
each module's EXAMPLES block passes ansible-playbook --syntax-check (one batched run, then one run per snippet only
to name a failing one); each inventory snippet has the collection's groups; each Kubernetes version and Cilium chart
version a snippet names is a row of the versions table; each playbook a command names exists."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from ansible_collections.confidential.kubernetes.plugins.module_utils import _versions

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
TABLE = _versions.load_table()
VERSION_KEYS = ("kubernetes_version", "init_kubernetes_version", "node_kubernetes_version")
GROUP_KEYS = {"hosts", "children", "vars"}


@dataclass(frozen=True)
class Snippet:
    where: str  # path:line, what a failure names
    language: str
    text: str

    def __str__(self) -> str:
        return self.where


def _snippets() -> list[Snippet]:
    found = []
    for path in DOCS:
        text = path.read_text()
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(Snippet(f"{path.relative_to(REPO)}:{line}", match.group(1), match.group(2)))
    return found


def _module_examples() -> list[Snippet]:
    found = []
    for path in sorted((REPO / "plugins" / "modules").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if (
                isinstance(node, ast.Assign)
                and [getattr(t, "id", "") for t in node.targets] == ["EXAMPLES"]
                and isinstance(node.value, ast.Constant)
            ):
                found.append(Snippet(f"{path.relative_to(REPO)}:EXAMPLES", "yaml", node.value.value))
    return found


SNIPPETS = _snippets()
YAML_SNIPPETS = [s for s in SNIPPETS if s.language == "yaml"]
BASH_SNIPPETS = [s for s in SNIPPETS if s.language == "bash"]
EXAMPLES = _module_examples()


def _load(snippet: Snippet) -> object:
    """The snippet's YAML, or None when it does not parse (test_every_yaml_snippet_parses names it)."""
    try:
        return yaml.safe_load(snippet.text)
    except yaml.YAMLError:
        return None


def _is_play(item: object) -> bool:
    return isinstance(item, dict) and bool({"hosts", "import_playbook", "ansible.builtin.import_playbook"} & set(item))


def _is_inventory(doc: object) -> bool:
    return (
        isinstance(doc, dict)
        and bool(doc)
        and all(
            isinstance(group, dict) and set(group) <= GROUP_KEYS and set(group) & {"hosts", "children"}
            for group in doc.values()
        )
    )


def _playbooks() -> list[tuple[Snippet, list]]:
    """Playbook snippets as they are; task-list snippets and module examples inside a play."""
    plays = []
    for snippet in YAML_SNIPPETS + EXAMPLES:
        doc = _load(snippet)
        if isinstance(doc, list) and doc and all(_is_play(item) for item in doc):
            plays.append((snippet, doc))
        elif (
            isinstance(doc, list)
            and doc
            and all(isinstance(item, dict) and ("name" in item or "block" in item) for item in doc)
        ):
            plays.append((snippet, [{"name": str(snippet), "hosts": "cluster", "gather_facts": False, "tasks": doc}]))
    return plays


def _walk(doc: object):
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield key, value
            yield from _walk(value)
    elif isinstance(doc, list):
        for item in doc:
            yield from _walk(item)


def test_the_docs_have_examples_to_check():
    assert len(YAML_SNIPPETS) >= 25 and len(BASH_SNIPPETS) >= 15 and len(EXAMPLES) >= 20
    assert len(_playbooks()) >= 5 + len(EXAMPLES)


@pytest.mark.parametrize("snippet", YAML_SNIPPETS + EXAMPLES, ids=str)
def test_every_yaml_snippet_parses(snippet):
    try:
        yaml.safe_load(snippet.text)
    except yaml.YAMLError as exc:
        pytest.fail(f"{snippet}: {exc}")


@pytest.mark.parametrize("snippet", EXAMPLES, ids=str)
def test_every_module_example_is_a_task_list(snippet):
    doc = yaml.safe_load(snippet.text)
    assert isinstance(doc, list) and doc, f"{snippet}: not a list of tasks"
    assert all(isinstance(task, dict) and "name" in task for task in doc), f"{snippet}: a task without a name"


def _syntax_check(tmp_path: Path, files: list[Path]) -> subprocess.CompletedProcess:
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {
                        "control_plane": {"hosts": {"cp-0": None}},
                        "workers": {"hosts": {"worker-0": None}},
                        "cluster": {"children": {"control_plane": None, "workers": None}},
                    }
                }
            }
        )
    )
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"), ANSIBLE_NOCOLOR="1")
    return subprocess.run(
        [ANSIBLE_PLAYBOOK, "--syntax-check", "-i", str(inventory), *map(str, files)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )


def test_every_playbook_snippet_and_module_example_passes_the_syntax_check(tmp_path):
    files = []
    for number, (snippet, plays) in enumerate(_playbooks()):
        path = tmp_path / f"snippet-{number}.yml"
        path.write_text(yaml.safe_dump(plays, sort_keys=False))
        files.append((snippet, path))
    batch = _syntax_check(tmp_path, [path for unused_snippet, path in files])
    if batch.returncode == 0:
        return
    failing = []
    for snippet, path in files:
        run = _syntax_check(tmp_path, [path])
        if run.returncode != 0:
            failing.append(f"{snippet}: {(run.stderr or run.stdout).strip()[-800:]}")
    assert failing, f"the batch failed but no snippet alone does:\n{batch.stderr[-2000:]}"
    pytest.fail("snippets that fail ansible-playbook --syntax-check:\n" + "\n".join(failing))


INVENTORIES = [s for s in YAML_SNIPPETS if _is_inventory(_load(s))]


def _groups(doc: dict) -> dict:
    """Every group of an inventory (nested under children), by name."""
    groups = {}
    pending = list(doc.items())
    while pending:
        name, group = pending.pop()
        groups[name] = group or {}
        pending.extend(((group or {}).get("children") or {}).items())
    return groups


@pytest.mark.parametrize("snippet", INVENTORIES, ids=str)
def test_every_inventory_snippet_names_its_nodes_in_the_cluster_group(snippet):
    """Nodes outside cluster are not enrolled and the join service refuses them (docs/roles/join.md once lacked it)."""
    groups = _groups(_load(snippet))
    for name, group in groups.items():
        assert set(group) <= GROUP_KEYS, f"{snippet}: group {name} has {sorted(set(group) - GROUP_KEYS)}"
    nodes = [name for name in ("control_plane", "workers") if name in groups]
    if not nodes:
        return
    assert "cluster" in groups, f"{snippet}: groups {', '.join(nodes)} without a cluster group holding them"
    children = groups["cluster"].get("children") or {}
    assert set(nodes) <= set(children), f"{snippet}: cluster does not hold {sorted(set(nodes) - set(children))}"


# Pages whose playbooks install nothing on the nodes: their inventories need no kubernetes_version.
NO_STACK = ("docs/playbooks/reset.md", "docs/playbooks/remove_node.md", "docs/roles/reset.md")


@pytest.mark.parametrize(
    "snippet",
    [s for s in INVENTORIES if "confidential_state_disk" in s.text and not s.where.startswith(NO_STACK)],
    ids=str,
)
def test_every_cluster_inventory_snippet_pins_a_kubernetes_version(snippet):
    """A cluster inventory without kubernetes_version stops site.yml at the CNI check (docs/inventory.md once did)."""
    names = {key for key, unused_value in _walk(_load(snippet))}
    assert "kubernetes_version" in names, f"{snippet}: a cluster inventory without kubernetes_version"


def _versions_named() -> list[tuple[str, str]]:
    named = []
    for snippet in YAML_SNIPPETS + EXAMPLES:
        named += [
            (str(snippet), str(value))
            for key, value in _walk(_load(snippet))
            if key in VERSION_KEYS + ("kubernetes_version",) and "{{" not in str(value)
        ]
    for snippet in BASH_SNIPPETS:
        named += [(str(snippet), value) for value in re.findall(r"\bkubernetes_version=([\w.]+)", snippet.text)]
    return named


def test_every_kubernetes_version_a_snippet_names_is_a_row_of_the_table():
    named = _versions_named()
    assert named, "no snippet names a Kubernetes version"
    unknown = [f"{where}: {value}" for where, value in named if value.removeprefix("v") not in TABLE]
    assert not unknown, f"versions that are no row of the table ({', '.join(TABLE)}):\n" + "\n".join(unknown)


def test_every_cilium_chart_a_snippet_names_is_the_tables():
    cilium = {row["artifacts"]["cilium"]["version"] for row in TABLE.values()}
    named = [(str(s), v) for s in SNIPPETS + EXAMPLES for v in re.findall(r"cilium-(\d+\.\d+\.\d+)", s.text)]
    for snippet in YAML_SNIPPETS:
        named += [
            (str(snippet), str(release.get("chart_version", "")))
            for key, value in _walk(_load(snippet))
            if key == "upgrade_releases"
            for release in value or []
            if release.get("release_name") == "cilium"
        ]
    wrong = [f"{where}: {value}" for where, value in named if value.removeprefix("v") not in cilium]
    assert not wrong, f"Cilium charts that are not the table's ({', '.join(sorted(cilium))}):\n" + "\n".join(wrong)


def test_every_playbook_a_command_names_exists():
    shipped = {path.stem for path in (REPO / "playbooks").glob("*.yml")}
    named = [
        (str(s), name)
        for s in BASH_SNIPPETS
        for name in re.findall(r"confidential\.kubernetes\.(\w+)", s.text)
        if re.search(rf"ansible-playbook[^\n]*confidential\.kubernetes\.{name}\b", s.text)
    ]
    assert named
    missing = [f"{where}: {name}" for where, name in named if name not in shipped]
    assert not missing, "commands naming playbooks the collection does not ship:\n" + "\n".join(missing)
