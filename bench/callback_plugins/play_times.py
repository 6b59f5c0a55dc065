"""Wall time and the machine's CPU of each play and task of a playbook run, for the bring-up benchmark
(bench/bringup.py)."""

from __future__ import annotations

DOCUMENTATION = """
name: play_times
type: aggregate
short_description: writes each play's and task's wall time and each task's CPU seconds to a JSON file
description:
  - At the end of the run, writes the plays in the order they ran to the file named by C(CK_BENCH_PLAY_TIMES), as a
    JSON list. Each play has its name, its seconds (from its start to the next play's start, or to the end of the
    run) and its tasks. Each task has its name (prefixed with its role's in a role) and its seconds, from its start
    to the next task's start, which is its wall time on all the play's hosts, and its cpu, the CPU seconds the whole
    machine spent in that time (every core's busy time in C(/proc/stat)). On a lab whose nodes share the controller's
    machine, that is what the task cost the controller and every node together, with whatever else ran.
  - Used by bench/bringup.py through C(ANSIBLE_CALLBACK_PLUGINS) and C(ANSIBLE_CALLBACKS_ENABLED); not part of the
    collection.
requirements:
  - enabled in configuration (callbacks_enabled = play_times)
"""

import json
import os
import time

from ansible.plugins.callback import CallbackBase

# The busy fields of /proc/stat's cpu line: user, nice, system, (idle, iowait,) irq, softirq, steal.
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)


def machine_cpu_seconds() -> float:
    """CPU seconds every core of this machine has been busy since boot."""
    with open("/proc/stat", encoding="ascii") as stat:
        fields = stat.readline().split()[1:]
    return sum(int(fields[i]) for i in _BUSY_FIELDS) / os.sysconf("SC_CLK_TCK")


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "play_times"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._plays: list[dict] = []
        self._play_started = self._task_started = self._task_cpu = 0.0

    def _close_task(self, now: float, cpu: float) -> None:
        if self._plays and self._plays[-1]["tasks"]:
            self._plays[-1]["tasks"][-1]["seconds"] = round(now - self._task_started, 3)
            self._plays[-1]["tasks"][-1]["cpu"] = round(cpu - self._task_cpu, 3)

    def _close_play(self, now: float) -> None:
        self._close_task(now, machine_cpu_seconds())
        if self._plays:
            self._plays[-1]["seconds"] = round(now - self._play_started, 3)

    def v2_playbook_on_play_start(self, play) -> None:
        now = time.monotonic()
        self._close_play(now)
        self._play_started = now
        self._plays.append({"play": play.get_name().strip(), "seconds": 0.0, "tasks": []})

    def v2_playbook_on_task_start(self, task, is_conditional) -> None:
        now, cpu = time.monotonic(), machine_cpu_seconds()
        self._close_task(now, cpu)
        self._task_started, self._task_cpu = now, cpu
        # "ROLE : NAME" for a task of a role
        self._plays[-1]["tasks"].append(
            {"task": task.get_name(include_role_fqcn=False).strip(), "seconds": 0.0, "cpu": 0.0}
        )

    def v2_playbook_on_handler_task_start(self, task) -> None:
        self.v2_playbook_on_task_start(task, False)

    def v2_playbook_on_stats(self, stats) -> None:
        self._close_play(time.monotonic())
        path = os.environ.get("CK_BENCH_PLAY_TIMES")
        if path:
            with open(path, "w", encoding="utf-8") as handle:
                json.dump(self._plays, handle, indent=1)
