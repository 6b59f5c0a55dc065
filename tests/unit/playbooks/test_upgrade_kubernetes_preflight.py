# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""upgrade_kubernetes.yml decides before anything changes: run for real by ansible-playbook with local hosts standing
in for the nodes and a scripted kubectl answering for the API. A refused upgrade lists every problem and runs no later
step (no certificate check, no artefact fetch, no snapshot, no node touched)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import RootSecrets

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
SECRETS = RootSecrets(bytes(range(32)), bytes(range(32, 64)), bytes(range(64, 96)))


def _node(name: str, version: str, ready: str = "True") -> dict:
    return {
        "metadata": {"name": name},
        "status": {"nodeInfo": {"kubeletVersion": version}, "conditions": [{"type": "Ready", "status": ready}]},
    }


@pytest.fixture
def api(tmp_path):
    """A kubectl on PATH that answers get nodes, version and /readyz/etcd from files the test writes."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").write_text(
        "#!/bin/sh\n"
        f'cd "{tmp_path}/api"\n'
        'case "$*" in\n'
        '  *"get nodes"*) cat nodes.json ;;\n'
        '  *" version "*) cat version.json ;;\n'
        "  *readyz/etcd*) cat etcd.txt ;;\n"
        '  *) echo "kubectl stand-in: unexpected: $*" >&2; exit 1 ;;\n'
        "esac\n"
    )
    (bin_dir / "kubectl").chmod(0o755)
    (tmp_path / "api").mkdir()

    def answer(nodes: list[dict], server: str, etcd: str = "ok") -> None:
        (tmp_path / "api" / "nodes.json").write_text(json.dumps({"items": nodes}))
        (tmp_path / "api" / "version.json").write_text(json.dumps({"serverVersion": {"gitVersion": server}}))
        (tmp_path / "api" / "etcd.txt").write_text(etcd + "\n")

    return answer


def _upgrade(site: Path, version: str, *extra: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"),
        ANSIBLE_NOCOLOR="1",
        PATH=f"{site / 'bin'}:{os.environ['PATH']}",
    )
    return subprocess.run(
        [
            ANSIBLE_PLAYBOOK,
            "-i",
            str(site / "inventory.yml"),
            "confidential.kubernetes.upgrade_kubernetes",
            "-e",
            f"kubernetes_version={version}",
            *extra,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize(
    ("nodes", "server", "etcd", "target", "expected"),
    [
        (
            [_node("cp-0", "v1.20.2"), _node("worker-1", "v1.20.2")],
            "v1.20.2",
            "ok",
            "1.22.0",
            ["v1.22.0 is more than one minor above the control plane's v1.20.2"],
        ),
        (
            [_node("cp-0", "v1.20.2"), _node("worker-1", "v1.20.2", "Unknown")],
            "v1.20.2",
            "[-]etcd failed: reason withheld",
            "1.20.3-lab.1",
            [
                "v1.20.3-lab.1 is a pre-release, which kubeadm upgrade treats as unstable",
                "node worker-1 is not Ready",
                "etcd is not healthy (/readyz/etcd of the API server says: [-]etcd failed: reason withheld",
            ],
        ),
    ],
    ids=["two minors", "pre-release, a node not Ready, etcd unhealthy"],
)
def test_a_refused_upgrade_names_every_problem_and_changes_nothing(
    local_site, api, nodes, server, etcd, target, expected
):
    site = local_site(SECRETS, {"cp-0": "192.0.2.10"}, {"worker-1": "192.0.2.21"})
    api(nodes, server, etcd)
    run = _upgrade(site, target)
    output = " ".join(run.stdout.split())
    assert run.returncode != 0, run.stdout
    assert f"The upgrade from {server} to {target} may not start, and nothing was changed" in output, run.stdout
    for problem in expected:
        assert problem in output, run.stdout
    for later in ("Read when each node's certificates expire", "Take an encrypted etcd snapshot", "Upgrade this node"):
        assert later not in run.stdout, run.stdout
    assert not (site / "backups").exists()
