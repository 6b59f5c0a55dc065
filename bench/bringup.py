"""Benchmark of a whole bring-up on the lab's real control plane: site.yml's first run and its re-run (changed=0),
for 1 control plane + 2 workers and for 3 control planes + 3 workers, each beside its floor: the same nodes booted
and answering SSH (`lab up`).

Run as root: .venv/bin/python bench/bringup.py [--figures FILE]
Uses the lab of CK_LAB_INDEX (default 0) in CK_LAB_DIR (default: a temporary directory) and tears it down after;
refuses to run while this index's lab bridge exists.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAB = REPO / "tests" / "lab" / "lab"
sys.path.insert(0, str(REPO / "tests" / "lab"))

from cklab import plan  # noqa: E402

import _figures  # noqa: E402

PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"
SHAPES = ((1, 2), (3, 3))
_CHANGED = re.compile(r"changed=(\d+)")


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800, check=False)
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}")
    return elapsed, done.stdout


def bring_up(control_planes: int, workers: int, env: dict[str, str]) -> dict[str, float]:
    inventory = f"{env['CK_LAB_DIR']}/inventory.yml"
    try:
        floor, _up_output = timed([str(LAB), "up", "--control-planes", str(control_planes), "--workers", str(workers)], env)
        first, _first_output = timed([str(PLAYBOOK), "-i", inventory, "confidential.kubernetes.site"], env)
        rerun, output = timed([str(PLAYBOOK), "-i", inventory, "confidential.kubernetes.site"], env)
    finally:
        subprocess.run([str(LAB), "down"], env=env, capture_output=True, check=False)
    changed = sum(int(count) for count in _CHANGED.findall(output.split("PLAY RECAP", 1)[-1]))
    if changed:
        raise SystemExit(f"site.yml re-run on {control_planes}+{workers} changed {changed} things: not idempotent")
    return {"floor": floor, "first": first, "rerun": rerun}


def main() -> int:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _figures.add_option(options)
    args = options.parse_args()
    if Path("/sys/class/net", plan.BRIDGE).exists():
        raise SystemExit(f"lab {plan.LAB_INDEX} is running (bridge {plan.BRIDGE}): tear it down first (tests/lab/lab down)")
    subprocess.run(["bash", str(REPO / "scripts" / "link-collection.sh")], check=True)
    figures, rows = [], []
    with tempfile.TemporaryDirectory(prefix="ck-bench-bringup-") as temporary:
        env = dict(os.environ, CK_LAB_DIR=os.environ.get("CK_LAB_DIR") or temporary,
                   ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"))
        for control_planes, workers in SHAPES:
            shape = f"{control_planes} cp + {workers} workers"
            times = bring_up(control_planes, workers, env)
            rows.append((shape, times))
            figures += [
                _figures.figure("bring-up", f"{shape}: floor (lab up: booted, SSH answers)", round(times["floor"], 2), "s"),
                _figures.figure("bring-up", f"{shape}: site.yml first run", round(times["first"], 2), "s"),
                _figures.figure("bring-up", f"{shape}: site.yml first run / floor", round(times["first"] / times["floor"], 1), "x"),
                _figures.figure("bring-up", f"{shape}: site.yml re-run (changed=0)", round(times["rerun"], 2), "s"),
            ]
    print(f"{'real bring-up on the lab':<26} {'floor s':>8} {'site.yml s':>11} {'ratio':>7} {'re-run s':>9}")
    for shape, times in rows:
        print(f"{shape:<26} {times['floor']:8.2f} {times['first']:11.2f} {times['first'] / times['floor']:6.1f}x {times['rerun']:9.2f}")
    _figures.write(args.figures, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
