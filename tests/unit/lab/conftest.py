"""The lab tool's tests: import path of tests/lab, the `lab` marker, and one lab index per pytest-xdist worker."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Under pytest-xdist (scripts/test.sh runs pytest -n 2), worker gwN boots its labs under CK_LAB_INDEX + N: labs of
# different indexes have their own bridge, addresses and machine names and run side by side. Set before cklab is
# imported (its plan reads the index once).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw"):
    os.environ["CK_LAB_INDEX"] = str(int(os.environ.get("CK_LAB_INDEX", "0")) + int(_WORKER[2:]))

LAB_SOURCE = Path(__file__).resolve().parents[2] / "lab"
if str(LAB_SOURCE) not in sys.path:
    sys.path.insert(0, str(LAB_SOURCE))


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "lab: boots real lab nodes (root, systemd-nspawn, swtpm; about a minute with a cached base)"
    )
