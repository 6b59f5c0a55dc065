"""The upgrade role takes a release's values as release_values (kubernetes.core.helm's name) or values (its alias),
and refuses a release that gives both before anything runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))


def test_values_under_both_names_are_refused_naming_the_release(tmp_path):
    releases = [
        {"release_name": "fine", "release_namespace": "apps", "chart_ref": str(tmp_path / "a.tgz"), "values": {"a": 1}},
        {
            "release_name": "twice",
            "release_namespace": "apps",
            "chart_ref": str(tmp_path / "b.tgz"),
            "release_values": {"a": 1},
            "values": {"a": 2},
        },
    ]
    play = [{"hosts": "localhost", "gather_facts": False, "roles": [{"role": "confidential.kubernetes.upgrade"}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"),
        ANSIBLE_NOCOLOR="1",
        TMPDIR=str(tmp_path),
    )
    extra = dict(ansible_python_interpreter=sys.executable, upgrade_releases=releases)
    run = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", "localhost,", "-c", "local", "-e", json.dumps(extra), str(tmp_path / "play.yml")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert run.returncode != 0
    assert "twice: give the values as release_values or as values (its alias), not both" in run.stdout
    assert "fine:" not in run.stdout and "TASK [confidential.kubernetes.upgrade : Plan every release" not in run.stdout
