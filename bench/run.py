"""Run every benchmark and print one table of figures (benchmark, figure, value, unit, target, met or MISSED), comparable
release to release.

Run: .venv/bin/python bench/run.py [--quick] [--scale] [--json FILE] [--lab-runs N] [--baseline REF]
--baseline REF also times the evidence verifier of git ref REF (before and after from one run). --quick leaves out
the lab benchmarks (lab_updown, playbooks, bringup, day2, vm_node), which need root and take minutes. --scale runs bringup on
1+2 and 1+29 nodes instead of 1+2 and 3+3 (tens of minutes on 2 cores). The lab ones use the lab of
CK_LAB_INDEX in CK_LAB_DIR (export both when other labs run beside yours). Each benchmark runs as a process of its
own and hands its figures over through ``--figures``; one that fails shows as a failed row and makes the exit code 1.
Missed targets are reported in the table (MISSED), not in the exit code.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
# (script, arguments, needs the lab)
BENCHMARKS = (
    ("verify_evidence.py", [], False),
    ("ima_verify.py", [], False),
    ("nonce_store.py", [], False),
    ("join_service.py", [], False),
    # Against a real API server on loopback (tests/control_plane.py; the lab's Kubernetes build, no lab).
    ("join_service.py", ["--real-api"], False),
    ("lab_updown.py", ["--runs", "{lab_runs}"], True),
    ("playbooks.py", ["--runs", "{lab_runs}"], True),
    ("bringup.py", [], True),
    ("day2.py", [], True),
    ("vm_node.py", [], True),
)
HEADER = ("benchmark", "figure", "value", "unit", "target", "result")


def run(script: str, arguments: list[str], workdir: str) -> tuple[list[dict], str]:
    """The benchmark's figures, or a failed row; and its printout."""
    figures_file = Path(workdir) / f"{script}.json"
    started = time.monotonic()
    sys.stderr.write(f"bench: {script} {' '.join(arguments)} ...\n")
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *arguments, "--figures", str(figures_file)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.monotonic() - started
    sys.stderr.write(f"bench: {script} exit {done.returncode} after {elapsed:.0f} s\n")
    printout = done.stdout + done.stderr
    if done.returncode != 0 or not figures_file.exists():
        last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        return [
            {
                "benchmark": script.removesuffix(".py"),
                "figure": f"FAILED (exit {done.returncode}): {last[:100]}",
                "value": None,
                "unit": "",
                "target": "runs",
                "met": False,
            }
        ], printout
    return json.loads(figures_file.read_text()), printout


def cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "met" if value else "MISSED"
    if isinstance(value, float):
        return f"{value:g}" if abs(value) >= 0.01 else f"{value:.3g}"
    return str(value)


def table(figures: list[dict]) -> str:
    rows = [HEADER] + [
        tuple(
            cell(f[key]) if key != "met" or f["target"] else "-"
            for key in ("benchmark", "figure", "value", "unit", "target", "met")
        )
        for f in figures
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    lines = []
    for number, row in enumerate(rows):
        lines.append(
            "  ".join(
                text.rjust(width) if index == 2 else text.ljust(width)
                for index, (text, width) in enumerate(zip(row, widths))
            ).rstrip()
        )
        if number == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="leave out the lab benchmarks (lab bring-up, playbooks)")
    parser.add_argument(
        "--json", metavar="FILE", help="also write the figures and the machine they were taken on as JSON"
    )
    parser.add_argument("--scale", action="store_true", help="bring-up of 1+2 and 1+29 nodes instead of 1+2 and 3+3")
    parser.add_argument("--lab-runs", type=int, default=3, help="runs of each lab measurement (default 3)")
    parser.add_argument("--baseline", metavar="REF", help="also time the evidence verifier of this git ref (e.g. main)")
    parser.add_argument("--verbose", action="store_true", help="show each benchmark's own printout")
    args = parser.parse_args()
    figures: list[dict] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ck-bench-run-") as workdir:
        for script, arguments, needs_lab in BENCHMARKS:
            name = script.removesuffix(".py")
            if needs_lab and args.quick:
                figures.append(
                    {
                        "benchmark": name,
                        "figure": "skipped (--quick)",
                        "value": None,
                        "unit": "",
                        "target": "",
                        "met": None,
                    }
                )
                continue
            if needs_lab and os.geteuid() != 0:
                figures.append(
                    {
                        "benchmark": name,
                        "figure": "skipped: the lab needs root",
                        "value": None,
                        "unit": "",
                        "target": "",
                        "met": None,
                    }
                )
                continue
            arguments = [a.format(lab_runs=args.lab_runs) for a in arguments]
            if script == "verify_evidence.py" and args.baseline:
                arguments += ["--baseline", args.baseline]
            if script == "bringup.py" and args.scale:
                arguments += ["--scale"]
            result, printout = run(script, arguments, workdir)
            if args.verbose:
                sys.stderr.write(printout)
            figures.extend(result)
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    machine = (
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {commit or '?'}, {os.cpu_count()} CPU(s), "
        f"Python {platform.python_version()}, lab index {os.environ.get('CK_LAB_INDEX', '0')}, {time.monotonic() - started:.0f} s"
    )
    print(f"benchmarks: {machine}")
    print(table(figures))
    missed = [f for f in figures if f["target"] and f["met"] is False]
    print(
        f"{len(missed)} target(s) missed"
        + (": " + "; ".join(f"{f['benchmark']} {f['figure']}" for f in missed) if missed else "")
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"machine": machine, "commit": commit, "figures": figures}, handle, indent=1)
    return 1 if any(f["figure"].startswith("FAILED") for f in figures) else 0


if __name__ == "__main__":
    sys.exit(main())
