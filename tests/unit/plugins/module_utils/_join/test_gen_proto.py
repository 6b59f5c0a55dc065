"""scripts/gen-proto.sh: the checked-in gRPC code matches joinservice.proto, and drift is caught."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[5]
SCRIPT = REPO / "scripts" / "gen-proto.sh"
PACKAGE = Path("plugins/module_utils/_join")


def _run(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(root / "scripts" / "gen-proto.sh"), *args],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ, PYTHON=sys.executable),
    )


def _copy(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPT, tmp_path / "scripts")
    (tmp_path / PACKAGE).mkdir(parents=True)
    for name in ("joinservice.proto", "joinservice_pb2.py", "joinservice_pb2_grpc.py"):
        shutil.copy(REPO / PACKAGE / name, tmp_path / PACKAGE / name)
    return tmp_path


def test_checked_in_code_is_up_to_date():
    result = _run(REPO, "--check")
    assert result.returncode == 0, result.stdout + result.stderr


def test_drift_is_reported_and_regeneration_fixes_it(tmp_path):
    root = _copy(tmp_path)
    proto = root / PACKAGE / "joinservice.proto"
    text = proto.read_text()
    assert "message HealthRequest {}" in text
    proto.write_text(text.replace("message HealthRequest {}", "message HealthRequest {\n  string detail = 1;\n}"))
    result = _run(root, "--check")
    assert result.returncode == 1 and "out of date" in result.stderr
    assert _run(root).returncode == 0
    assert _run(root, "--check").returncode == 0
    assert (
        "from . import joinservice_pb2 as joinservice__pb2" in (root / PACKAGE / "joinservice_pb2_grpc.py").read_text()
    )


def test_generation_is_reproducible(tmp_path):
    root = _copy(tmp_path)
    assert _run(root).returncode == 0
    for name in ("joinservice_pb2.py", "joinservice_pb2_grpc.py"):
        assert (root / PACKAGE / name).read_bytes() == (REPO / PACKAGE / name).read_bytes()
