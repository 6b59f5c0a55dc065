"""Every module's documentation, as ansible-doc resolves it with its fragments, agrees with the argument spec the
module really validates: option names, type, required, default, choices, elements and aliases, suboptions
recursively. ansible-test's validate-modules checks only the spec a module's main() hands to AnsibleModule; this also
checks the specs action plugins validate (the options of the modules that are only documentation), and that an option
spec shared by several modules (the same dict from module_utils or plugin_utils, at the same place) is documented once,
in a doc fragment, and every fragment section is used."""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from unittest import mock

import pytest
import yaml
from ansible.module_utils import basic
from ansible.plugins.action import ActionBase

REPO = Path(__file__).resolve().parents[4]
COLLECTION = "confidential.kubernetes"
PACKAGE = "ansible_collections.confidential.kubernetes.plugins"
MODULES = sorted(p.stem for p in (REPO / "plugins" / "modules").glob("*.py"))
FIELDS = ("type", "required", "default", "choices", "elements", "aliases")


class _Validated(Exception):
    """Raised where a module or an action would validate its arguments, carrying what it validates them against."""


def _raise_spec(self, *args, **kwargs):
    raise _Validated(kwargs["argument_spec"])


def _action_module(name: str):
    """The module's action plugin when it validates the task's arguments itself, else None."""
    path = REPO / "plugins" / "action" / f"{name}.py"
    if not path.exists() or "validate_argument_spec" not in path.read_text():
        return None
    return importlib.import_module(f"{PACKAGE}.action.{name}")


def argument_specs(name: str) -> dict[str, dict]:
    """The argument specs a task of module ``name`` is validated against: "module" (what main() gives AnsibleModule)
    and "action" (what its action plugin validates on the controller), each present when there is one."""
    specs = {}
    module = importlib.import_module(f"{PACKAGE}.modules.{name}")
    if hasattr(module, "main"):
        with mock.patch.object(basic.AnsibleModule, "__init__", _raise_spec), pytest.raises(_Validated) as validated:
            module.main()
        specs["module"] = validated.value.args[0]
    action = _action_module(name)
    if action is not None:
        task = mock.MagicMock(args={}, async_val=0, check_mode=False)
        plugin = action.ActionModule(
            task=task,
            connection=mock.MagicMock(),
            play_context=mock.MagicMock(),
            loader=mock.MagicMock(),
            templar=mock.MagicMock(),
            shared_loader_obj=None,
        )
        with (
            mock.patch.object(ActionBase, "validate_argument_spec", _raise_spec),
            pytest.raises(_Validated) as validated,
        ):
            plugin.run(task_vars={})
        specs["action"] = validated.value.args[0]
    assert specs, f"{name}: neither main() nor an action plugin validates its arguments"
    return specs


@pytest.fixture(scope="module")
def resolved_docs() -> dict[str, dict]:
    """Every module's DOCUMENTATION with its fragments merged in, by ansible-doc itself."""
    # Where the tests import the collection from (conftest), so that ansible-doc reads this very tree.
    collections = Path(list(importlib.import_module(PACKAGE).__path__)[0]).parents[3]
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(collections), ANSIBLE_NOCOLOR="1")
    run = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-doc")), "--json", "-t", "module"]
        + [f"{COLLECTION}.{name}" for name in MODULES],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    return {name.rsplit(".", 1)[1]: entry["doc"] for name, entry in json.loads(run.stdout).items()}


def _own_docs(name: str) -> dict:
    """The module's DOCUMENTATION as written in its file, without fragments."""
    return yaml.safe_load(importlib.import_module(f"{PACKAGE}.modules.{name}").DOCUMENTATION)


def _fields(entry: dict) -> dict:
    """What an option's doc or spec says, with Ansible's defaults for what it leaves out."""
    return {
        "type": entry.get("type", "str"),
        "required": bool(entry.get("required", False)),
        "default": entry.get("default"),
        "choices": sorted(map(repr, entry["choices"])) if entry.get("choices") is not None else None,
        "elements": entry.get("elements"),
        "aliases": sorted(entry.get("aliases") or []),
    }


