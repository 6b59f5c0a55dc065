"""The node lock against real swtpm instances."""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.issuer import Tpm
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import node_lock_mark
from ansible_collections.confidential.kubernetes.plugins.module_utils._nodelock import NodeLock, NodeLockError

CLUSTER = bytes.fromhex("128c164378fe8767f998fbdfe4b4d6463ec5ae1b664ea5999bc27417607ae9b6")
DESIGN_PCR15 = "23400370357e846478cce7cc0c76cdfe4da077cc57b36dee0f665ede2c8b3f2f"


def _lock(swtpm, tmp_path, boot_id="boot-1"):
    return NodeLock(lambda: Tpm(swtpm.tcti), str(tmp_path / "state" / "nodelock.json"), boot_id=lambda: boot_id)


def _pcr15(swtpm) -> str:
    with Tpm(swtpm.tcti) as tpm:
        return tpm.read_pcrs("sha256", (15,))[15].hex()


def test_fresh_node_is_unlocked(swtpm, tmp_path):
    state = _lock(swtpm, tmp_path).state()
    assert (state.locked, state.pcr15_state, state.pcr15) == (False, "unlocked", "00" * 32)


def test_taking_the_lock_marks_pcr15_with_the_design_vector(swtpm, tmp_path):
    changed, state = _lock(swtpm, tmp_path).take(CLUSTER)
    assert changed and state.locked and state.pcr15_state == "marked"
    assert _pcr15(swtpm) == DESIGN_PCR15 == node_lock_mark(CLUSTER).hex()
    record = tmp_path / "state" / "nodelock.json"
    assert json.loads(record.read_text())["cluster_id"] == CLUSTER.hex()
    assert oct(record.stat().st_mode & 0o777) == "0o600"


def test_same_cluster_again_changes_nothing(swtpm, tmp_path):
    lock = _lock(swtpm, tmp_path)
    lock.take(CLUSTER)
    changed, state = lock.take(CLUSTER)
    assert not changed and state.pcr15_state == "marked"
    assert _pcr15(swtpm) == DESIGN_PCR15


def test_another_cluster_is_refused_and_nothing_changes(swtpm, tmp_path):
    lock = _lock(swtpm, tmp_path)
    lock.take(CLUSTER)
    with pytest.raises(NodeLockError, match="already locked for cluster 128c1643"):
        lock.take(os.urandom(32))
    assert _pcr15(swtpm) == DESIGN_PCR15


def test_check_mode_predicts_and_changes_nothing(swtpm, tmp_path):
    changed, state = _lock(swtpm, tmp_path).take(CLUSTER, check_mode=True)
    assert changed and state.pcr15 == DESIGN_PCR15
    assert _pcr15(swtpm) == "00" * 32
    assert not (tmp_path / "state" / "nodelock.json").exists()


def test_pcr15_marked_by_someone_else_is_refused(swtpm, tmp_path):
    with Tpm(swtpm.tcti) as tpm:
        tpm.pcr_event(15, b"another tool")
    with pytest.raises(NodeLockError, match=r"needs a reset: .*confidential.kubernetes.reset .*confirm_reset"):
        _lock(swtpm, tmp_path).take(CLUSTER)
    assert not (tmp_path / "state" / "nodelock.json").exists()


def test_after_a_reboot_the_same_cluster_marks_the_tpm_again(swtpm, tmp_path, start_swtpm):
    _lock(swtpm, tmp_path, boot_id="boot-1").take(CLUSTER)
    swtpm.stop()
    rebooted = start_swtpm()  # the same manufactured TPM, PCRs reset
    changed, state = _lock(rebooted, tmp_path, boot_id="boot-2").take(CLUSTER)
    assert changed and state.pcr15_state == "marked"
    assert _pcr15(rebooted) == DESIGN_PCR15


def test_pcr15_reset_within_the_same_boot_is_refused(swtpm, tmp_path, start_swtpm):
    _lock(swtpm, tmp_path, boot_id="boot-1").take(CLUSTER)
    reset = start_swtpm()
    with pytest.raises(NodeLockError, match="tampered"):
        _lock(reset, tmp_path, boot_id="boot-1").take(CLUSTER)


def test_a_failed_record_write_leaves_no_half_record(swtpm, tmp_path, monkeypatch):
    """Found by the race suite (tests/security/race.py): the record used to appear empty before it was written, so a
    concurrent state() (join_ticket's first step) or a crash mid-write left a node that 'needs a reset'."""
    from ansible_collections.confidential.kubernetes.plugins.module_utils import _nodelock

    def failing_fsync(fd):  # where a full disk shows itself at the latest
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_nodelock.os, "fsync", failing_fsync)
    with pytest.raises(OSError):
        _lock(swtpm, tmp_path).take(CLUSTER)
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["nodelock.json.lock"]
    assert _lock(swtpm, tmp_path).state().locked is False
    assert _lock(swtpm, tmp_path).take(CLUSTER)[0] and _pcr15(swtpm) == DESIGN_PCR15
