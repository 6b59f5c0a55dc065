"""Benchmark of the lab: time `lab up` of 3 nodes (1 control plane, 2 workers) until all answer
SSH, and `lab down`, over a few runs; print min/median/max seconds.

Run as root: python bench/lab_updown.py [--runs N] [--control-planes N] [--workers M] [--figures FILE]
The base root is built first when the cache has none (not timed). The lab is the one of CK_LAB_INDEX (default 0) in
CK_LAB_DIR (default: a temporary directory), so labs of other indexes running side by side are not touched; refuses
to run while this index's lab bridge exists.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAB = REPO / "tests" / "lab" / "lab"
sys.path.insert(0, str(REPO / "tests" / "lab"))

from cklab import LabError, base, plan  # noqa: E402
from cklab.paths import LabPaths  # noqa: E402

import _figures  # noqa: E402


def timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[1:])} failed:\n{done.stderr}")
    return elapsed


def main() -> int:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--runs", type=int, default=3)
    options.add_argument("--control-planes", type=int, default=1)
    options.add_argument("--workers", type=int, default=2)
    _figures.add_option(options)
    args = options.parse_args()
    if Path("/sys/class/net", plan.BRIDGE).exists():
        print(
            f"lab {plan.LAB_INDEX} is running (bridge {plan.BRIDGE}); run 'tests/lab/lab down' with CK_LAB_INDEX={plan.LAB_INDEX} first",
            file=sys.stderr,
        )
        return 1
    env = {**os.environ, "CK_LAB_REPO_ROOT": str(REPO)}
    os.environ["CK_LAB_REPO_ROOT"] = str(REPO)
    try:
        started = time.monotonic()
        built = base.cached_base(LabPaths.from_environment()) is None
        base.ensure_base(LabPaths.from_environment())
        if built:
            print(f"base root built in {time.monotonic() - started:.1f} s (not timed below)")
    except LabError as exc:
        print(f"base build failed: {exc}", file=sys.stderr)
        return 1
    nodes = args.control_planes + args.workers
    ups, downs = [], []
    with tempfile.TemporaryDirectory(prefix="cklab-bench-") as temporary:
        env["CK_LAB_DIR"] = os.environ.get("CK_LAB_DIR") or temporary
        try:
            for _run in range(args.runs):
                ups.append(
                    timed(
                        [str(LAB), "up", "--control-planes", str(args.control_planes), "--workers", str(args.workers)],
                        env,
                    )
                )
                downs.append(timed([str(LAB), "down"], env))
        finally:
            subprocess.run([str(LAB), "down"], env=env, capture_output=True, timeout=120, check=False)
    print(f"{'step':<24}{'runs':>5}{'min s':>8}{'median s':>10}{'max s':>8}")
    for label, values in ((f"up {nodes} nodes (to SSH)", ups), (f"down {nodes} nodes", downs)):
        print(f"{label:<24}{len(values):>5}{min(values):>8.2f}{statistics.median(values):>10.2f}{max(values):>8.2f}")
    _figures.write(
        args.figures,
        [
            _figures.figure(
                "lab", f"up {nodes} nodes to SSH (median of {len(ups)})", round(statistics.median(ups), 2), "s"
            ),
            _figures.figure(
                "lab", f"down {nodes} nodes (median of {len(downs)})", round(statistics.median(downs), 2), "s"
            ),
        ],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
