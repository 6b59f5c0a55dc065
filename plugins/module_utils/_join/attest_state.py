# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Continuous attestation's state in the cluster's API, through the service's one API client (``kubeapi.ClusterApi``).

* **The record**: one ConfigMap per EK, ``kube-system/confidential-kubernetes-attest-<EK identity>`` (label
  ``confidential.kubernetes/attestation``), data ``attest.AttestationRecord.to_document()``: the AK proven at the
  node's join, the TPM's counters, the last verdict, the quarantine. Written at every join and rejoin (credential
  activation) and every attestation, compare-and-swap by resourceVersion, so two services that judge the same node at
  once cannot lose either verdict. Every service watches the records: a quarantined EK is refused a ticket at once.
  Why a ConfigMap per EK in ``kube-system`` and not an annotation on the Node: the record exists before the Node (it
  is written at activation, before the kubelet registers), outlives it (a deleted Node does not release a quarantine),
  is keyed like the disk bindings by the TPM, and a node's own kubelet credentials may write its Node object but no
  ConfigMap in ``kube-system`` - a quarantined node cannot release itself.
* **The quarantine mirror** (``QuarantineMirror``): each control plane's copy of the quarantined records
  (``quarantine_file``, 0600), rewritten whenever its watch sees the records change. A service that starts while the
  API is away (every control plane back from a power cut) has no records until its watch lists them: it refuses the
  mirror's EKs meanwhile, so a quarantine holds through the outage instead of lapsing until the API answers.
* **The Node condition** ``ConfidentialAttested`` (status, reason, message, lastHeartbeatTime, lastTransitionTime) in
  the Node's status, what ``kubectl describe node`` shows; set by the service that judged.
* **Enforcement** (``NodeActions``): the ``NoExecute`` taint, the cordon, and a Warning Event on the Node naming the
  PCRs and events that differ.
"""

from __future__ import annotations

import datetime
import json
import threading
from typing import Callable

from .._files import write_file_atomically
from .attest import AttestationRecord, RecordError
from .config import ConfigError, read_service_copy
from .kubeapi import NAMESPACE, ApiStatusError, ApiUnavailable

RECORD_LABEL = "confidential.kubernetes/attestation"
RECORD_PREFIX = "confidential-kubernetes-attest-"
CONDITION = "ConfidentialAttested"
TAINT_KEY = "confidential.kubernetes/attestation"
TAINT_VALUE = "failed"
TAINT_EFFECT = "NoExecute"
EVENT_SOURCE = "confidential-kubernetes-joinservice"
# A compare-and-swap that keeps meeting a newer version gives up after this many tries (the caller reports it).
CAS_ATTEMPTS = 5
QUARANTINE_MIRROR_VERSION = 1
# A record is at most a few KiB (its mismatches are capped): room for every node of a large cluster quarantined at once.
MAX_QUARANTINE_MIRROR_BYTES = 16 * 1024 * 1024


class AttestationStateError(RuntimeError):
    """The cluster's API could not record or read continuous-attestation state now."""


def record_name(ek: str) -> str:
    return RECORD_PREFIX + ek


def record_of(configmap: dict) -> AttestationRecord | None:
    """The record a ConfigMap holds; None for an unreadable one (it grants nothing and quarantines nobody)."""
    name = str((configmap.get("metadata") or {}).get("name", ""))
    if not name.startswith(RECORD_PREFIX):
        return None
    try:
        return AttestationRecord.from_document(configmap.get("data"), f"ConfigMap {NAMESPACE}/{name}")
    except RecordError:
        return None


def _manifest(record: AttestationRecord, resource_version: str | None) -> dict:
    metadata = {"name": record_name(record.ek), "namespace": NAMESPACE, "labels": {RECORD_LABEL: "v1"}}
    if resource_version:
        metadata["resourceVersion"] = resource_version
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": record.to_document()}


