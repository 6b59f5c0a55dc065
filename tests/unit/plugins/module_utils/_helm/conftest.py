"""Fixtures of the helm tests (see helm_harness.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import helm_harness  # noqa: E402


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    yield from helm_harness.control_plane(tmp_path, monkeypatch)


@pytest.fixture
def helm_binary() -> str:
    return helm_harness.HELM_BINARY
