# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""split_secrets.yml, and restore.yml from k shares instead of the secrets file, run for real by ansible-playbook on
local hosts: restore.yml's controller steps (check the snapshot with the reconstructed key, derive the cluster ID) run
before its confirmation refusal, so the refusal naming the cluster proves the reconstruction; no node task runs."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import RootSecrets
from ansible_collections.confidential.kubernetes.plugins.plugin_utils import _shares

from test_restore_refusals import CLUSTER_ID, GOOD, SECRETS, _stored

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))


def _play(site: Path, playbook: str, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"), ANSIBLE_NOCOLOR="1")
    run = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(site / "inventory.yml"), f"confidential.kubernetes.{playbook}", *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert "TASK [confidential.kubernetes.restore : Find the etcd static pod" not in run.stdout, run.stdout
    return run


def _tree(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


def _no_secret_in(files: dict[str, bytes]) -> None:
    for value in (SECRETS.master_key, SECRETS.master_salt, SECRETS.measurement_salt):
        for encoded in (value, value.hex().encode(), base64.b64encode(value), _shares._b64(value).encode()):
            assert not any(encoded in data for data in files.values()), "a root secret is on the controller's disk"


@pytest.fixture
def split_site(local_site):
    """A site whose secrets were split 3-of-5 by split_secrets.yml and whose plain secrets file was removed."""
    site = local_site(SECRETS, {"cp-0": "192.0.2.10", "cp-1": "192.0.2.11"}, {})
    _stored(site / "backups", GOOD)
    run = _play(
        site,
        "split_secrets",
        "-e",
        "split_threshold=3",
        "-e",
        "split_count=5",
        "-e",
        "split_remove_plain=true",
        "-e",
        f"confirm_remove={CLUSTER_ID}",
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return site


def test_split_writes_n_private_share_files_any_k_of_which_reconstruct(split_site):
    files = sorted((split_site / "shares").iterdir())
    assert [path.name for path in files] == [f"share-{i}-of-5.txt" for i in range(1, 6)]
    assert all(stat.S_IMODE(path.stat().st_mode) == 0o600 for path in files)
    assert stat.S_IMODE((split_site / "shares").stat().st_mode) == 0o700
    shares = [_shares.Share.parse(path.read_text(), path.name) for path in files]
    assert _shares.combine([shares[4], shares[0], shares[2]]) == SECRETS


def test_the_removed_plain_file_is_a_marker_with_no_secret(split_site):
    marker = json.loads((split_site / "secrets" / "cluster-secrets.json").read_text())
    assert marker == {"split_into_shares": {"cluster_id": CLUSTER_ID, "threshold": 3, "count": 5}}
    _no_secret_in(_tree(split_site))


def test_removing_the_plain_file_needs_the_cluster_id(local_site):
    site = local_site(SECRETS, {"cp-0": "192.0.2.10"}, {})
    before = (site / "secrets" / "cluster-secrets.json").read_bytes()
    run = _play(site, "split_secrets", "-e", "split_remove_plain=true", "-e", "confirm_remove=yes")
    assert run.returncode != 0 and f"confirm with the cluster ID {CLUSTER_ID}" in run.stdout, run.stdout
    assert (site / "secrets" / "cluster-secrets.json").read_bytes() == before


def test_a_second_split_into_the_same_directory_is_refused(split_site):
    (split_site / "secrets" / "cluster-secrets.json").write_text(json.dumps(SECRETS.to_document()))
    before = _tree(split_site / "shares")
    run = _play(split_site, "split_secrets", "-e", "split_threshold=3", "-e", "split_count=5")
    assert run.returncode != 0 and "a split is never written over another" in run.stdout, run.stdout
    assert _tree(split_site / "shares") == before


def _share_files(site: Path, *indexes: int) -> str:
    return json.dumps({"confidential_share_files": [str(site / "shares" / f"share-{i}-of-5.txt") for i in indexes]})


def test_restore_reconstructs_from_k_shares_in_memory_and_writes_nothing(split_site):
    before = _tree(split_site)
    run = _play(split_site, "restore", "-e", _share_files(split_site, 5, 2, 3))
    # The snapshot was checked with the reconstructed key and the confirmation names the reconstructed cluster's ID.
    assert run.returncode != 0 and f"Confirm with -e confirm_restore={CLUSTER_ID}" in run.stdout, run.stdout
    assert "snapshot refused" not in run.stdout
    after = _tree(split_site)
    assert after == before
    _no_secret_in(after)
    assert not any(
        word in run.stdout + run.stderr for word in ("ck-share-v1.", base64.b64encode(SECRETS.master_key).decode())
    )


def test_restore_without_shares_says_the_secrets_were_split(split_site):
    run = _play(split_site, "restore")
    assert run.returncode != 0 and "they were split into 3-of-5 break-glass shares" in run.stdout, run.stdout


def test_restore_refuses_k_minus_one_shares(split_site):
    run = _play(split_site, "restore", "-e", _share_files(split_site, 1, 4))
    assert run.returncode != 0 and "2 share(s) given, 3 of 5 needed: nothing was reconstructed" in run.stdout, (
        run.stdout
    )


def test_restore_names_a_share_of_another_cluster(split_site):
    stranger = _shares.split(RootSecrets(bytes(32), bytes(32), bytes(32)), 3, 5)[1]
    path = split_site / "shares-of-another-cluster.txt"
    path.write_text(stranger.file_text())
    path.chmod(0o600)
    files = json.loads(_share_files(split_site, 1, 2))["confidential_share_files"] + [str(path)]
    run = _play(split_site, "restore", "-e", json.dumps({"confidential_share_files": files}))
    assert run.returncode != 0 and f"share file {path} is a share of another cluster" in run.stdout, run.stdout


def test_restore_names_a_corrupted_share(split_site):
    path = split_site / "shares" / "share-2-of-5.txt"
    text = path.read_text()
    line = text.splitlines()[-1]
    position = len(line) // 2
    path.write_text(
        text.replace(line, line[:position] + ("A" if line[position] != "A" else "B") + line[position + 1 :])
    )
    run = _play(split_site, "restore", "-e", _share_files(split_site, 1, 2, 3))
    assert run.returncode != 0 and f"share file {path} is damaged" in run.stdout, run.stdout


def test_a_share_readable_by_others_is_refused(split_site):
    path = split_site / "shares" / "share-3-of-5.txt"
    path.chmod(0o644)
    run = _play(split_site, "restore", "-e", _share_files(split_site, 1, 2, 3))
    assert run.returncode != 0 and f"share file {path} has mode 0644" in run.stdout, run.stdout


def test_a_re_split_from_k_shares_needs_no_plain_file(split_site):
    new_dir = split_site / "new-shares"
    run = _play(
        split_site,
        "split_secrets",
        "-e",
        "split_threshold=2",
        "-e",
        "split_count=3",
        "-e",
        f"split_share_dir={new_dir}",
        "-e",
        _share_files(split_site, 2, 4, 5),
    )
    assert run.returncode == 0, run.stdout + run.stderr
    new = [_shares.Share.parse(path.read_text(), path.name) for path in sorted(new_dir.iterdir())]
    assert [share.index for share in new] == [1, 2, 3] and _shares.combine(new[1:]) == SECRETS
    assert json.loads((split_site / "secrets" / "cluster-secrets.json").read_text())["split_into_shares"]
    _no_secret_in(_tree(split_site))