class QuarantineMirror:
    """This control plane's copy of the quarantined records (0600, written atomically), by EK. An unreadable copy stops
    the service from starting (ConfigError): skipping it would let every quarantined EK through until the API answers."""

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()
        text = read_service_copy(path, "quarantine mirror", MAX_QUARANTINE_MIRROR_BYTES)
        self._by_ek = self._parse(text) if text is not None else {}

    def _parse(self, text: str) -> dict[str, AttestationRecord]:
        try:
            document = json.loads(text)
        except ValueError:
            raise ConfigError(f"quarantine mirror {self.path} is not JSON") from None
        if not isinstance(document, dict) or document.get("version") != QUARANTINE_MIRROR_VERSION:
            raise ConfigError(f"quarantine mirror {self.path} is not version {QUARANTINE_MIRROR_VERSION} of its format")
        records = document.get("records")
        if not isinstance(records, list):
            raise ConfigError(f"quarantine mirror {self.path} has no list of records")
        by_ek = {}
        for number, data in enumerate(records):
            try:
                record = AttestationRecord.from_document(data, f"quarantine mirror {self.path}, record {number}")
            except RecordError as exc:
                raise ConfigError(str(exc)) from None
            if not record.quarantined:
                raise ConfigError(f"quarantine mirror {self.path}, record {number} is not quarantined")
            by_ek[record.ek] = record
        return by_ek

    def get(self, ek: str) -> AttestationRecord | None:
        return self._by_ek.get(ek)

    def replace(self, records: list[AttestationRecord]) -> bool:
        """The quarantined records among ``records`` (the cluster's) replace this copy; whether anything changed."""
        by_ek = {record.ek: record for record in records if record.quarantined}
        with self._lock:
            if by_ek == self._by_ek:
                return False
            document = {
                "version": QUARANTINE_MIRROR_VERSION,
                "records": [by_ek[ek].to_document() for ek in sorted(by_ek)],
            }
            write_file_atomically(self.path, (json.dumps(document, indent=1, sort_keys=True) + "\n").encode(), 0o600)
            self._by_ek = by_ek
            return True


