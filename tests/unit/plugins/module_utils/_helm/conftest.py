"""Fixtures of the helm tests: real helm (3.17 and 4.1) against the session's real control plane."""

from __future__ import annotations

import re

import pytest


@pytest.fixture
def release_namespace(request, helm_binary) -> str:
    """A namespace of its own for each test and helm, so tests share one control plane without meeting."""
    name = re.sub(r"[^a-z0-9]+", "-", f"{request.node.originalname}-{helm_binary.rsplit('-', 1)[1]}".lower())
    return name.strip("-")[-63:].strip("-")
