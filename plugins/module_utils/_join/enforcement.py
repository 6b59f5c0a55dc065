# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Enforcement of continuous attestation: one control plane acts at a time, holding a ``coordination.k8s.io/v1``
Lease (``kube-system/confidential-attestation``); another takes it over once it lapses (no renewal for its duration).

The acting service looks at every record each pass (``attestation_interval``, or at once when a verdict fails) and
acts on a node that failed, or that sent no passing evidence for ``attestation_grace``: by
``attestation_failure_action``, ``report`` records an Event; ``taint`` also taints
(``confidential.kubernetes/attestation=failed:NoExecute``) and cordons the Node; ``quarantine`` (the default) also
quarantines the EK in its record: every join service then refuses it any join or rejoin ticket (no disk key) until
``release`` clears it. A failing control plane is acted on the same way unless it is the last control plane not
quarantined (it is reported only: quarantining it would leave no join service to serve, or to release anyone).
"""

from __future__ import annotations

import asyncio
import datetime
from dataclasses import replace
from typing import Callable

from .attest import FAILED, PASSED, QUARANTINE, REPORT, SILENT, AttestationRecord, parse_stamp, utc_stamp
from .attest_state import ApiAttestationRecords, AttestationStateError, NodeActions
from .kubeapi import NAMESPACE, ApiStatusError, ApiUnavailable

LEASE_NAME = "confidential-attestation"
EVENT_REASON = "ConfidentialAttestationFailed"


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _micro(when: datetime.datetime) -> str:
    return when.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_micro(text: str | None) -> datetime.datetime | None:
    if not text:
        return None
    for layout in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.datetime.strptime(text, layout).replace(tzinfo=datetime.timezone.utc)
        except ValueError:
            continue
    return None


class LeaseElection:
    """Take, renew or take over the Lease; ``holding`` says whether this service acts now."""

    def __init__(self, api, holder: str, duration: float, now: Callable[[], datetime.datetime] = _now):
        self.api = api
        self.holder = holder
        self.duration = max(1, int(round(duration)))
        self._now = now

    def _spec(self, transitions: int, acquired: str) -> dict:
        return {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.duration,
            "acquireTime": acquired,
            "renewTime": _micro(self._now()),
            "leaseTransitions": transitions,
        }

    async def holding(self) -> bool:
        try:
            lease = await self.api.read("leases", LEASE_NAME)
        except ApiStatusError as exc:
            if exc.status != 404:
                return False
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": LEASE_NAME, "namespace": NAMESPACE},
                "spec": self._spec(0, _micro(self._now())),
            }
            try:
                await self.api.create("leases", body)
            except (ApiStatusError, ApiUnavailable):
                return False
            return True
        except ApiUnavailable:
            return False
        spec = lease.get("spec") or {}
        if spec.get("holderIdentity") == self.holder:
            lease["spec"] = self._spec(int(spec.get("leaseTransitions") or 0), spec.get("acquireTime") or "")
        else:
            renewed = _parse_micro(spec.get("renewTime"))
            duration = int(spec.get("leaseDurationSeconds") or self.duration)
            if renewed is not None and renewed + datetime.timedelta(seconds=duration) > self._now():
                return False
            lease["spec"] = self._spec(int(spec.get("leaseTransitions") or 0) + 1, _micro(self._now()))
        try:
            await self.api.replace("leases", LEASE_NAME, lease)
        except (ApiStatusError, ApiUnavailable):
            return False
        return True


def describe(record: AttestationRecord) -> str:
    """What an Event says: the node, the reason, and the PCRs and events that differ."""
    parts = [f"node {record.node_name} failed continuous attestation ({record.reason})"]
    for mismatch in record.mismatches:
        events = "; ".join(event.get("summary", "") for event in mismatch.get("events", ()))
        parts.append(f"PCR {mismatch.get('pcr')} is {mismatch.get('actual', '?')}" + (f": {events}" if events else ""))
    if not record.mismatches and record.message:
        parts.append(record.message)
    return ". ".join(parts)


class Enforcer:
    """One pass (``enforce_once``) or the loop (``run``) of the acting service."""

    def __init__(
        self,
        records: ApiAttestationRecords,
        nodes: NodeActions,
        election: LeaseElection,
        interval: float,
        grace: float,
        action: str,
        log,
        now: Callable[[], datetime.datetime] = _now,
    ):
        self.records = records
        self.nodes = nodes
        self.election = election
        self.interval = interval
        self.grace = grace
        self.action = action
        self._log = log
        self._now = now
        self.wake = asyncio.Event()

    async def run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self.wake.wait(), self.interval)
            except asyncio.TimeoutError:
                pass
            self.wake.clear()
            try:
                if await self.election.holding():
                    await self.enforce_once()
            except AttestationStateError as exc:
                self._log.warning("enforce", result="failed", msg=str(exc))
            except Exception as exc:  # noqa: BLE001 - the loop must outlive one bad pass; the log says why
                self._log.error("enforce", result="error", error=type(exc).__name__, msg=str(exc)[:1000])

    def _due(self, record: AttestationRecord, now: datetime.datetime) -> str | None:
        """Why ``record`` needs acting on now (None: it does not)."""
        if record.enforced:
            return None
        if record.result == FAILED:
            return record.reason
        if record.quarantined:
            return None
        passed = parse_stamp(record.passed_at) or parse_stamp(record.attested_at)
        if passed is not None and now - passed > datetime.timedelta(seconds=self.grace):
            return SILENT
        return None

    async def enforce_once(self) -> list[str]:
        """Act on every node due; the names acted on."""
        now = self._now()
        records = await self.records.list()
        acted = []
        for record in records:
            reason = self._due(record, now)
            if reason is None:
                continue
            serving = [r for r in records if r.control_plane and not r.quarantined and r.ek != record.ek]
            action = REPORT if record.control_plane and not serving else self.action
            await self._act(record, reason, action, now)
            acted.append(record.node_name)
        return acted

    async def _act(self, record: AttestationRecord, reason: str, action: str, now: datetime.datetime) -> None:
        if reason == SILENT:
            record = replace(
                record,
                reason=SILENT,
                message=f"no passing attestation for {self.grace:g} s (last passed {record.passed_at or 'never'})",
                mismatches=[],
            )
        message = describe(record)
        await self.nodes.event(record.node_name, EVENT_REASON, message)
        if action != REPORT:
            await self.nodes.quarantine(record.node_name)
        await self.nodes.set_condition(record.node_name, False, reason, message)
        stamp = utc_stamp(now)

        def enforced(current: AttestationRecord | None) -> AttestationRecord | None:
            if current is None:
                return None
            changed = replace(current, enforced=True)
            if reason == SILENT:
                changed = replace(changed, result=FAILED, reason=SILENT, message=record.message, mismatches=[])
            if action == QUARANTINE and not current.quarantined:
                changed = replace(changed, quarantined_at=stamp, quarantine_reason=message)
            return changed

        await self.records.update(record.ek, enforced)
        self._log.warning(
            "enforce",
            result=action,
            reason=reason,
            node_name=record.node_name,
            pcrs=[m.get("pcr") for m in record.mismatches],
            msg=message,
        )


async def release(records: ApiAttestationRecords, nodes: NodeActions, ek: str) -> AttestationRecord:
    """Clear a quarantine after a fresh passing attestation (one accepted after the quarantine began): the record,
    the taint and the cordon. AttestationStateError naming why when the node has not passed since."""

    def cleared(current: AttestationRecord | None) -> AttestationRecord | None:
        if current is None:
            raise AttestationStateError(f"no attestation record for EK {ek[:16]}...: nothing to release")
        since, passed = parse_stamp(current.quarantined_at), parse_stamp(current.passed_at)
        if current.result != PASSED or (since is not None and (passed is None or passed <= since)):
            raise AttestationStateError(
                f"node {current.node_name} has not passed an attestation since it was quarantined "
                f"({current.quarantined_at or 'not quarantined'}; last result {current.result} {current.reason}): "
                "it stays quarantined"
            )
        return replace(current, quarantined_at="", quarantine_reason="", enforced=False)

    record = await records.update(ek, cleared)
    await nodes.release(record.node_name)
    await nodes.set_condition(record.node_name, True, "Attested", "released after a fresh passing attestation")
    return record