class ApiAttestationRecords:
    """Reads, changes (compare-and-swap) and watches the records; with a ``mirror``, keeps it current from the watch
    and answers ``quarantined`` from it until the watch has listed the records."""

    def __init__(self, api, mirror: QuarantineMirror | None = None):
        self.api = api
        self.mirror = mirror
        self._watched = None

    def follow(self, on_change: Callable[[], None], on_failure: Callable[[str], None]) -> None:
        def changed() -> None:
            self._mirror_watched(on_failure)
            on_change()

        self._watched = self.api.watch("configmaps", record_of, changed, on_failure, label_selector=RECORD_LABEL)
        # The watch may have listed the records before it was assigned here (its first ``changed`` mirrored nothing).
        self._mirror_watched(on_failure)

    def _mirror_watched(self, on_failure: Callable[[str], None]) -> None:
        if self.mirror is None or not self._synced():
            return
        try:
            self.mirror.replace(list(self.watched().values()))
        except OSError as exc:
            on_failure(f"cannot write the quarantine mirror {self.mirror.path}: {exc}")

    def _synced(self) -> bool:
        return self._watched is not None and self._watched.synced.is_set()

    def watched(self) -> dict[str, AttestationRecord]:
        """Every readable record, by EK, as far as the watch has seen."""
        if self._watched is None:
            return {}
        return {record.ek: record for record in self._watched.snapshot().values()}

    def quarantined(self, ek: str) -> AttestationRecord | None:
        """The EK's record when it is quarantined: as the watch has listed the records, the mirror's until then."""
        if not self._synced():
            return self.mirror.get(ek) if self.mirror is not None else None
        record = self.watched().get(ek)
        return record if record is not None and record.quarantined else None

    async def get(self, ek: str) -> tuple[AttestationRecord | None, str | None]:
        try:
            document = await self.api.read("configmaps", record_name(ek))
        except ApiStatusError as exc:
            if exc.status == 404:
                return None, None
            raise AttestationStateError(f"reading the attestation record of EK {ek[:16]}... failed ({exc})") from None
        except ApiUnavailable as exc:
            raise AttestationStateError(str(exc)) from None
        record = record_of(document)
        if record is None:
            raise AttestationStateError(f"the attestation record {record_name(ek)} in the cluster's API is unreadable")
        return record, document["metadata"]["resourceVersion"]

    async def list(self) -> list[AttestationRecord]:
        try:
            items = await self.api.list("configmaps", label_selector=RECORD_LABEL)
        except (ApiStatusError, ApiUnavailable) as exc:
            raise AttestationStateError(f"listing the attestation records failed ({exc})") from None
        return [record for record in map(record_of, items) if record is not None]

    async def update(
        self, ek: str, change: Callable[[AttestationRecord | None], AttestationRecord | None]
    ) -> AttestationRecord | None:
        """``change`` of the record as the API holds it now (None: there is none), written back compare-and-swap;
        ``change`` returning None writes nothing. It is called again when another service changed the record first,
        and may raise to refuse."""
        for _attempt in range(CAS_ATTEMPTS):
            current, version = await self.get(ek)
            changed = change(current)
            if changed is None or changed == current:
                return current
            try:
                if version is None:
                    await self.api.create("configmaps", _manifest(changed, None))
                else:
                    await self.api.replace("configmaps", record_name(ek), _manifest(changed, version))
                return changed
            except ApiStatusError as exc:
                if exc.status != 409:
                    raise AttestationStateError(
                        f"writing the attestation record of {changed.node_name} failed ({exc})"
                    ) from None
            except ApiUnavailable as exc:
                raise AttestationStateError(str(exc)) from None
        raise AttestationStateError(f"the attestation record of EK {ek[:16]}... kept changing while it was written")


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def utc_stamp(when: datetime.datetime) -> str:
    """A Kubernetes object's time (RFC 3339, seconds)."""
    return when.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class NodeActions:
    """The Node side: the condition, the taint and cordon, the Event. A Node that is not registered (yet) is skipped:
    the record holds the verdict, and the next attestation or enforcement pass finds the Node."""

    def __init__(self, api, now: Callable[[], datetime.datetime] = _now):
        self.api = api
        self._now = now

    async def _change(self, node_name: str, change: Callable[[dict], bool], status: bool = False) -> bool:
        """``change`` the Node (in place; False: nothing to change) and replace it, compare-and-swap; whether the Node
        exists."""
        for _attempt in range(CAS_ATTEMPTS):
            try:
                node = await self.api.read("nodes", node_name)
            except ApiStatusError as exc:
                if exc.status == 404:
                    return False
                raise AttestationStateError(f"reading Node {node_name} failed ({exc})") from None
            except ApiUnavailable as exc:
                raise AttestationStateError(str(exc)) from None
            if not change(node):
                return True
            try:
                if status:
                    await self.api.replace_status("nodes", node_name, node)
                else:
                    await self.api.replace("nodes", node_name, node)
                return True
            except ApiStatusError as exc:
                if exc.status not in (404, 409):
                    raise AttestationStateError(f"updating Node {node_name} failed ({exc})") from None
                if exc.status == 404:
                    return False
            except ApiUnavailable as exc:
                raise AttestationStateError(str(exc)) from None
        raise AttestationStateError(f"Node {node_name} kept changing while it was updated")

    async def set_condition(self, node_name: str, attested: bool, reason: str, message: str) -> bool:
        now = utc_stamp(self._now())
        status = "True" if attested else "False"

        def change(node: dict) -> bool:
            conditions = node.setdefault("status", {}).setdefault("conditions", [])
            ours = next((c for c in conditions if c.get("type") == CONDITION), None)
            if ours is None:
                ours = {"type": CONDITION, "lastTransitionTime": now}
                conditions.append(ours)
            elif ours.get("status") != status:
                ours["lastTransitionTime"] = now
            ours.update(status=status, reason=reason, message=message[:1024], lastHeartbeatTime=now)
            return True

        return await self._change(node_name, change, status=True)

    async def quarantine(self, node_name: str, taint: bool = True, cordon: bool = True) -> bool:
        """The NoExecute taint (its pods are evicted, the Node authorizer stops giving it their Secrets) and the cordon."""
        now = utc_stamp(self._now())

        def change(node: dict) -> bool:
            spec = node.setdefault("spec", {})
            taints = spec.setdefault("taints", [])
            changed = False
            if taint and not any(t.get("key") == TAINT_KEY and t.get("effect") == TAINT_EFFECT for t in taints):
                taints.append({"key": TAINT_KEY, "value": TAINT_VALUE, "effect": TAINT_EFFECT, "timeAdded": now})
                changed = True
            if cordon and not spec.get("unschedulable"):
                spec["unschedulable"] = True
                changed = True
            return changed

        return await self._change(node_name, change)

    async def release(self, node_name: str) -> bool:
        def change(node: dict) -> bool:
            spec = node.setdefault("spec", {})
            taints = spec.get("taints") or []
            kept = [t for t in taints if t.get("key") != TAINT_KEY]
            changed = len(kept) != len(taints) or bool(spec.get("unschedulable"))
            spec["taints"] = kept
            spec.pop("unschedulable", None)
            return changed

        return await self._change(node_name, change)

    async def event(self, node_name: str, reason: str, message: str) -> None:
        """A Warning Event on the Node (in ``default``: the API files events of cluster-scoped objects there)."""
        try:
            node = await self.api.read("nodes", node_name)
            uid = node.get("metadata", {}).get("uid", "")
        except ApiStatusError:
            uid = ""
        except ApiUnavailable as exc:
            raise AttestationStateError(str(exc)) from None
        now = self._now()
        stamp = utc_stamp(now)
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{node_name}.{int(now.timestamp() * 1e6):x}", "namespace": "default"},
            "involvedObject": {"kind": "Node", "name": node_name, "uid": uid, "apiVersion": "v1"},
            "reason": reason,
            "message": message[:1024],
            "type": "Warning",
            "source": {"component": EVENT_SOURCE},
            "reportingComponent": EVENT_SOURCE,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            await self.api.create("events", body, namespace="default")
        except (ApiStatusError, ApiUnavailable) as exc:
            raise AttestationStateError(f"recording an Event on Node {node_name} failed ({exc})") from None
