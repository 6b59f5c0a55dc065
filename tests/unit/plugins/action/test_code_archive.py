"""The code_archive action in a real ansible-playbook run: check mode writes nothing, a run writes the archive once."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from ansible_collections.confidential.kubernetes.plugins.plugin_utils import _code_archive

REPO = Path(__file__).resolve().parents[4]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))


def test_check_mode_writes_nothing_then_a_run_writes_the_archive_once(tmp_path):
    dest = tmp_path / "lib.tar"
    tasks = [
        {"confidential.kubernetes.code_archive": {"dest": str(dest)}, "register": f"pack_{name}", "check_mode": check}
        for name, check in (("checked", True), ("first", False), ("again", False))
    ]
    report = "{{ {'checked': pack_checked, 'first': pack_first, 'again': pack_again} | to_json }}"
    tasks.append({"ansible.builtin.copy": {"content": report, "dest": str(tmp_path / "out.json")}})
    (tmp_path / "play.yml").write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"), ANSIBLE_NOCOLOR="1")
    run = subprocess.run(
        [
            ANSIBLE_PLAYBOOK,
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            str(tmp_path / "play.yml"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    results = json.loads((tmp_path / "out.json").read_text())
    archive = _code_archive.pack()
    digest = hashlib.sha256(archive).hexdigest()
    assert results["checked"]["changed"] is True and results["checked"]["sha256"] == digest
    assert results["first"]["changed"] is True and results["first"]["sha256"] == digest
    assert results["again"]["changed"] is False and results["again"]["dest"] == str(dest)
    assert dest.read_bytes() == archive and dest.stat().st_mode & 0o7777 == 0o644
