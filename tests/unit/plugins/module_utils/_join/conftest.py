"""Join service fixtures (the harness itself is join_harness.py)."""

from __future__ import annotations

from join_harness import join_lab  # noqa: F401 - a fixture