def disagreements(spec: dict, docs: dict, where: str, complete: bool = True) -> list[str]:
    """Every way the documented options ``docs`` disagree with the argument spec ``spec``, recursively into
    suboptions. With ``complete`` False the spec may leave documented options out (an action validates what a task
    gives; its module also takes what the action adds)."""
    found = []
    if complete:
        found += [
            f"{where}{option} is documented but not in the argument spec" for option in sorted(set(docs) - set(spec))
        ]
    for option in sorted(spec):
        if option not in docs:
            found.append(f"{where}{option} is in the argument spec but not documented")
            continue
        wanted, documented = _fields(spec[option]), _fields(docs[option])
        found += [
            f"{where}{option}: {field} is {documented[field]!r} in the docs, {wanted[field]!r} in the argument spec"
            for field in FIELDS
            if wanted[field] != documented[field]
        ]
        suboptions, documented_suboptions = spec[option].get("options") or {}, docs[option].get("suboptions") or {}
        if suboptions or documented_suboptions:
            found += disagreements(suboptions, documented_suboptions, f"{where}{option}.", complete)
    return found


@pytest.mark.parametrize("name", MODULES)
def test_docs_agree_with_the_argument_spec(name, resolved_docs):
    docs = resolved_docs[name].get("options") or {}
    specs = argument_specs(name)
    # The module's own spec is the whole interface; an action plugin in front of it validates what a task gives.
    found = disagreements(specs["module"], docs, "") if "module" in specs else disagreements(specs["action"], docs, "")
    if "module" in specs and "action" in specs:
        found += disagreements(specs["action"], docs, "(action) ", complete=False)
    assert not found, f"{name}: " + "; ".join(found)


def _walk(spec: dict, path: tuple = ()):
    for option, entry in spec.items():
        yield path + (option,), entry
        yield from _walk(entry.get("options") or {}, path + (option,))


def _doc_at(docs: dict, path: tuple) -> dict | None:
    entry = None
    for option in path:
        entry = (docs or {}).get(option)
        if entry is None:
            return None
        docs = entry.get("suboptions")
    return entry


def _shared_specs() -> dict[str, list[str]]:
    """Each option spec (dict) that several modules take at the same place, as "option.suboption": the modules."""
    users = defaultdict(set)
    held = []  # the spec dicts, kept alive so that their ids stay unique
    for name in MODULES:
        for spec in argument_specs(name).values():
            held.append(spec)
            for path, entry in _walk(spec):
                users[(".".join(path), id(entry))].add(name)
    return {option: sorted(names) for (option, _spec), names in sorted(users.items()) if len(names) > 1}


SHARED = _shared_specs()


def test_option_specs_are_shared():
    assert {"evidence", "nonce", "kubeconfig", "releases.release_name"} <= set(SHARED), SHARED


@pytest.mark.parametrize("option", SHARED)
def test_an_option_spec_shared_by_modules_is_documented_once_in_a_fragment(option, resolved_docs):
    path = tuple(option.split("."))
    modules = SHARED[option]
    found = [
        f"{name} documents {option} itself; its spec is shared with {[m for m in modules if m != name]}, so its "
        "docs belong in a doc fragment"
        for name in modules
        if _doc_at(_own_docs(name).get("options"), path) is not None
    ]
    texts = {name: _doc_at(resolved_docs[name].get("options"), path) for name in modules}
    if len({json.dumps(doc, sort_keys=True) for doc in texts.values()}) > 1:
        found.append(f"{option}, one spec, is documented differently in {modules}")
    assert not found, "; ".join(found)


def _fragment_sections() -> list[str]:
    sections = []
    for path in sorted((REPO / "plugins" / "doc_fragments").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and node.targets[0].id.isupper():
                name = node.targets[0].id
                sections.append(f"{COLLECTION}.{path.stem}" + ("" if name == "DOCUMENTATION" else f".{name.lower()}"))
    return sections


@pytest.mark.parametrize("section", _fragment_sections())
def test_every_fragment_section_is_used(section):
    used = {
        fragment.lower() for name in MODULES for fragment in _own_docs(name).get("extends_documentation_fragment", [])
    }
    assert section.lower() in used, f"doc fragment {section} is used by no module"
