# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Attacks on the etcd snapshots and the measurement rollover by someone who can write the controller's snapshot
directory (or a node's timer directory) or the rollover's commands, but holds no root secret: each is refused, and
the ledger records what the attacker got (a restore of the snapshot it chose, a genuine snapshot deleted, a file
outside the work directory touched, a retired measurement trusted again). The playbook-level runs of the same attacks
are tests/unit/playbooks/test_restore_refusals.py and test_backup_prune.py."""

from __future__ import annotations

import io
import json
import os
import shutil

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import (
    MeasurementPolicy,
    PcrRule,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.rollover import (
    PolicyRollover,
    RolloverError,
    policy_text,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._backup import manifest, snapshot
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import RootSecrets
from ansible_collections.confidential.kubernetes.plugins.module_utils._files import file_sha256
from ansible_collections.confidential.kubernetes.plugins.plugin_utils import _etcd_backups as backups

SECRETS = RootSecrets(bytes(range(32)), bytes(range(32, 64)), bytes(range(64, 96)))
KEY = snapshot.backup_key(SECRETS.master_key, SECRETS.master_salt)
OLD, NEW = "etcd-20261126T080000Z", "etcd-20261126T090000Z"


def _stored(directory, name: str, revision: int) -> None:
    """A snapshot as backup.yml files it: encrypted, fetched beside the directory, stored."""
    directory.mkdir(parents=True, exist_ok=True)
    fetched = directory / ".etcd-snapshot.cksnap"
    plaintext = os.urandom(3000)
    sink = io.BytesIO()
    info = snapshot.encrypt(
        KEY,
        SECRETS.cluster_id(),
        io.BytesIO(plaintext),
        len(plaintext),
        sink,
        snapshot.MIN_CHUNK_SIZE,
        provenance=manifest.provenance(name, revision, 5, 1, "cp-0"),
    )
    fetched.write_bytes(sink.getvalue())
    reported = manifest.from_info(info, fetched.stat().st_size, file_sha256(str(fetched))).to_document()
    backups.store(str(directory), str(fetched), reported, 30, SECRETS)


def _edit(directory, **changes) -> None:
    path = directory / manifest.MANIFEST_FILE
    path.write_text(json.dumps(dict(json.loads(path.read_text()), **changes)))


@pytest.fixture
def two_snapshots(tmp_path):
    _stored(tmp_path, OLD, 40)
    _stored(tmp_path, NEW, 50)
    return tmp_path


def _restored_name(directory, wanted: str = "latest", allow_older: bool = False) -> str | None:
    """What a restore would restore, or None when it is refused."""
    try:
        return backups.select(str(directory), wanted, SECRETS, allow_older)["name"]
    except (manifest.ManifestError, snapshot.SnapshotError):
        return None


def test_latest_repointed_at_an_older_genuine_snapshot(two_snapshots, attack):
    planted = two_snapshots / "etcd-20991231T000000Z"
    shutil.copytree(two_snapshots / OLD, planted)
    _edit(planted, name=planted.name, time="20991231T000000Z")
    chosen = [_restored_name(two_snapshots), _restored_name(two_snapshots, planted.name, allow_older=True)]
    attack.obtained("restores of the older snapshot", sum(name == planted.name or name == OLD for name in chosen))
    assert chosen == [None, None]


def test_planted_far_future_directories_prune_the_genuine_snapshots(two_snapshots, attack):
    shutil.copytree(two_snapshots / OLD, two_snapshots / "etcd-20991231T000000Z")
    (two_snapshots / "etcd-20991230T000000Z").mkdir()
    (two_snapshots / "etcd-20991230T000000Z" / manifest.SNAPSHOT_FILE).write_bytes(os.urandom(4096))
    result = manifest.prune(str(two_snapshots), 2, KEY, SECRETS.cluster_id(), NEW)
    lost = [name for name in (OLD, NEW) if not (two_snapshots / name).is_dir()]
    attack.obtained("genuine snapshots deleted", len(lost))
    assert result["pruned"] == [] and sorted(result["unauthenticated"]) == [
        "etcd-20991230T000000Z",
        "etcd-20991231T000000Z",
    ]


def test_a_manifest_name_traversing_out_of_the_work_directory(two_snapshots, tmp_path_factory, attack):
    outside = tmp_path_factory.mktemp("elsewhere")
    victim = outside / "victim.cksnap"
    victim.write_bytes(b"not the restore's")
    _edit(two_snapshots / NEW, name=f"../../../../../..{outside}/victim")
    try:
        name = backups.select(str(two_snapshots), NEW, SECRETS)["name"]
    except manifest.ManifestError:
        name = None
    attack.obtained("names outside the work directory", int(name is not None and name != NEW))
    assert name is None and victim.read_bytes() == b"not the restore's"


@pytest.mark.parametrize("field, value", [("revision", 51), ("time", "20261126T100000Z"), ("member", "cp-1")])
def test_a_tampered_manifest_field(two_snapshots, attack, field, value):
    _edit(two_snapshots / NEW, **{field: value})
    attack.obtained("tampered manifests accepted", int(_restored_name(two_snapshots, NEW) is not None))


def test_an_older_snapshot_restored_without_force(two_snapshots, attack):
    attack.obtained("restores of an older snapshot without force", int(_restored_name(two_snapshots, OLD) == OLD))


def test_a_rollback_after_retire_trusts_the_retired_values_again(tmp_path, attack):
    old, new = bytes(32), bytes([1]) * 32
    policy_file = tmp_path / "measurement-policy.yml"
    policy_file.write_bytes(policy_text(MeasurementPolicy("sha256", {8: PcrRule(8, (old,), False)}, "pcrs-only")))
    PolicyRollover(str(policy_file)).add(MeasurementPolicy("sha256", {8: PcrRule(8, (new,), False)}), "golden-0")
    PolicyRollover(str(policy_file)).retire({}, [])
    retired = policy_file.read_bytes()
    with pytest.raises(RolloverError, match="measurements_force=true"):
        PolicyRollover(str(policy_file)).rollback({})
    attack.obtained("retired values trusted again", int(old.hex() in policy_file.read_text()))
    assert policy_file.read_bytes() == retired
