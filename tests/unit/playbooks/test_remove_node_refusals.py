# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""remove_node.yml checks the confirmation through the reset role's confirm entry point before it drains anything: run
for real by ansible-playbook with local hosts standing in for the nodes (no node task may run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import RootSecrets

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
SECRETS = RootSecrets(bytes(range(32)), bytes(range(32, 64)), bytes(range(64, 96)))
CLUSTER_ID = SECRETS.cluster_id().hex()


@pytest.fixture
def site(local_site):
    return local_site(SECRETS, {"cp-0": "192.0.2.10"}, {"worker-1": "192.0.2.21"})


def _remove_node(site: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"), ANSIBLE_NOCOLOR="1")
    run = subprocess.run(
        [
            ANSIBLE_PLAYBOOK,
            "-i",
            str(site / "inventory.yml"),
            "confidential.kubernetes.remove_node",
            "-e",
            "remove_node=worker-1",
            *extra,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert "Choose a ready control plane for kubectl" not in run.stdout, run.stdout
    return run


@pytest.mark.parametrize("extra", [(), ("-e", "confirm_reset=yes-reset-cp-0")], ids=["none", "another node's"])
def test_without_the_confirmation_it_names_both_that_would_do(site, extra):
    run = _remove_node(site, *extra)
    assert run.returncode != 0
    assert "Validating arguments against arg spec 'confirm'" in run.stdout
    assert (
        f"Confirm with -e confirm_reset=yes-reset-worker-1 or, for every node of this cluster, -e confirm_reset={CLUSTER_ID}"
        in " ".join(run.stdout.split())
    )
