"""Figures of a benchmark in the one shape bench/run.py tabulates: benchmark, figure, value, unit, target, met.

Every benchmark takes ``--figures FILE`` and writes its figures there as a JSON list (besides its own printout).
"""

from __future__ import annotations

import json


def figure(
    benchmark: str, name: str, value: float | None, unit: str, target: str = "", met: bool | None = None
) -> dict:
    """One figure; ``target`` in words (e.g. "<= 2x floor"), ``met`` None when the figure has no target."""
    return {"benchmark": benchmark, "figure": name, "value": value, "unit": unit, "target": target, "met": met}


def add_option(parser) -> None:
    parser.add_argument(
        "--figures", metavar="FILE", help="also write the figures to FILE as JSON (bench/run.py reads them)"
    )


def write(path: str | None, figures: list[dict]) -> None:
    if path:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(figures, handle, indent=1)
