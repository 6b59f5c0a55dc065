# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drills runner's --figures-json and bench/day2.py's reading of it: the runner's main with a stand-in lab (no
lab is booted here; the drills' own figures are the lab's business), its JSON turned into the benchmark's rows."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests" / "drills"))
sys.path.insert(0, str(REPO / "bench"))

import day2  # noqa: E402 pylint: disable=wrong-import-position


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


runner = _module(REPO / "tests" / "drills" / "runner.py", "drills_runner")

OUTAGE = {
    "waiting_control_planes": 3,
    "api_ready_seconds": 41.3,
    "recover_seconds": 58.2,
    "recover_changed": 9,
    "all_ready_seconds": 75.0,
    "configmaps": "200/200",
    "secret": True,
    "rerun_changed": 0,
}
RESTORE = {
    "configmaps_restored": "200/200",
    "snapshot_fetch_seconds": 43.1,
    "snapshot_bytes": 2712345,
    "etcd_keys": 1893,
    "restore_seconds": 120.4,
    "nodes_ready_after_s": 12.0,
    "refused": "tampered,truncated",
}
UPGRADE = {
    "from": "1.20.2",
    "to": "1.20.3-lab.1 (a relabelled 1.20.2)",
    "nodes": 5,
    "upgrade_s": 325.0,
    "longest_api_gap_s": 2.6,
    "longest_gap_of_first_control_plane_s": 33.8,
    "configmaps_kept": "20/20",
    "site_refusal_s": 9.1,
    "verify_s": 12.0,
    "rerun_s": 17.0,
}
DRILLS = {"outage": OUTAGE, "restore": RESTORE, "upgrade": UPGRADE}


class _Lab:
    def __init__(self):
        self.calls = []

    def lab(self, *args, check=True):
        self.calls.append(args)

    def playbook(self, name, *args, check=True):
        return SimpleNamespace(seconds=10.0, changed=0)


def _run_main(monkeypatch, tmp_path, drills: dict, *argv: str) -> tuple[int, dict]:
    def load(name):
        def drill(lab):
            if isinstance(drills[name], Exception):
                raise drills[name]
            return dict(drills[name])

        return drill

    monkeypatch.setattr(runner, "DrillLab", _Lab)
    monkeypatch.setattr(runner.quickstart, "bring_up", lambda lab: {"site_seconds": 10.0, "rerun_seconds": 10.0})
    monkeypatch.setattr(runner, "load", load)
    monkeypatch.setattr(runner, "available", lambda: list(DRILLS))
    path = tmp_path / "drills.json"
    monkeypatch.setattr(sys, "argv", ["runner.py", "--figures-json", str(path), *argv, *DRILLS])
    return runner.main(), json.loads(path.read_text())


def test_runner_writes_every_drill_and_day2_reads_the_figures(monkeypatch, tmp_path):
    rc, document = _run_main(monkeypatch, tmp_path, DRILLS)
    assert rc == 0
    assert (document["control_planes"], document["workers"]) == (3, 2)
    steps = [(d["name"], d["result"]) for d in document["drills"]]
    assert steps == [("bring-up", "ok"), ("outage", "ok"), ("restore", "ok"), ("upgrade", "ok")]
    assert document["drills"][1]["figures"] == OUTAGE

    rows = {row["figure"].removeprefix("3 cp + 2 workers: "): row for row in day2.figures_from(document)}
    ready = rows["recover.yml start to API ready"]
    assert (ready["value"], ready["unit"], ready["target"], ready["met"]) == (41.3, "s", "<= 60 s", True)
    assert rows["ConfigMaps after the outage"]["value"] == 200 and rows["ConfigMaps after the outage"]["met"] is True
    assert rows["second recover.yml changed"]["met"] is True
    assert rows["backup.yml snapshot + fetch, 200 ConfigMaps"]["value"] == 43.1
    assert rows["encrypted snapshot size (1893 keys)"]["value"] == 2712345
    assert rows["restore.yml run"]["value"] == 120.4
    assert rows["ConfigMaps after the restore"]["met"] is True
    upgrade = rows["upgrade_kubernetes.yml 1.20.2 to 1.20.3-lab.1 (a relabelled 1.20.2)"]
    assert (upgrade["value"], upgrade["unit"]) == (325.0, "s")
    assert rows["longest time no API server answered"]["value"] == 2.6
    assert rows["longest time the first control plane's API did not answer"]["value"] == 33.8
    kept = rows["ConfigMaps after the upgrade"]
    assert (kept["value"], kept["target"], kept["met"]) == (20, "= 20", True)
    assert all(
        set(row) == {"benchmark", "figure", "value", "unit", "target", "met"} and row["benchmark"] == "day2"
        for row in rows.values()
    )


def test_slow_recover_and_lost_objects_miss_their_targets(monkeypatch, tmp_path):
    slow = dict(OUTAGE, api_ready_seconds=61.0, configmaps="199/200")
    lost = dict(UPGRADE, configmaps_kept="19/20")
    dummy, document = _run_main(monkeypatch, tmp_path, dict(DRILLS, outage=slow, upgrade=lost))
    rows = {row["figure"].removeprefix("3 cp + 2 workers: "): row for row in day2.figures_from(document)}
    assert rows["recover.yml start to API ready"]["met"] is False
    assert rows["ConfigMaps after the outage"]["value"] == 199 and rows["ConfigMaps after the outage"]["met"] is False
    assert rows["ConfigMaps after the upgrade"]["value"] == 19 and rows["ConfigMaps after the upgrade"]["met"] is False


def test_a_failed_drill_is_a_missed_row_and_the_next_did_not_run(monkeypatch, tmp_path):
    rc, document = _run_main(
        monkeypatch, tmp_path, dict(DRILLS, outage=AssertionError("after recover: 150/200 ConfigMaps"))
    )
    assert rc == 1
    rows = day2.figures_from(document)
    failed = [row["figure"] for row in rows if row["met"] is False]
    assert failed == [
        "3 cp + 2 workers: outage: FAILED: after recover: 150/200 ConfigMaps",
        "3 cp + 2 workers: restore: did not run",
        "3 cp + 2 workers: upgrade: did not run",
    ]
    assert not any("API ready" in row["figure"] for row in rows)


@pytest.mark.parametrize("control_planes, target", [(1, ""), (3, "<= 60 s")])
def test_the_api_target_is_for_three_control_planes(monkeypatch, tmp_path, control_planes, target):
    dummy, document = _run_main(monkeypatch, tmp_path, DRILLS, f"--control-planes={control_planes}")
    ready = [row for row in day2.figures_from(document) if "API ready" in row["figure"]]
    assert [row["target"] for row in ready] == [target]
