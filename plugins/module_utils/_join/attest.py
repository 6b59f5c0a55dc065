# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Continuous attestation (DESIGN section 8), the facts both sides share and the rules of the judgement, without I/O.

A member re-attests with the AK proven at its join: the service recorded that AK's name beside the node's binding at
credential activation (``AttestationRecord.ak_name``), so a re-attestation needs no activation. The evidence's
``user_data`` is ``ATTEST_USER_DATA_PREFIX`` followed by the 32-byte EK identity: the quote names the TPM it speaks for.
The quote's clockInfo (signed, in TPMS_ATTEST) is compared with the node's last accepted quote (``judge_clock``): a
reset or restart the node did not come back through (a join or rejoin records the new counters) fails the node, a
clock going backwards is refused.

One record per EK in the cluster's API (``attest_state.ApiAttestationRecords``) holds what every control plane's join
service needs: the AK name, the counters, the last verdict, and the quarantine.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field, replace
from typing import NamedTuple

ATTEST_USER_DATA_PREFIX = b"confidential.kubernetes/attest/v1"
EK_IDENTITY_BYTES = 32
PASSED = "passed"
FAILED = "failed"
ENROLLED = "enrolled"
RESULTS = (PASSED, FAILED, ENROLLED)
QUARANTINE = "quarantine"
TAINT = "taint"
REPORT = "report"
FAILURE_ACTIONS = (QUARANTINE, TAINT, REPORT)
# Verification failures a genuine TPM can state (the quote verified with the node's own AK): they fail the node.
# Every other VerificationError is a refusal of the evidence that changes nobody's state.
NODE_FAILURES = frozenset({"pcr-policy", "event-log-mismatch"})
TPM_RESET = "tpm-reset"
CLOCK_BACKWARDS = "clock-backwards"
SILENT = "silent"
MAX_MISMATCHES_BYTES = 16 * 1024


class ClockInfo(NamedTuple):
    """TPMS_CLOCK_INFO of a quote: milliseconds the TPM has run, its reset and restart counters, the safe flag."""

    clock: int
    reset_count: int
    restart_count: int
    safe: bool


def attest_user_data(ek_identity: str) -> bytes:
    """What a member quotes for continuous attestation: the prefix and its EK identity (hex in, bytes quoted)."""
    return ATTEST_USER_DATA_PREFIX + bytes.fromhex(ek_identity)


def quoted_identity(user_data: bytes) -> str | None:
    """The EK identity a continuous-attestation ``user_data`` names (hex), or None when it is not one."""
    if len(user_data) != len(ATTEST_USER_DATA_PREFIX) + EK_IDENTITY_BYTES:
        return None
    if not user_data.startswith(ATTEST_USER_DATA_PREFIX):
        return None
    return user_data[len(ATTEST_USER_DATA_PREFIX) :].hex()


def judge_clock(previous: ClockInfo | None, now: ClockInfo) -> tuple[str, str] | None:
    """None when ``now`` may follow ``previous``; else (reason, message): ``tpm-reset`` (a failure of the node) or
    ``clock-backwards`` (a refusal)."""
    if previous is None:
        return None
    if (now.reset_count, now.restart_count) != (previous.reset_count, previous.restart_count):
        return (
            TPM_RESET,
            f"the TPM was reset or restarted (resetCount {previous.reset_count} -> {now.reset_count}, restartCount "
            f"{previous.restart_count} -> {now.restart_count}) and the node did not come back through a rejoin",
        )
    if now.clock < previous.clock:
        return (
            CLOCK_BACKWARDS,
            f"the TPM clock went backwards ({previous.clock} ms in the last accepted quote, {now.clock} ms now): "
            "a replayed or rolled-back TPM state",
        )
    return None


def utc_stamp(when: datetime.datetime) -> str:
    """A record's time (RFC 3339, microseconds: a release compares a pass with the quarantine's start)."""
    return when.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_stamp(text: str) -> datetime.datetime | None:
    for layout in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.datetime.strptime(text, layout).replace(tzinfo=datetime.timezone.utc)
        except (TypeError, ValueError):
            continue
    return None


