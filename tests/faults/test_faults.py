# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fault suite's own parts: the injector fires exactly once where asked, the scanner finds every encoding."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from secretscan import Scanner, encodings, pem_needles  # noqa: E402 pylint: disable=wrong-import-position

COLLECTIONS = HERE.parent.parent / ".venv" / "collections"
CALL_DERIVE = (
    "from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto import derive; "
    "derive.measurement_secret(bytes(32), bytes(32)); print('survived')"
)
SECRET = bytes(range(7, 39))


def _run(tmp_path: Path, step: dict, code: str = CALL_DERIVE) -> subprocess.CompletedProcess:
    (tmp_path / "faults.json").write_text(json.dumps({"steps": [step]}))
    env = dict(
        os.environ,
        CK_FAULT_DIR=str(tmp_path),
        CK_FAULT_STEPS_FILE=str(tmp_path / "faults.json"),
        CK_FAULT_STEP=step["name"],
        PYTHONPATH=os.pathsep.join([str(COLLECTIONS), str(HERE)]),
    )
    return subprocess.run(
        [sys.executable, "-c", "import ck_fault_injector; " + code],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize("when", ["before", "after"])
def test_injector_kills_once(tmp_path, when):
    step = {"name": "derive-" + when, "target": "_crypto.derive:derive", "when": when, "action": "kill"}
    first = _run(tmp_path, step)
    assert first.returncode == -signal.SIGKILL
    assert (tmp_path / f"fired-derive-{when}").exists()
    second = _run(tmp_path, step)
    assert second.returncode == 0 and "survived" in second.stdout


def test_injector_leaves_other_functions_alone(tmp_path):
    step = {"name": "other", "target": "_crypto.derive:cluster_id", "when": "before", "action": "kill"}
    assert _run(tmp_path, step).returncode == 0
    assert not (tmp_path / "fired-other").exists()


def test_injector_patches_methods(tmp_path):
    step = {
        "name": "method",
        "target": "_crypto.root_secrets:RootSecrets.measurement_secret",
        "when": "after",
        "action": "kill",
    }
    code = (
        "from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import RootSecrets; "
        "RootSecrets(bytes(32), bytes(32), bytes(32)).cluster_id()"
    )
    assert _run(tmp_path, step, code).returncode == -signal.SIGKILL


def test_every_listed_step_names_a_real_target():
    root = HERE.parent.parent / "plugins" / "module_utils"
    for step in yaml.safe_load((HERE / "faults.yml").read_text())["steps"]:
        module, attr = step["target"].split(":")
        path = root.joinpath(*module.split("."))
        source = (path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).read_text()
        name = attr.split(".")[-1]
        assert re.search(rf"(def {name}\(|^from .* import .*\b{name}\b)", source, re.MULTILINE), step["name"]
        assert step["expect"] in ("converges", "needs-reset"), step["name"]


@pytest.mark.parametrize("shift", range(3))
def test_scanner_finds_base64_inside_longer_text(shift):
    text = b"prefix" + base64.b64encode(b"x" * shift + SECRET + b"tail") + b"suffix"
    assert Scanner({"s": encodings(SECRET)}).search(text) == ["s"]


@pytest.mark.parametrize(
    "form", [SECRET, SECRET.hex().encode(), SECRET.hex().upper().encode(), base64.urlsafe_b64encode(SECRET)]
)
def test_scanner_finds_each_encoding(form):
    assert Scanner({"s": encodings(SECRET)}).search(b"..." + form + b"...") == ["s"]


def test_scanner_misses_nothing_else():
    assert Scanner({"s": encodings(SECRET)}).search(base64.b64encode(bytes(range(100, 200)))) == []


def test_pem_needles_find_a_key_line_and_the_base64_of_the_pem():
    pem = (
        b"-----BEGIN PRIVATE KEY-----\n"
        + b"\n".join(base64.b64encode(bytes([i] * 48)) for i in range(4))
        + b"\n-----END PRIVATE KEY-----\n"
    )
    scanner = Scanner({"k": pem_needles(pem)})
    assert scanner.search(json.dumps({"x": pem.decode()}).encode()) == ["k"]
    assert scanner.search(b"data: " + base64.b64encode(b"ab" + pem)) == ["k"]


def test_scanner_reports_files_outside_0600_only(tmp_path):
    (tmp_path / "private").write_bytes(SECRET)
    (tmp_path / "private").chmod(0o600)
    (tmp_path / "leak").write_bytes(SECRET.hex().encode())
    (tmp_path / "leak").chmod(0o644)
    scanner = Scanner({"s": encodings(SECRET)})
    scanner.tree(str(tmp_path), "node:/x")
    assert [hit["where"] for hit in scanner.hits] == ["node:/x/leak"]
    assert [hit["where"] for hit in scanner.protected] == ["node:/x/private"]
