# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Attest RPC's work, independent of gRPC: judge a running member's evidence and record the verdict.

In order, each refusal changing nobody's state: the nonce is this service's, fresh and unused; a worker verifies the
evidence with the join flow's verifier (``JoinCrypto.attest``: the current policy, PCR 15 this cluster's mark); the EK
has a record and the quoting AK is the one proven at its join (another AK is refused ``ak-unknown``: the node re-proves
it by a rejoin, whose credential activation records it); the node's last evidence is at least half an interval old;
the nonce is used; the TPM's counters follow the last accepted quote's. Only then the verdict - passed, or failed
(PCRs, event log, a TPM reset the node did not come back through) - is written to the node's record and its Node
condition. Evidence that fails no check of the quote but cannot be attributed to the node's own AK never counts
against it: a node can only fail by its own TPM's word.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from dataclasses import replace
from typing import Callable

from .._attestation.nonces import NonceLimitError
from .._attestation.verifier import VerificationError
from .attest import CLOCK_BACKWARDS, FAILED, PASSED, AttestationRecord, judge_clock, parse_stamp, utc_stamp
from .attest_state import ApiAttestationRecords, AttestationStateError, NodeActions
from .crypto import AttestCheck, Attested, Refusal

PASSED_REASON = "Attested"
# A record that could not be written at an activation is tried again this often, this many times (an hour).
ENROL_RETRY_DELAY = 10.0
ENROL_RETRIES = 360


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


