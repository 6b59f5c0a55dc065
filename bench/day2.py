"""Benchmark of day 2 on the lab's real control plane: the drills runner (tests/drills/run) brings up 3 control planes +
2 workers and runs the outage drill (every node loses power, recover.yml), the restore drill (backup.yml, etcd wiped,
restore.yml) and the upgrade drill (upgrade_kubernetes.yml to the lab's relabelled 1.20.2); this prints the seconds
from recover.yml's start to a serving API (target <= 60 s), the snapshot + fetch seconds and encrypted size for 200
ConfigMaps, the restore seconds, the upgrade's duration and longest API gap, and the object counts.

Run as root: .venv/bin/python bench/day2.py [--control-planes N] [--workers M] [--figures FILE]
Uses the lab of CK_LAB_INDEX (default 0) in CK_LAB_DIR and tears it down after (the runner does); refuses to run while
this index's lab bridge exists. About 20 minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import _figures

REPO = Path(__file__).resolve().parents[1]
RUNNER = REPO / "tests" / "drills" / "run"
DRILLS = ("outage", "restore", "upgrade")
API_READY_TARGET = 60.0  # seconds from recover.yml's start until an API server answers /readyz, 3 control planes
OBJECTS = 200
BENCHMARK = "day2"


def _count(value) -> int | None:
    """The drills report counts as "200/200"; the figure is the first number."""
    try:
        return int(str(value).split("/", 1)[0])
    except ValueError:
        return None


def figures_from(document: dict) -> list[dict]:
    """The benchmark's rows from the runner's --figures-json document; a drill that failed or did not run is a row
    with met=False naming it, so the table says why a figure is missing."""
    shape = f"{document['control_planes']} cp + {document['workers']} workers"
    drills = {entry["name"]: entry for entry in document["drills"]}
    rows = []
    for name in ("bring-up",) + DRILLS:
        entry = drills.get(name)
        if entry is None or entry["result"] != "ok":
            why = entry["result"] if entry else "did not run"
            rows.append(_figures.figure(BENCHMARK, f"{shape}: {name}: {why}"[:160], None, "", "passes", False))
    outage = drills.get("outage", {}).get("figures", {}) if drills.get("outage", {}).get("result") == "ok" else {}
    if outage:
        ready = outage.get("api_ready_seconds")
        met = ready is not None and ready <= API_READY_TARGET if document["control_planes"] == 3 else None
        rows += [
            _figures.figure(
                BENCHMARK,
                f"{shape}: recover.yml start to API ready",
                ready,
                "s",
                f"<= {API_READY_TARGET:g} s" if met is not None else "",
                met,
            ),
            _figures.figure(BENCHMARK, f"{shape}: recover.yml run", outage.get("recover_seconds"), "s"),
            _figures.figure(
                BENCHMARK, f"{shape}: recover.yml start to every node Ready", outage.get("all_ready_seconds"), "s"
            ),
            _figures.figure(
                BENCHMARK,
                f"{shape}: ConfigMaps after the outage",
                _count(outage.get("configmaps")),
                "objects",
                f"= {OBJECTS}",
                _count(outage.get("configmaps")) == OBJECTS,
            ),
            _figures.figure(
                BENCHMARK,
                f"{shape}: second recover.yml changed",
                outage.get("rerun_changed"),
                "tasks",
                "= 0",
                outage.get("rerun_changed") == 0,
            ),
        ]
    restore = drills.get("restore", {}).get("figures", {}) if drills.get("restore", {}).get("result") == "ok" else {}
    if restore:
        rows += [
            _figures.figure(
                BENCHMARK,
                f"{shape}: backup.yml snapshot + fetch, {OBJECTS} ConfigMaps",
                restore.get("snapshot_fetch_seconds"),
                "s",
            ),
            _figures.figure(
                BENCHMARK,
                f"{shape}: encrypted snapshot size ({restore.get('etcd_keys')} keys)",
                restore.get("snapshot_bytes"),
                "bytes",
            ),
            _figures.figure(BENCHMARK, f"{shape}: restore.yml run", restore.get("restore_seconds"), "s"),
            _figures.figure(
                BENCHMARK,
                f"{shape}: ConfigMaps after the restore",
                _count(restore.get("configmaps_restored")),
                "objects",
                f"= {OBJECTS}",
                _count(restore.get("configmaps_restored")) == OBJECTS,
            ),
        ]
    upgrade = drills.get("upgrade", {}).get("figures", {}) if drills.get("upgrade", {}).get("result") == "ok" else {}
    if upgrade:
        kept = str(upgrade.get("configmaps_kept", ""))
        rows += [
            _figures.figure(
                BENCHMARK,
                f"{shape}: upgrade_kubernetes.yml {upgrade.get('from')} to {upgrade.get('to')}",
                upgrade.get("upgrade_s"),
                "s",
            ),
            _figures.figure(
                BENCHMARK, f"{shape}: longest time no API server answered", upgrade.get("longest_api_gap_s"), "s"
            ),
            _figures.figure(
                BENCHMARK,
                f"{shape}: longest time the first control plane's API did not answer",
                upgrade.get("longest_gap_of_first_control_plane_s"),
                "s",
            ),
            _figures.figure(
                BENCHMARK,
                f"{shape}: ConfigMaps after the upgrade",
                _count(kept),
                "objects",
                f"= {kept.partition('/')[2]}",
                bool(kept.partition("/")[2]) and _count(kept) == _count(kept.partition("/")[2]),
            ),
        ]
    return rows


def main() -> int:
    options = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    options.add_argument("--control-planes", type=int, default=3, help="the API-ready target applies to 3")
    options.add_argument("--workers", type=int, default=2)
    _figures.add_option(options)
    args = options.parse_args()
    sys.path.insert(0, str(REPO / "tests" / "lab"))
    from cklab import plan  # pylint: disable=import-outside-toplevel

    if Path("/sys/class/net", plan.BRIDGE).exists():
        raise SystemExit(
            f"lab {plan.LAB_INDEX} is running (bridge {plan.BRIDGE}): tear it down first (tests/lab/lab down)"
        )
    subprocess.run(["bash", str(REPO / "scripts" / "link-collection.sh")], check=True)
    with tempfile.TemporaryDirectory(prefix="ck-bench-day2-") as temporary:
        figures_json = Path(temporary) / "drills.json"
        env = dict(
            os.environ,
            CK_LAB_DIR=os.environ.get("CK_LAB_DIR") or temporary,
            ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"),
            PATH=f"{REPO / '.venv' / 'bin'}:{os.environ.get('PATH', '')}",
        )
        done = subprocess.run(
            [
                str(RUNNER),
                f"--control-planes={args.control_planes}",
                f"--workers={args.workers}",
                "--figures-json",
                str(figures_json),
                *DRILLS,
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sys.stderr,
            check=False,
            timeout=7200,
        )
        if not figures_json.exists():
            raise SystemExit(f"tests/drills/run exited {done.returncode} without figures")
        figures = figures_from(json.loads(figures_json.read_text()))
    width = max(len(row["figure"]) for row in figures)
    for row in figures:
        verdict = "" if row["met"] is None else ("met" if row["met"] else "MISSED")
        print(
            f"{row['figure']:<{width}}  {row['value'] if row['value'] is not None else '-':>10} {row['unit']:<8} "
            f"{row['target']:<10} {verdict}"
        )
    _figures.write(args.figures, figures)
    return 0 if done.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
