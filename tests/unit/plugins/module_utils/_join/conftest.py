"""Join service fixtures (the harness itself is join_harness.py)."""

from __future__ import annotations

import pytest

from join_harness import JoinLab


@pytest.fixture
def join_lab(tmp_path, swtpm):
    lab = JoinLab(tmp_path, swtpm)
    yield lab
    lab.close()