class AttestJudge:
    """Decides and records continuous attestations; ``issuer`` supplies the nonces and the policy."""

    def __init__(
        self,
        issuer,
        records: ApiAttestationRecords,
        nodes: NodeActions,
        interval: float,
        now: Callable[[], datetime.datetime] = _now,
        clock: Callable[[], float] = time.monotonic,
        on_failure: Callable[[], None] = lambda: None,
    ):
        self._issuer = issuer
        self.records = records
        self.nodes = nodes
        self.interval = interval
        self._now = now
        self._clock = clock
        self._on_failure = on_failure
        # Per EK: when its last evidence was accepted here (the record holds it for every service).
        self._last: dict[str, float] = {}
        self._retrying: set[asyncio.Task] = set()

    def check(self, evidence: bytes, nonce: bytes) -> AttestCheck:
        try:
            self._issuer.check_nonce(nonce)
        except VerificationError as exc:
            raise Refusal.of(exc.reason, str(exc)) from None
        return AttestCheck(self._issuer.policy(), evidence, nonce)

    async def judge(self, check: AttestCheck, attested: Attested) -> AttestationRecord:
        """The verdict recorded for ``attested`` (what a worker verified of ``check``); Refusal when the evidence does
        not count."""
        ek = attested.ek
        record, _version = await self._get(ek)
        self._attributable(record, attested)
        # Used before anything else is decided: a replayed quote is refused as such, whenever it comes.
        try:
            self._issuer.use_nonce(check.nonce)
        except VerificationError as exc:
            raise Refusal.of(exc.reason, str(exc)) from None
        except NonceLimitError as exc:
            raise Refusal.of("nonce-limit", str(exc)) from None
        minimum = self.interval / 2
        last = self._last.get(ek)
        since = self._now() - (
            parse_stamp(record.attested_at) or datetime.datetime.min.replace(tzinfo=datetime.timezone.utc)
        )
        if (last is not None and self._clock() - last < minimum) or since.total_seconds() < minimum:
            raise Refusal(
                "RESOURCE_EXHAUSTED",
                "attest-too-soon",
                f"node {record.node_name} attested less than {minimum:g} s ago: one evidence per interval",
            )
        stamp = utc_stamp(self._now())

        def verdict(current: AttestationRecord | None) -> AttestationRecord:
            self._attributable(current, attested)
            clock = judge_clock(current.clock, attested.clock)
            if clock is not None and clock[0] == CLOCK_BACKWARDS:
                raise Refusal.of(CLOCK_BACKWARDS, clock[1])
            reason, message, mismatches = attested.reason, attested.message, attested.mismatches
            if clock is not None:
                reason, message = clock[0], clock[1]
            if reason:
                # A new failure is acted on once; a quarantined node stays so.
                enforced = current.enforced and current.result == FAILED
                return replace(
                    current,
                    clock=attested.clock,
                    attested_at=stamp,
                    result=FAILED,
                    reason=reason,
                    message=message,
                    mismatches=mismatches,
                    enforced=enforced or current.quarantined,
                )
            return replace(
                current,
                clock=attested.clock,
                attested_at=stamp,
                passed_at=stamp,
                result=PASSED,
                reason="",
                message="",
                mismatches=[],
                enforced=current.quarantined and current.enforced,
            )

        try:
            judged = await self.records.update(ek, verdict)
        except AttestationStateError as exc:
            raise Refusal("UNAVAILABLE", "attestation-state", str(exc)) from None
        self._last[ek] = self._clock()
        passed = judged.result == PASSED
        try:
            await self.nodes.set_condition(
                judged.node_name,
                passed,
                PASSED_REASON if passed else _condition_reason(judged.reason),
                "the node's evidence passed the measurement policy" if passed else judged.message,
            )
        except AttestationStateError:
            pass  # the record holds the verdict; the next attestation sets the condition
        if not passed:
            self._on_failure()
        return judged

    async def _get(self, ek: str) -> tuple[AttestationRecord, str | None]:
        try:
            record, version = await self.records.get(ek)
        except AttestationStateError as exc:
            raise Refusal("UNAVAILABLE", "attestation-state", str(exc)) from None
        if record is None:
            raise Refusal.of(
                "not-a-member",
                "this TPM has no attestation record: it never joined or rejoined through a join service that "
                "records its AK; a rejoin records it",
            )
        return record, version

    @staticmethod
    def _attributable(record: AttestationRecord | None, attested: Attested) -> None:
        if record is None:
            raise Refusal.of("not-a-member", "this TPM's attestation record is gone")
        if record.ak_name != attested.ak_name.hex():
            raise Refusal.of(
                "ak-unknown",
                f"the quote is signed by an AK that node {record.node_name} did not prove at its join: the node "
                "re-proves a new AK by credential activation (a rejoin)",
            )

    async def enrolled(self, ek: str, node_name: str, ak_name: bytes, clock, control_plane: bool) -> None:
        """At a join or rejoin's credential activation: the proven AK and the TPM's counters now."""
        if not ak_name or clock is None:
            return
        stamp = utc_stamp(self._now())

        def enrol(current: AttestationRecord | None) -> AttestationRecord:
            base = current or AttestationRecord(ek, node_name, ak_name.hex(), clock)
            return base.enrolled(node_name, ak_name.hex(), clock, stamp, control_plane)

        await self.records.update(ek, enrol)
        self._last.pop(ek, None)

    async def enrolled_quietly(self, pending, log) -> None:
        """``enrolled`` for a join or rejoin just issued; a failure is logged, not the node's: a rejoin works while the
        API is away (after a power cut), and the node's next attestation finds the record it has."""
        grant = pending.grant
        try:
            await self.enrolled(grant.ek, grant.node_name, pending.ak_name, pending.clock, grant.control_plane)
        except AttestationStateError as exc:
            log.warning("attestation-record", result="not-recorded", node_name=grant.node_name, msg=str(exc))
            # Written once the API is back (a rejoin after a power cut of every control plane): otherwise the node's
            # next attestation would meet the counters of its previous boot.
            task = asyncio.ensure_future(self._enrol_later(pending, log))
            self._retrying.add(task)
            task.add_done_callback(self._retrying.discard)

    async def _enrol_later(self, pending, log) -> None:
        grant = pending.grant
        for _attempt in range(ENROL_RETRIES):
            await asyncio.sleep(ENROL_RETRY_DELAY)
            try:
                await self.enrolled(grant.ek, grant.node_name, pending.ak_name, pending.clock, grant.control_plane)
            except AttestationStateError:
                continue
            log.info("attestation-record", result="recorded", node_name=grant.node_name)
            return
        log.error("attestation-record", result="given-up", node_name=grant.node_name)


def _condition_reason(reason: str) -> str:
    """A condition reason is CamelCase: ``pcr-policy`` becomes ``PcrPolicy``."""
    return "".join(part.capitalize() for part in reason.split("-")) or "Failed"
