"""The kubernetes_host_packages filter: a row's host packages, by the versions table's parser, in a real play."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from ansible_collections.confidential.kubernetes.plugins.filter.kubernetes_host_packages import kubernetes_host_packages
from ansible_collections.confidential.kubernetes.plugins.module_utils import _versions

REPO = Path(__file__).resolve().parents[4]
TABLE = _versions.load_table()


def test_each_row_gives_its_packages_and_an_unknown_version_none():
    for version, row in TABLE.items():
        assert kubernetes_host_packages(version) == row["host_packages"]
        assert kubernetes_host_packages("v" + version) == row["host_packages"]
    assert kubernetes_host_packages("1.2.3") == [] and kubernetes_host_packages("") == []


def test_an_inventory_row_is_merged_over_the_table_and_a_bad_one_gives_none():
    assert kubernetes_host_packages("1.20.2", {"1.20.2": {"host_packages": ["conntrack", "socat"]}}) == [
        "conntrack",
        "socat",
    ]
    assert kubernetes_host_packages("1.20.2", {"1.20.2": {"host_packages": ["rm -rf /"]}}) == []
    assert kubernetes_host_packages("1.20.2", {"1.20.2": {}}) == []


def test_the_filter_in_a_play(tmp_path):
    version = next(v for v, row in TABLE.items() if row["host_packages"])
    out = tmp_path / "out.json"
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "localhost",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "ansible.builtin.copy": {
                                "dest": str(out),
                                "content": f"{{{{ '{version}' | confidential.kubernetes.kubernetes_host_packages | to_json }}}}",
                            }
                        }
                    ],
                }
            ]
        )
    )
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"), ANSIBLE_NOCOLOR="1")
    run = subprocess.run(
        [
            str(Path(sys.executable).with_name("ansible-playbook")),
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            str(playbook),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(out.read_text()) == TABLE[version]["host_packages"]
