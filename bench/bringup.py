"""Benchmark of a whole bring-up on the lab's real control plane: `lab up` until every node answers SSH, then
site.yml's first run and its re-run (changed=0), each beside the floor playbook on the same nodes (fact gathering and
one command on every node), for 1 control plane + 2 workers and 3 control planes + 3 workers; with --scale for
1 control plane + 2 workers and 1 control plane + 29 workers instead.

Run as root: .venv/bin/python bench/bringup.py [--scale] [--figures FILE]
Uses the lab of CK_LAB_INDEX (default 0) in CK_LAB_DIR (default: a temporary directory) and tears it down after;
refuses to run while this index's lab bridge exists. Ansible runs with at least as many forks as the lab has nodes.
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
from playbooks import floor_playbook  # noqa: E402

PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"
SHAPES = ((1, 2), (3, 3))
SCALE_SHAPES = ((1, 2), (1, 29))
RERUN_TARGET = 2.0  # site.yml re-run <= 2x the floor playbook on the same nodes
SCALE_NODES, SCALE_SSH_TARGET = 30, 30.0  # 30 nodes answer SSH in under 30 s
_CHANGED = re.compile(r"changed=(\d+)")


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=3600, check=False)
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}")
    return elapsed, done.stdout


def bring_up(control_planes: int, workers: int, env: dict[str, str], floor: Path) -> dict[str, float]:
    inventory = f"{env['CK_LAB_DIR']}/inventory.yml"
    env = dict(env, ANSIBLE_FORKS=str(max(int(env.get("ANSIBLE_FORKS", "5")), control_planes + workers)))
    try:
        up, _up_output = timed(
            [str(LAB), "up", "--control-planes", str(control_planes), "--workers", str(workers)], env
        )
        floor_time, _floor_output = timed([str(PLAYBOOK), "-i", inventory, str(floor)], env)
        first, _first_output = timed([str(PLAYBOOK), "-i", inventory, "confidential.kubernetes.site"], env)
        rerun, output = timed([str(PLAYBOOK), "-i", inventory, "confidential.kubernetes.site"], env)
    finally:
        subprocess.run([str(LAB), "down"], env=env, capture_output=True, check=False)
    changed = sum(int(count) for count in _CHANGED.findall(output.split("PLAY RECAP", 1)[-1]))
    if changed:
        raise SystemExit(f"site.yml re-run on {control_planes}+{workers} changed {changed} things: not idempotent")
    return {"up": up, "floor": floor_time, "first": first, "rerun": rerun}


def main() -> int:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument(
        "--scale",
        action="store_true",
        help=f"1+2 and 1+29 nodes (lab up target: {SCALE_NODES} nodes in < {SCALE_SSH_TARGET:g} s)",
    )
    _figures.add_option(options)
    args = options.parse_args()
    if Path("/sys/class/net", plan.BRIDGE).exists():
        raise SystemExit(
            f"lab {plan.LAB_INDEX} is running (bridge {plan.BRIDGE}): tear it down first (tests/lab/lab down)"
        )
    subprocess.run(["bash", str(REPO / "scripts" / "link-collection.sh")], check=True)
    figures, rows = [], []
    with tempfile.TemporaryDirectory(prefix="ck-bench-bringup-") as temporary:
        env = dict(
            os.environ,
            CK_LAB_DIR=os.environ.get("CK_LAB_DIR") or temporary,
            ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"),
        )
        floor = Path(temporary) / "floor.yml"
        floor.write_text(floor_playbook("cluster"))
        for control_planes, workers in SCALE_SHAPES if args.scale else SHAPES:
            nodes = control_planes + workers
            shape = f"{control_planes} cp + {workers} workers"
            times = bring_up(control_planes, workers, env, floor)
            rows.append((shape, times))
            ratio = times["rerun"] / times["floor"]
            up_target = (
                (f"< {SCALE_SSH_TARGET:g} s", times["up"] < SCALE_SSH_TARGET) if nodes >= SCALE_NODES else ("", None)
            )
            figures += [
                _figures.figure(
                    "bring-up", f"{shape}: lab up (booted, SSH answers)", round(times["up"], 2), "s", *up_target
                ),
                _figures.figure(
                    "bring-up", f"{shape}: floor playbook (facts + one command)", round(times["floor"], 2), "s"
                ),
                _figures.figure("bring-up", f"{shape}: site.yml first run", round(times["first"], 2), "s"),
                _figures.figure("bring-up", f"{shape}: site.yml re-run (changed=0)", round(times["rerun"], 2), "s"),
                _figures.figure(
                    "bring-up",
                    f"{shape}: site.yml re-run / floor",
                    round(ratio, 1),
                    "x",
                    f"<= {RERUN_TARGET:g}x",
                    ratio <= RERUN_TARGET,
                ),
            ]
    print(
        f"{'real bring-up on the lab':<26} {'lab up s':>9} {'floor s':>8} {'site.yml s':>11} {'re-run s':>9} {'re-run/floor':>13}"
    )
    for shape, times in rows:
        print(
            f"{shape:<26} {times['up']:9.2f} {times['floor']:8.2f} {times['first']:11.2f} {times['rerun']:9.2f} "
            f"{times['rerun'] / times['floor']:12.1f}x"
        )
    _figures.write(args.figures, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
