# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""bench/bringup.py's reading of its measurements (no lab here): the join command kubeadm init prints, the plays'
and tasks' times its callback writes (the callback itself on a local playbook), and where the first run's time
beyond the kubeadm floor goes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "bench"))

import bringup  # noqa: E402 pylint: disable=wrong-import-position

HASH = "sha256:" + "ab" * 32
# The end of kubeadm 1.20's init output: a control plane's join command first, then a worker's.
INIT_OUTPUT = f"""Your Kubernetes control-plane has initialized successfully!

You can now join any number of control-plane nodes by copying certificate authorities
and service account keys on each node and then running the following as root:

  kubeadm join 10.77.6.10:6443 --token abcdef.0123456789abcdef \\
    --discovery-token-ca-cert-hash {HASH} \\
    --control-plane

Then you can join any number of worker nodes by running the following on each as root:

kubeadm join 10.77.6.10:6443 --token abcdef.0123456789abcdef \\
    --discovery-token-ca-cert-hash {HASH}
"""
PLAYS = [
    {"play": "Accept kubespray's group names", "seconds": 0.5, "tasks": [{"task": "Add the hosts", "seconds": 0.5}]},
    {"play": bringup.INIT_PLAY, "seconds": 40.0, "tasks": [{"task": "init : kubeadm", "seconds": 40.0}]},
    {"play": "Accept kubespray's group names", "seconds": 0.25, "tasks": [{"task": "Add the hosts", "seconds": 0.25}]},
    {"play": bringup.JOIN_PLAY, "seconds": 30.0, "tasks": [{"task": "join : kubeadm", "seconds": 30.0}]},
]


def test_the_join_command_is_a_workers_on_one_line():
    printed = bringup._JOIN_COMMAND.search(INIT_OUTPUT)
    assert " ".join(printed.group(0).replace("\\", " ").split()) == (
        f"kubeadm join 10.77.6.10:6443 --token abcdef.0123456789abcdef --discovery-token-ca-cert-hash {HASH}"
    )


def test_a_play_imported_twice_counts_once_and_the_rest_is_outside_the_plays(tmp_path):
    path = tmp_path / "plays.json"
    path.write_text(json.dumps(PLAYS))
    seconds = bringup.play_times(path, total=71.0)
    assert seconds == {
        "Accept kubespray's group names": 0.75,
        bringup.INIT_PLAY: 40.0,
        bringup.JOIN_PLAY: 30.0,
        "(outside the plays: start-up, parsing)": pytest.approx(0.25),
    }
    assert bringup.task_times(path) == [("init : kubeadm", 40.0), ("join : kubeadm", 30.0), ("Add the hosts", 0.75)]


def test_the_difference_to_the_floor_is_split_per_play_largest_first(tmp_path):
    path = tmp_path / "plays.json"
    path.write_text(json.dumps(PLAYS))
    plays = bringup.play_times(path, total=71.0)
    beyond = bringup.beyond_floor(plays, {"init": 35.0, "join": 10.0, "floor": 45.0})
    assert [name for name, _seconds in beyond][:2] == [bringup.JOIN_PLAY, bringup.INIT_PLAY]
    assert dict(beyond)[bringup.JOIN_PLAY] == 20.0 and dict(beyond)[bringup.INIT_PLAY] == 5.0
    assert sum(seconds for _name, seconds in beyond) == pytest.approx(71.0 - 45.0)


def test_a_run_without_the_kubeadm_plays_is_refused():
    with pytest.raises(SystemExit, match="no play named"):
        bringup.beyond_floor({bringup.INIT_PLAY: 1.0}, {"init": 1.0, "join": 1.0, "floor": 2.0})


def test_the_plays_after_the_largest_are_summed_as_one():
    ranked = [(f"play {n}", float(10 - n)) for n in range(bringup.SHARES_SHOWN + 2)]
    shown = bringup.largest(ranked)
    assert shown[: bringup.SHARES_SHOWN] == ranked[: bringup.SHARES_SHOWN]
    assert shown[-1] == ("2 other plays", sum(seconds for _name, seconds in ranked[bringup.SHARES_SHOWN :]))
    assert bringup.largest(ranked[:2]) == ranked[:2]


def test_the_callback_writes_each_play_and_task(tmp_path):
    playbook = tmp_path / "playbook.yml"
    playbook.write_text(
        """---
- name: First
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Wait a little
      ansible.builtin.command: sleep 0.2
      changed_when: false
    - name: Work a little
      ansible.builtin.command:
        argv: [python3, -c, "import time; end = time.process_time() + 0.5; all(iter(lambda: time.process_time() < end, False))"]
      changed_when: false
- name: Second
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Say nothing
      ansible.builtin.debug:
        msg: ""
"""
    )
    times = tmp_path / "times.json"
    env = dict(os.environ, ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false")
    seconds, _output = bringup.timed(
        [
            str(Path(sys.executable).with_name("ansible-playbook")),
            *("-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}"),
            str(playbook),
        ],
        env,
        plays=times,
    )
    plays = json.loads(times.read_text())
    assert [play["play"] for play in plays] == ["First", "Second"]
    assert [task["task"] for task in plays[0]["tasks"]] == ["Wait a little", "Work a little"]
    waiting, working = plays[0]["tasks"]
    assert 0.2 <= waiting["seconds"] <= plays[0]["seconds"]
    # The machine's CPU: the busy loop's 0.5 s at least, and never more than the machine's cores could give in that
    # wall time, give or take the clock tick /proc/stat counts in at each end (CI's busy machine hit the bound exactly).
    tick = 1 / os.sysconf("SC_CLK_TCK")
    assert 0.5 <= working["cpu"] <= (working["seconds"] + 2 * tick) * os.cpu_count()
    assert sum(play["seconds"] for play in plays) <= seconds


def test_the_callback_is_documented():
    done = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-doc")), "-t", "callback", "play_times"],
        env=dict(os.environ, ANSIBLE_CALLBACK_PLUGINS=str(REPO / "bench" / "callback_plugins")),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "CK_BENCH_PLAY_TIMES" in done.stdout
