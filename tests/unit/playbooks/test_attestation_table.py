"""verify.yml's attestation table, rendered by ansible-playbook from results the verifier returns: a node whose PCR
fails the policy is followed by the events that differ from the golden log, a node whose log does not replay by
the PCRs it does not replay to."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
CHANGED = {
    "pcr": 8,
    "change": "changed",
    "type": "EV_IPL",
    "description": "kernel_cmdline: ro -> kernel_cmdline: ro x=1",
    "old_digest": "aa" * 32,
    "new_digest": "bb" * 32,
    "summary": "PCR 8: EV_IPL kernel_cmdline: ro -> kernel_cmdline: ro x=1 digest changed",
}
RESULTS = {
    "cp-0": {"verified": True, "reason": "ok", "pcrs": {"15": "00" * 32}, "mismatches": [], "warnings": []},
    "worker-0": {
        "verified": False,
        "reason": "pcr-policy",
        "warnings": [],
        "mismatches": [
            {"pcr": 8, "actual": "bb" * 32, "allowed": ["cc" * 32], "warn_only": False, "events": [CHANGED]}
        ],
    },
    "worker-1": {
        "verified": False,
        "reason": "event-log-mismatch",
        "warnings": [],
        "mismatches": [{"pcr": 9, "bank": "sha256", "quoted": "dd" * 32, "replayed": "ee" * 32}],
    },
}


TEMPLATE = REPO / "playbooks" / "templates" / "attestation_table.j2"
RENDER = f"{{{{ lookup('ansible.builtin.template', '{TEMPLATE}') }}}}"


def test_the_table_names_the_differing_event_and_the_pcrs_a_log_does_not_replay_to(tmp_path):
    inventory = {
        "all": {
            "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
            "children": {
                "control_plane": {"hosts": {"cp-0": {}}},
                "workers": {"hosts": {"worker-0": {}, "worker-1": {}}},
            },
        }
    }
    play = [
        {
            "hosts": "all",
            "gather_facts": False,
            "vars": {"verify_cluster_exists": False, "verify_fresh_hosts": [], "results": RESULTS},
            "tasks": [
                {"ansible.builtin.set_fact": {"verify_result": "{{ results[inventory_hostname] }}"}},
                {"ansible.builtin.copy": {"content": RENDER, "dest": str(tmp_path / "table.txt")}, "run_once": True},
            ],
        }
    ]
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "play.yml").write_text(json.dumps(play))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"), ANSIBLE_NOCOLOR="1")
    run = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(tmp_path / "inventory.yml"), str(tmp_path / "play.yml")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    lines = (tmp_path / "table.txt").read_text().splitlines()
    rows = {line.split()[0]: line for line in lines if line and not line.startswith(" ")}
    assert rows["worker-0"].split() == ["worker-0", "worker", "FAILED", "unlocked", "8", "?", "pcr-policy"]
    below_worker_0 = lines[lines.index(rows["worker-0"]) + 1]
    assert below_worker_0 == (
        f"    PCR 8: EV_IPL kernel_cmdline: ro -> kernel_cmdline: ro x=1 digest changed "
        f"(old {'aa' * 32}, new {'bb' * 32})"
    )
    below_worker_1 = lines[lines.index(rows["worker-1"]) + 1]
    assert below_worker_1 == f"    PCR 9 (sha256): the event log replays to {'ee' * 32}, the TPM quoted {'dd' * 32}"
    assert "event-log-mismatch" in rows["worker-1"]
    assert lines[lines.index(rows["cp-0"]) + 1].startswith("worker-")  # nothing below a node that passed
