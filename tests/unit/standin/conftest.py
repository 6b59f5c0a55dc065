"""The kubelet stand-in's tests: import path of tests/doubles, and its state and log directories per test."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

DOUBLES = Path(__file__).resolve().parents[2] / "doubles"
if str(DOUBLES) not in sys.path:
    sys.path.insert(0, str(DOUBLES))
# Read at import by kubelet_standin: a directory of this session's own, never the host's /run/kubelet-standin.
SESSION_DIR = Path(tempfile.mkdtemp(prefix="kubelet-standin-test-"))
os.environ["KUBELET_STANDIN_STATE"] = str(SESSION_DIR / "state")
os.environ["KUBELET_STANDIN_LOGS"] = str(SESSION_DIR / "logs")
