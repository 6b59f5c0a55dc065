"""Join service fixtures: join_lab, defined in join_harness.py and imported here so that pytest finds it."""

from __future__ import annotations

from join_harness import join_lab  # noqa: F401  # pylint: disable=unused-import
