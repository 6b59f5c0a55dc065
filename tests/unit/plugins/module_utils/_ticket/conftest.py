"""The node side of a join runs against the join service harness of the _join tests."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_join"))

from join_harness import join_lab  # noqa: E402,F401  # pylint: disable=unused-import
