"""Tasks the roles and playbooks run: no templated argument dicts (ansible-core warns "Using a template for task args
is unsafe" on every run), and the long kubeadm and helm steps run async with a short poll so that the run shows
progress."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
TASK_FILES = sorted(
    [*REPO.glob("roles/*/tasks/*.yml"), *REPO.glob("playbooks/*.yml"), *REPO.glob("extensions/molecule/*/*.yml")]
)
LONG_STEPS = {
    "confidential.kubernetes.kubeadm_init",
    "confidential.kubernetes.kubeadm_join",
    "confidential.kubernetes.helm_release",
}


def _tasks(node):
    """Every task dict of a tasks file or playbook, blocks and plays included."""
    if isinstance(node, list):
        for item in node:
            yield from _tasks(item)
    elif isinstance(node, dict):
        if not ({"hosts", "block"} & node.keys()) and "import_playbook" not in str(node.keys()):
            yield node
        for key in ("tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue", "always"):
            yield from _tasks(node.get(key))


def _module(task: dict) -> str | None:
    return next((key for key in task if key.count(".") == 2 and not key.startswith("ansible.builtin.import_")), None)


@pytest.mark.parametrize("path", TASK_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_task_takes_its_arguments_from_a_template(path):
    templated = [
        task.get("name")
        for task in _tasks(yaml.safe_load(path.read_text()))
        if (module := _module(task)) and isinstance(task[module], str) and "{{" in task[module]
    ]
    assert not templated


def _role_tasks():
    """Every task of the roles' task files."""
    for path in REPO.glob("roles/*/tasks/*.yml"):
        yield from _tasks(yaml.safe_load(path.read_text()))


def test_long_steps_run_async_with_a_poll_of_a_few_seconds():
    steps = [task for task in _role_tasks() if _module(task) in LONG_STEPS]
    applied = [task for task in steps if not task.get("check_mode") and not _join_preflight(task)]
    assert {_module(task) for task in applied} == LONG_STEPS
    for task in applied:
        assert "async" in task and "confidential_progress_interval | default(5)" in str(task.get("poll")), task["name"]


def _join_preflight(task: dict) -> bool:
    return _module(task) == "confidential.kubernetes.kubeadm_join" and task[_module(task)].get("preflight") is True


def test_the_join_preflight_runs_at_once():
    """kubeadm's join checks before the lock pull nothing and take under a second: an async step would wait for its
    first progress poll (5 s) on every joining node."""
    preflights = [task for task in _role_tasks() if _join_preflight(task)]
    assert preflights
    for task in preflights:
        assert "async" not in task and "poll" not in task, task["name"]
