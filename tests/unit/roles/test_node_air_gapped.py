"""An air-gapped site (confidential_air_gapped): the node role's apt tasks (tasks/apt.yml) reach no public mirror. Run
with real ansible-playbook on this host, against its real dpkg database."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
MIRROR_LIST = "/etc/apt/sources.list.d/confidential-kubernetes-mirror.list"
# No Debian package has this name; coreutils is on every Debian host.
ABSENT = "confidential-kubernetes-no-such-package"

pytestmark = pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="not a Debian host (no dpkg-query)")


def _play(tmp_path: Path, packages: list[str], **extra) -> subprocess.CompletedProcess:
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "localhost",
                    "gather_facts": False,
                    "vars_files": [str(REPO / "roles" / "node" / "defaults" / "main.yml")],
                    "tasks": yaml.safe_load((REPO / "roles" / "node" / "tasks" / "apt.yml").read_text()),
                }
            ]
        )
    )
    variables = dict(ansible_python_interpreter=sys.executable, __node_apt_packages=packages, **extra)
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"), ANSIBLE_NOCOLOR="1")
    return subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", "localhost,", "-c", "local", "-e", json.dumps(variables), str(playbook)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def test_without_a_site_mirror_the_missing_package_is_refused_by_name_and_nothing_changes(tmp_path):
    lists = sorted(p.name for p in Path("/var/lib/apt/lists").glob("*")) if Path("/var/lib/apt/lists").exists() else []
    run = _play(tmp_path, ["coreutils", ABSENT], confidential_air_gapped=True)
    assert run.returncode != 0
    assert f"lacks the Debian packages {ABSENT}, and this is an air-gapped site" in run.stdout, run.stdout
    assert "coreutils" not in run.stdout.split("lacks the Debian packages", 1)[1].split(",")[0]
    # The one task before the refusal asks dpkg; nothing after it ran.
    assert _recap(run.stdout) == {"ok": 1, "changed": 0, "failed": 1, "skipped": 0}, run.stdout
    assert not Path(MIRROR_LIST).exists()
    assert (sorted(p.name for p in Path("/var/lib/apt/lists").glob("*")) if lists else []) == lists


def test_an_air_gapped_node_that_has_every_package_runs_no_apt(tmp_path):
    run = _play(tmp_path, ["coreutils", "dpkg"], confidential_air_gapped=True)
    assert run.returncode == 0, run.stdout + run.stderr
    # dpkg was asked; the refusal, the mirror, the update and both installs were skipped.
    assert _recap(run.stdout) == {"ok": 1, "changed": 0, "failed": 0, "skipped": 5}, run.stdout


def _recap(stdout: str) -> dict:
    line = next(line for line in stdout.splitlines() if line.startswith("localhost") and "ok=" in line)
    counts = dict(field.split("=") for field in line.split(":", 1)[1].split())
    return {key: int(counts[key]) for key in ("ok", "changed", "failed", "skipped")}
