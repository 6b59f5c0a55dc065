"""The lab tool's tests: import path of tests/lab and the `lab` marker (each pytest-xdist worker's lab index: the
conftest above)."""

from __future__ import annotations

import sys
from pathlib import Path

LAB_SOURCE = Path(__file__).resolve().parents[2] / "lab"
if str(LAB_SOURCE) not in sys.path:
    sys.path.insert(0, str(LAB_SOURCE))


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "lab: boots real lab nodes (root, systemd-nspawn, swtpm; about a minute with a cached base)"
    )
