# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every variable an operator sets is checked: each one README.md and docs/ name, and each one a playbook reads with a
default, belongs to an argument spec; each inventory snippet of the docs passes the node role's inventory entry point;
and every playbook's first check (the second play of playbooks/groups.yml, run for real by ansible-playbook against
local hosts) fails naming a typo in a variable name or in a key of confidential_state_disk. The init role refuses a
first control plane without a state disk unless confidential_cluster_state_unencrypted gives it up."""

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


SPECS = {
    path.parent.parent.name: yaml.safe_load(path.read_text())["argument_specs"]
    for path in sorted(REPO.glob("roles/*/meta/argument_specs.yml"))
}
# A name in backquotes, a YAML key, or an extra variable on a command line.
NAMED = r"`([a-z][a-z0-9_]*[a-z0-9])\b|^\s*-?\s*([a-z][a-z0-9_]*[a-z0-9]):|-e ([a-z][a-z0-9_]*)="
KNOWN = {
    name for entry_points in SPECS.values() for spec in entry_points.values() for name in spec.get("options") or {}
}


def _prefix(word: str) -> str:
    """The check's prefix for the options whose first word is word: that word and _, or its first two words where
    every such option shares the second (as roles/node/tasks/inventory.yml derives it)."""
    names = [name for name in KNOWN if name.startswith(f"{word}_")]
    seconds = {name.split("_")[1] for name in names}
    return f"{word}_{seconds.pop()}" if len(names) > 1 and len(seconds) == 1 else f"{word}_"


PREFIXES = re.compile("|".join(sorted(_prefix(word) for word in {name.split("_")[0] for name in KNOWN})))
INVENTORY_SPEC = SPECS["node"]["inventory"]["options"]
# Names with the collection's prefixes that the docs use for something other than a variable an operator sets:
# modules, playbooks, the roles' entry points and what the roles register for the operator to read.
NOT_VARIABLES = (
    {path.stem for path in (REPO / "plugins" / "modules").glob("*.py")}
    | {path.stem for path in (REPO / "playbooks").glob("*.yml")}
    | {name for entry_points in SPECS.values() for name in entry_points}
    | {"upgrade_results", "upgrade_backup_path", "upgrade_kubernetes_plan", "joinservice_api_host"}
    # helm_release's options and result, and what the certificates role registers.
    | {"backup_kubeconfig", "backup_path", "certificates_expiry"}
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


def test_the_inventory_page_lists_the_prefixes_the_check_derives():
    text = (REPO / "docs" / "inventory.md").read_text()
    listed = re.search(r"Today they are (.*?)\. A variable of your own", text, re.S)
    assert listed, "docs/inventory.md no longer lists the check's prefixes"
    derived = sorted(_prefix(word) for word in {name.split("_")[0] for name in KNOWN})
    assert sorted(re.findall(r"`([a-z0-9_]+)`", listed.group(1))) == derived


def test_the_check_reads_every_role_s_argument_spec():
    check_vars = _check_vars("Read the options of the collection's argument specs")
    assert sorted(check_vars["__node_roles"]) == sorted(SPECS)


# A variable a playbook reads with a default: a name (and its attributes) before `| default(`, not an item of groups[].
DEFAULTED = re.compile(r"(?<![\w.'\]])([a-z_][a-z0-9_]*)(?:\.[a-z0-9_]+)*\s*\|\s*default\(")


def _nodes(document):
    """Every mapping of a parsed playbook or tasks file: plays, tasks, blocks and what they hold."""
    if isinstance(document, dict):
        yield document
        for value in document.values():
            yield from _nodes(value)
    elif isinstance(document, list):
        for item in document:
            yield from _nodes(item)


def _set_by(playbook: Path) -> set[str]:
    """What a playbook sets itself: its vars, registered results and facts, and those of the roles it runs (the
    certificates role's expiry entry point registers certificates_expiry for upgrade_kubernetes.yml)."""
    nodes = list(_nodes(yaml.safe_load(playbook.read_text())))
    roles = {node["ansible.builtin.include_role"]["name"] for node in nodes if "ansible.builtin.include_role" in node}
    roles |= {role if isinstance(role, str) else role["role"] for node in nodes for role in node.get("roles") or []}
    for role in roles:
        for tasks in (REPO / "roles" / role.rsplit(".", 1)[-1] / "tasks").glob("*.yml"):
            nodes += _nodes(yaml.safe_load(tasks.read_text()))
    return (
        {node["register"] for node in nodes if "register" in node}
        | {name for node in nodes for name in node.get("ansible.builtin.set_fact") or {}}
        | {name for node in nodes if isinstance(node.get("vars"), dict) for name in node["vars"]}
    )


def test_every_variable_a_playbook_reads_with_a_default_belongs_to_an_argument_spec():
    # A variable only a playbook reads (split_secrets.yml's split_threshold) is checked once an argument spec names it.
    read = {
        playbook.name: set(DEFAULTED.findall(playbook.read_text())) - _set_by(playbook)
        for playbook in sorted((REPO / "playbooks").glob("*.yml"))
    }
    assert {"split_threshold", "split_remove_plain", "confirm_remove"} <= read["split_secrets.yml"]
    assert "__split_confirmation" not in read["split_secrets.yml"]
    assert "certificates_expiry" not in read["upgrade_kubernetes.yml"]
    unknown = [f"playbooks/{playbook}: {name}" for playbook, names in read.items() for name in sorted(names - KNOWN)]
    assert not unknown, "variables playbooks read that no argument spec knows:\n" + "\n".join(unknown)


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


def test_a_wrong_key_of_a_structured_variable_is_refused_in_a_line_not_with_the_whole_spec(tmp_path):
    # Ansible's own check of the entry point printed its whole argument spec: 12-34 KB of JSON for one key.
    run = _run(tmp_path, {"confidential_state_disk": {"device": "/dev/vdb", "stat": "mounted"}}, [GROUPS, REACHED])
    assert run.returncode != 0 and "REACHED" not in run.stdout
    assert (
        '"msg": "cp-0: confidential_state_disk.stat. Supported parameters include: device, mount_path, name, '
        "pbkdf_iterations, pbkdf_memory, state - the inventory's variables: ansible-doc -t role "
        'confidential.kubernetes.node -e inventory. Nothing was changed."' in run.stdout
    ), run.stdout
    assert "argument_spec_data" not in run.stdout and len(run.stdout + run.stderr) < 4000, len(run.stdout)


def _refused(run: subprocess.CompletedProcess) -> list[str]:
    """The variables the check refused, from its message."""
    match = re.search(r"cp-0: (.*?) (?:is not a variable|are not variables) of confidential.kubernetes", run.stdout)
    assert match, run.stdout + run.stderr
    return match.group(1).split(", ")


def test_a_typo_of_every_variable_of_every_argument_spec_is_refused(tmp_path):
    # One misspelling per option of every role's every entry point, all in one run: none may escape the check.
    typos = sorted(f"{name}x" for name in KNOWN)
    assert not set(typos) & KNOWN
    run = _run(tmp_path, dict.fromkeys(typos, "x"), [GROUPS, REACHED])
    assert run.returncode != 0
    assert "REACHED" not in run.stdout
    escaped = sorted(set(typos) - set(_refused(run)))
    assert not escaped, f"{len(escaped)} of {len(typos)} typos escape the check: {', '.join(escaped)}"


@pytest.mark.parametrize(
    ("extra", "refused"),
    [
        (
            ["-e", "backup_keeps=3", "-e", "certificates_renew_before_day=60", "-e", "restore_snaphot=x"],
            ["backup_keeps", "certificates_renew_before_day", "restore_snaphot"],
        ),
        (["-e", "confirm_restor=5bb6c492"], ["confirm_restor"]),
        (["-e", "recover_state_dsk=/dev/vdb", "-e", "remove_node_drain_timout=1m"], None),
        (["-e", "pkcs11_pin_fle=/run/pin", "-e", "split_treshold=3"], None),
    ],
    ids=["backup, certificates and restore typos", "confirm typo", "recover and remove_node typos", "custody typos"],
)
def test_a_typo_of_a_day_2_playbook_s_variable_is_refused(tmp_path, extra, refused):
    run = _run(tmp_path, {}, [GROUPS, REACHED], *extra)
    assert run.returncode != 0
    assert "REACHED" not in run.stdout
    assert _refused(run) == (refused or sorted(arg.split("=")[0] for arg in extra if "=" in arg))


def test_the_day_2_confirmations_pass_the_check(tmp_path):
    run = _run(tmp_path, {}, [GROUPS, REACHED], "-e", "confirm_restore=5bb6c492", "-e", "confirm_reset=yes-reset-cp-0")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "REACHED" in run.stdout


def test_kubespray_s_kube_variables_are_not_ours(tmp_path):
    # kube_vip_ is the collection's prefix, not kube_: a kubespray inventory's group_vars pass.
    run = _run(tmp_path, {"kube_version": "v1.36.4", "kube_network_plugin": "cilium"}, [GROUPS, REACHED])
    assert run.returncode == 0, run.stdout + run.stderr
    assert "REACHED" in run.stdout


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