class RecordError(ValueError):
    """A stored attestation record is unreadable; the message names the field."""


@dataclass(frozen=True)
class AttestationRecord:
    """One node's continuous-attestation state, keyed by its EK identity. Nothing in it is secret."""

    ek: str
    node_name: str
    ak_name: str
    clock: ClockInfo
    # When the last evidence was accepted (passed or failed), and when the last one passed.
    attested_at: str = ""
    passed_at: str = ""
    result: str = ENROLLED
    reason: str = ""
    message: str = ""
    mismatches: list[dict] = field(default_factory=list)
    # Since when the EK is quarantined ("" when it is not) and why; whether the acting service enforced the verdict.
    quarantined_at: str = ""
    quarantine_reason: str = ""
    enforced: bool = False
    control_plane: bool = False

    @property
    def quarantined(self) -> bool:
        return bool(self.quarantined_at)

    def to_document(self) -> dict[str, str]:
        mismatches = json.dumps(self.mismatches, sort_keys=True)
        if len(mismatches) > MAX_MISMATCHES_BYTES:
            mismatches = json.dumps([{"pcr": m.get("pcr")} for m in self.mismatches])
        return {
            "ek": self.ek,
            "node_name": self.node_name,
            "ak_name": self.ak_name,
            "clock": str(self.clock.clock),
            "reset_count": str(self.clock.reset_count),
            "restart_count": str(self.clock.restart_count),
            "safe": "true" if self.clock.safe else "false",
            "attested_at": self.attested_at,
            "passed_at": self.passed_at,
            "result": self.result,
            "reason": self.reason,
            "message": self.message[:1024],
            "mismatches": mismatches,
            "quarantined_at": self.quarantined_at,
            "quarantine_reason": self.quarantine_reason[:1024],
            "enforced": "true" if self.enforced else "false",
            "control_plane": "true" if self.control_plane else "false",
        }

    @classmethod
    def from_document(cls, data: object, where: str) -> "AttestationRecord":
        if not isinstance(data, dict):
            raise RecordError(f"{where} holds no data")

        def text(name: str) -> str:
            value = data.get(name, "")
            if not isinstance(value, str):
                raise RecordError(f"{where}: {name} is not a string")
            return value

        def number(name: str) -> int:
            value = text(name)
            if not value.isdigit():
                raise RecordError(f"{where}: {name} {value!r} is not a count")
            return int(value)

        try:
            mismatches = json.loads(text("mismatches") or "[]")
        except ValueError:
            raise RecordError(f"{where}: mismatches is not JSON") from None
        if not isinstance(mismatches, list):
            raise RecordError(f"{where}: mismatches is not a list")
        result = text("result")
        if result not in RESULTS:
            raise RecordError(f"{where}: result {result!r} is not one of {', '.join(RESULTS)}")
        ek, ak_name = text("ek"), text("ak_name")
        if len(ek) != 2 * EK_IDENTITY_BYTES or not ak_name:
            raise RecordError(f"{where}: ek or ak_name is missing")
        return cls(
            ek,
            text("node_name"),
            ak_name,
            ClockInfo(number("clock"), number("reset_count"), number("restart_count"), text("safe") == "true"),
            text("attested_at"),
            text("passed_at"),
            result,
            text("reason"),
            text("message"),
            mismatches,
            text("quarantined_at"),
            text("quarantine_reason"),
            text("enforced") == "true",
            text("control_plane") == "true",
        )

    def enrolled(self, node_name: str, ak_name: str, clock: ClockInfo, now: str, control_plane: bool):
        """The record after a join or rejoin (its evidence verified, its AK proven by activation): that AK and the TPM's
        counters now. A quarantine stays: an operator releases a node, a rejoin does not (a quarantined EK gets none)."""
        return replace(
            self,
            node_name=node_name,
            ak_name=ak_name,
            clock=clock,
            passed_at=now,
            attested_at=now,
            result=ENROLLED,
            reason="",
            message="",
            mismatches=[],
            control_plane=control_plane,
        )
