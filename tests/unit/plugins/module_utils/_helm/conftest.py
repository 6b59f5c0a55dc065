"""Fixtures of the helm tests (see helm_harness.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from helm_harness import cluster, helm_binary  # noqa: E402,F401  (pytest fixtures)
