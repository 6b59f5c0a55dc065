# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The day-2 drills on one lab: bring up the lab once with the README's quick start on the docs' worked example
inventory (quickstart.py), then each drill in order on that same cluster, each leaving it healthy for the next; a
table of every drill's figures and time at the end. See README.md here.

tests/drills/run [--control-planes N] [--workers M] [--keep] [--figures-json FILE] [DRILL ...]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import quickstart  # noqa: E402 pylint: disable=wrong-import-position
from drilllab import DrillLab, log  # noqa: E402 pylint: disable=wrong-import-position

# The order matters: each drill starts from the healthy cluster the one before it left.
# upgrade before ha: ha powers a control plane off for good, and the upgrade wants every node Ready.
ORDER = ("reboot", "outage", "restore", "renew", "rollover", "upgrade", "ha")


def available() -> list[str]:
    found = {path.stem.removeprefix("drill_") for path in HERE.glob("drill_*.py")}
    return [name for name in ORDER if name in found] + sorted(found - set(ORDER))


def load(name: str):
    path = HERE / f"drill_{name}.py"
    spec = importlib.util.spec_from_file_location(f"drill_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.drill


def write_figures(path: str, control_planes: int, workers: int, results: list) -> None:
    """Every step's result, seconds and figures as JSON (bench/day2.py reads it): {"control_planes", "workers",
    "drills": [{"name", "result", "seconds", "figures"}, ...]}, "bring-up" first."""
    document = {
        "control_planes": control_planes,
        "workers": workers,
        "drills": [
            {"name": name, "result": result, "seconds": round(seconds, 1), "figures": figures}
            for name, result, seconds, figures in results
        ],
    }
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=1, default=str)
        handle.write("\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--control-planes", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="leave the lab up at the end")
    parser.add_argument("--figures-json", metavar="FILE", help="also write every drill's result and figures to FILE")
    parser.add_argument("drills", nargs="*", help=f"default: every drill ({', '.join(available())})")
    args = parser.parse_args()
    names = args.drills or available()
    unknown = sorted(set(names) - set(available()))
    if unknown:
        parser.error(f"no such drill: {', '.join(unknown)} (there are: {', '.join(available())})")

    lab = DrillLab()
    results: list[tuple[str, str, float, dict]] = []
    started = time.monotonic()
    try:
        lab.lab("up", f"--control-planes={args.control_planes}", f"--workers={args.workers}")
        log("bring-up: the README's quick start on the docs' worked example inventory")
        bringup_started = time.monotonic()
        figures = quickstart.bring_up(lab)
        results.append(("bring-up", "ok", time.monotonic() - bringup_started, figures))
        for name in names:
            log(f"drill {name}: start")
            drill_started = time.monotonic()
            try:
                figures = load(name)(lab) or {}
                results.append((name, "ok", time.monotonic() - drill_started, figures))
            except Exception as error:  # pylint: disable=broad-exception-caught
                traceback.print_exc()
                results.append(
                    (
                        name,
                        f"FAILED: {str(error).splitlines()[0][:200] if str(error) else type(error).__name__}",
                        time.monotonic() - drill_started,
                        {},
                    )
                )
                break
    except AssertionError as error:
        results.append(("bring-up", f"FAILED: {str(error)[:2000]}", time.monotonic() - started, {}))
    finally:
        if not args.keep:
            lab.lab("down", check=False)

    print(f"\n{'DRILL':<12} {'SECONDS':>8}  RESULT / FIGURES")
    for name, result, seconds, figures in results:
        print(f"{name:<12} {seconds:>8.1f}  {result}")
        for key, value in figures.items():
            print(f"{'':<12} {'':>8}    {key}: {value}")
    if args.figures_json:
        write_figures(args.figures_json, args.control_planes, args.workers, results)
    outcomes = [(entry[0], entry[1]) for entry in results]
    drills = [(name, result) for name, result in outcomes if name != "bring-up"]
    passed = sum(1 for _name, result in drills if result == "ok")
    failed = sum(1 for _name, result in outcomes if result != "ok")
    skipped = len(names) - len(drills)
    print(f"drills: {passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
    print(f"total {time.monotonic() - started:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
