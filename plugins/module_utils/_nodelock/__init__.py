# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one-way node lock (DESIGN section 5): unlocked -> locked for one cluster, never back.

Taking the lock writes a lock record (O_EXCL + fsync) and marks the TPM with
TPM2_PCR_Event(15, cluster_id). Every taker first holds an exclusive flock on a
side file, so when init and join race on one node exactly one writes the record
and extends PCR 15; the other finds the record and stops.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
from dataclasses import dataclass

from .._attestation.issuer import Tpm
from .._attestation.policy import NODE_LOCK_PCR, node_lock_mark
from .._files import create_file_exclusively, write_file_atomically
from .._reset import NEEDS_RESET

DEFAULT_RECORD = "/var/lib/confidential-kubernetes/nodelock.json"
RECORD_VERSION = 1
_ZERO = bytes(32)


class NodeLockError(RuntimeError):
    """The node is locked for another cluster, or its lock record and PCR 15 disagree."""


@dataclass(frozen=True)
class LockState:
    locked: bool
    cluster_id: str | None
    pcr15: str
    pcr15_state: str  # "unlocked", "marked", "foreign"
    boot_id: str | None

    def to_result(self) -> dict:
        return {
            "locked": self.locked,
            "cluster_id": self.cluster_id,
            "pcr15": self.pcr15,
            "pcr15_state": self.pcr15_state,
        }


def current_boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return ""


class NodeLock:
    def __init__(self, tpm_factory, record_path: str = DEFAULT_RECORD, boot_id=current_boot_id):
        self._tpm_factory = tpm_factory
        self.record_path = record_path
        self._boot_id = boot_id

    @classmethod
    def for_tcti(cls, tcti: str, record_path: str = DEFAULT_RECORD) -> "NodeLock":
        return cls(lambda: Tpm(tcti), record_path)

    def _pcr15(self) -> bytes:
        with self._tpm_factory() as tpm:
            return tpm.read_pcrs("sha256", (NODE_LOCK_PCR,))[NODE_LOCK_PCR]

    def _read_record(self) -> dict | None:
        try:
            with open(self.record_path, encoding="utf-8") as handle:
                record = json.load(handle)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise NodeLockError(f"lock record {self.record_path} is unreadable ({exc}); {NEEDS_RESET}") from None
        if not isinstance(record, dict) or not isinstance(record.get("cluster_id"), str):
            raise NodeLockError(f"lock record {self.record_path} is malformed; {NEEDS_RESET}")
        return record

    def state(self) -> LockState:
        record = self._read_record()
        pcr15 = self._pcr15()
        cluster_id = record["cluster_id"] if record else None
        if pcr15 == _ZERO:
            pcr15_state = "unlocked"
        elif cluster_id and pcr15 == node_lock_mark(bytes.fromhex(cluster_id)):
            pcr15_state = "marked"
        else:
            pcr15_state = "foreign"
        return LockState(
            record is not None, cluster_id, pcr15.hex(), pcr15_state, record.get("boot_id") if record else None
        )

    def take(self, cluster_id: bytes, check_mode: bool = False) -> tuple[bool, LockState]:
        """Lock the node for ``cluster_id``; returns (changed, state). Idempotent for the same cluster."""
        wanted = cluster_id.hex()
        directory = os.path.dirname(self.record_path) or "."
        os.makedirs(directory, mode=0o700, exist_ok=True)
        with open(self.record_path + ".lock", "a", encoding="utf-8") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            state = self.state()
            if state.locked and state.cluster_id != wanted:
                raise NodeLockError(
                    f"node is already locked for cluster {state.cluster_id}; it cannot join or initialise cluster {wanted}"
                )
            if state.pcr15_state == "foreign":
                raise NodeLockError(
                    f"PCR 15 is {state.pcr15}, which is not the mark of cluster {wanted}: the node was marked by "
                    f"someone else; {NEEDS_RESET}"
                )
            if state.locked and state.pcr15_state == "marked":
                return False, state
            if state.locked and state.boot_id == self._boot_id():
                raise NodeLockError(
                    "lock record exists but PCR 15 was reset within the same boot; the TPM was tampered with, "
                    f"{NEEDS_RESET}"
                )
            if check_mode:
                return True, LockState(True, wanted, node_lock_mark(cluster_id).hex(), "marked", self._boot_id())
            if not state.locked:
                self._write_record(wanted)
            # After a reboot PCR 15 is zero again while the record stays: mark the TPM once more.
            with self._tpm_factory() as tpm:
                tpm.pcr_event(NODE_LOCK_PCR, cluster_id)
            if state.locked:
                self._rewrite_boot_id(wanted)
            return True, self.state()

    def _record(self, cluster_id: str) -> bytes:
        return json.dumps(
            {
                "version": RECORD_VERSION,
                "cluster_id": cluster_id,
                "locked_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                "boot_id": self._boot_id(),
            }
        ).encode()

    def _write_record(self, cluster_id: str) -> None:
        """Create the record complete or not at all (readers without the flock, state(), never see it half written);
        it fails if the record exists, like O_EXCL."""
        create_file_exclusively(self.record_path, self._record(cluster_id), 0o600)

    def _rewrite_boot_id(self, cluster_id: str) -> None:
        write_file_atomically(self.record_path, self._record(cluster_id), 0o600)
