# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node registry: identity, role and disk are granted by the join service, never claimed by the node.

A node is its TPM's endorsement key (``request.ek_identity``), proven by credential activation. Two sources say
what an EK is granted:

* the **enrolment** (controller-owned, the file ``enrolment_file`` the joinservice role pushes to every control plane):
  EK -> node name, role, and the state disk's UUID where the controller saw one; re-read on change like the policy;
* the **disk bindings** (service-owned): the first disk UUID an EK joins with. They are claimed in the cluster's API
  (one ConfigMap per disk, created only if absent: ``bindings.ApiDiskBindings``), so two control planes can never
  bind one disk to two TPMs, and mirrored into ``bindings_file`` on every control plane, so that a rebooted node
  rejoins even while the API is down.

An EK that is not enrolled may join only under the pool rule (``pool_workers``): its EK certificate chains to the EK
CA, it joins as a worker named ``<pool_name_prefix>-<first 10 hex digits of its identity>``, never as a control plane.
An enrolment without a disk carries an ``enrolment_id``; bindings made under an older one (a node that was reset and
enrolled afresh) no longer count for that EK, so the node binds its new disk. A binding outranks the enrolment: a disk
bound to one EK is refused to every other, whether the enrolment names it for another node or no longer names its
owner; only an operator releases it (``remove_node.yml``).
"""

from __future__ import annotations

import base64
import binascii
import datetime
import fcntl
import json
import os
import re
import secrets
import threading
from dataclasses import dataclass, replace

try:
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
except ImportError:  # reported by the service at start
    pass

from .._files import write_file_atomically
from .config import ConfigError, WatchedFile, read_service_copy
from .pki import MAX_COMMON_NAME, NODE_USER_PREFIX, RequestError, check_disk_uuid, check_node_name
from .request import pool_node_name, public_key_digest

ENROLMENT_VERSION = 1
BINDINGS_VERSION = 1
CONTROL_PLANE = "control-plane"
WORKER = "worker"
ROLES = (WORKER, CONTROL_PLANE)
MAX_ENROLMENT_BYTES = 4 * 1024 * 1024
MAX_CERTIFICATE_BYTES = 8192
_IDENTITY = re.compile(r"[0-9a-f]{64}")
_ENROLMENT_ID = re.compile(r"[0-9a-f]{1,64}")
POOL = "pool"
ENROLLED = "enrolled"


class RegistryError(ValueError):
    """An enrolment or bindings file is malformed; the message names the file and the entry."""


class RegistryRefusal(Exception):
    """The registry grants the node nothing of what it asked; ``reason`` is a stable code."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Enrolment:
    ek: str
    node_name: str
    control_plane: bool
    disk_uuid: str | None = None
    enrolment_id: str = ""
    ek_certificate: bytes | None = None

    def to_document(self) -> dict:
        doc = {"ek": self.ek, "node_name": self.node_name, "role": CONTROL_PLANE if self.control_plane else WORKER}
        if self.disk_uuid:
            doc["disk_uuid"] = self.disk_uuid
        if self.enrolment_id:
            doc["enrolment_id"] = self.enrolment_id
        if self.ek_certificate:
            doc["ek_certificate"] = base64.b64encode(self.ek_certificate).decode()
        return doc


@dataclass(frozen=True)
class Enrolments:
    by_ek: dict[str, Enrolment]

    def __post_init__(self):
        object.__setattr__(self, "by_name", {e.node_name: e for e in self.by_ek.values()})
        object.__setattr__(self, "by_disk", {e.disk_uuid: e for e in self.by_ek.values() if e.disk_uuid})


@dataclass(frozen=True)
class Binding:
    """A disk UUID bound to the EK that first joined with it."""

    disk_uuid: str
    ek: str
    node_name: str
    enrolment_id: str = ""
    bound_at: str = ""

    def to_document(self) -> dict:
        return {
            "disk_uuid": self.disk_uuid,
            "ek": self.ek,
            "node_name": self.node_name,
            "enrolment_id": self.enrolment_id,
            "bound_at": self.bound_at,
        }


@dataclass(frozen=True)
class NodeIdentity:
    """Who asks: the EK identity (hex) and its certificate where the evidence carries one."""

    ek: str
    ek_certificate: bytes | None = None


@dataclass(frozen=True)
class Grant:
    """What the registry grants one request. ``bind`` is the disk binding to claim before anything is issued."""

    ek: str
    node_name: str
    control_plane: bool
    disk_uuid: str
    source: str
    bind: Binding | None = None


def _text(where: str, entry: dict, name: str, pattern: re.Pattern | None = None, required: bool = True) -> str | None:
    value = entry.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or (pattern is not None and not pattern.fullmatch(value)):
        raise RegistryError(f"{where}: {name} {value!r} is not valid")
    return value


def _node_name(where: str, value: object) -> str:
    try:
        name = check_node_name(value)
    except RequestError as exc:
        raise RegistryError(f"{where}: {exc}") from None
    if len(NODE_USER_PREFIX + name) > MAX_COMMON_NAME:
        raise RegistryError(
            f"{where}: node name {name!r} is too long for a kubelet certificate "
            f"('{NODE_USER_PREFIX}<name>' may have at most {MAX_COMMON_NAME} characters)"
        )
    return name


def _disk_uuid(where: str, value: object) -> str:
    try:
        return check_disk_uuid(value)
    except RequestError as exc:
        raise RegistryError(f"{where}: {exc}") from None


def _certificate(where: str, value: object, ek: str) -> bytes:
    if not isinstance(value, str) or len(value) > MAX_CERTIFICATE_BYTES * 4 // 3 + 4:
        raise RegistryError(f"{where}: ek_certificate must be base64 DER of at most {MAX_CERTIFICATE_BYTES} bytes")
    try:
        der = base64.b64decode(value, validate=True)
        certified = public_key_digest(x509.load_der_x509_certificate(der).public_key()).hex()
    except (binascii.Error, ValueError, UnsupportedAlgorithm):
        raise RegistryError(f"{where}: ek_certificate is not a readable DER certificate") from None
    if certified != ek:
        raise RegistryError(f"{where}: ek_certificate certifies another key than EK {ek}")
    return der


def parse_enrolment(text: bytes, source: str) -> Enrolments:
    """``{"version": 1, "nodes": [{"ek", "node_name", "role", "disk_uuid"?, "enrolment_id"?, "ek_certificate"?}]}``."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        raise RegistryError(f"{source} is not JSON") from None
    if not isinstance(doc, dict) or doc.get("version") != ENROLMENT_VERSION or not isinstance(doc.get("nodes"), list):
        raise RegistryError(f"{source} must be an object with version {ENROLMENT_VERSION} and a list of nodes")
    unknown = sorted(str(key) for key in doc if key not in ("version", "nodes"))
    if unknown:
        raise RegistryError(f"{source} has unknown field(s): {', '.join(unknown)}")
    by_ek: dict[str, Enrolment] = {}
    names: set[str] = set()
    disks: set[str] = set()
    for number, entry in enumerate(doc["nodes"]):
        where = f"{source}, node {number}"
        if not isinstance(entry, dict):
            raise RegistryError(f"{where} must be an object")
        unknown = sorted(
            str(key)
            for key in entry
            if key not in ("ek", "node_name", "role", "disk_uuid", "enrolment_id", "ek_certificate")
        )
        if unknown:
            raise RegistryError(f"{where} has unknown field(s): {', '.join(unknown)}")
        ek = _text(where, entry, "ek", _IDENTITY)
        name = _node_name(where, entry.get("node_name"))
        role = entry.get("role")
        if role not in ROLES:
            raise RegistryError(f"{where}: role {role!r} is not one of {', '.join(ROLES)}")
        disk = _disk_uuid(where, entry["disk_uuid"]) if entry.get("disk_uuid") is not None else None
        certificate = (
            _certificate(where, entry["ek_certificate"], ek) if entry.get("ek_certificate") is not None else None
        )
        for seen, value, what in ((by_ek, ek, "EK"), (names, name, "node name"), (disks, disk, "disk UUID")):
            if value is not None and value in seen:
                raise RegistryError(f"{where}: {what} {value} is enrolled twice")
        names.add(name)
        if disk:
            disks.add(disk)
        by_ek[ek] = Enrolment(
            ek,
            name,
            role == CONTROL_PLANE,
            disk,
            _text(where, entry, "enrolment_id", _ENROLMENT_ID, False) or "",
            certificate,
        )
    return Enrolments(by_ek)


def dump_enrolment(entries: list[Enrolment]) -> bytes:
    nodes = [entry.to_document() for entry in sorted(entries, key=lambda e: e.node_name)]
    return (json.dumps({"version": ENROLMENT_VERSION, "nodes": nodes}, indent=1, sort_keys=True) + "\n").encode()


def merge_enrolment(
    path: str,
    nodes: list[Enrolment],
    check_mode: bool = False,
    absent: tuple[str, ...] = (),
    bindings: tuple[Binding, ...] = (),
) -> tuple[bool, bytes]:
    """Merge enrolments into the controller's enrolment file (0600), under an exclusive lock of ``<path>.lock``.

    Each node replaces any entry with its EK or its name; the nodes named in ``absent`` are removed (a node taken out
    of the cluster for good). A node enrolled without a disk (its state disk is not LUKS: it never joined, or it was
    reset) gets a new ``enrolment_id``, which voids disk bindings made under an older one. A node enrolled without a
    disk that now has one (it joined since, and the join service bound that disk) is left as it is. A node whose disk
    is bound to another EK (in ``bindings``, the cluster's disk bindings, or in this file) is refused, naming both, and
    nothing changes: a bound disk is released by an operator only (remove_node.yml).
    Returns (changed, the file's content).
    """
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o700, exist_ok=True)
    lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(path, "rb") as handle:
                current = handle.read()
        except FileNotFoundError:
            current = None
        entries = dict(parse_enrolment(current, f"node enrolment {path}").by_ek) if current is not None else {}
        enrolled = [Binding(e.disk_uuid, e.ek, e.node_name) for e in entries.values() if e.disk_uuid]
        _refuse_bound_disks(nodes, list(bindings) + enrolled)
        entries = {ek: entry for ek, entry in entries.items() if entry.node_name not in absent}
        for node in nodes:
            enrolled = entries.get(node.ek)
            if (
                enrolled is not None
                and not enrolled.disk_uuid
                and node.disk_uuid
                and (enrolled.node_name, enrolled.control_plane) == (node.node_name, node.control_plane)
            ):
                # It joined since: the join service bound that disk under this enrolment; re-runs change nothing.
                continue
            entries = {
                ek: entry for ek, entry in entries.items() if ek != node.ek and entry.node_name != node.node_name
            }
            if not node.disk_uuid:
                node = replace(node, enrolment_id=secrets.token_hex(8))
            entries[node.ek] = node
        content = dump_enrolment(list(entries.values()))
        parse_enrolment(content, "the merged node enrolment")
        changed = content != current
        if changed and not check_mode:
            write_file_atomically(path, content, 0o600)
        return changed, content
    finally:
        os.close(lock)


def _refuse_bound_disks(nodes: list[Enrolment], bindings: list[Binding]) -> None:
    holders = {binding.disk_uuid: binding for binding in bindings}
    for node in nodes:
        holder = holders.get(node.disk_uuid) if node.disk_uuid else None
        if holder is not None and holder.ek != node.ek:
            raise RegistryError(
                f"node {node.node_name} (EK {node.ek[:16]}...) cannot be enrolled with disk "
                f"{node.disk_uuid}: that disk is bound to node {holder.node_name} (EK {holder.ek[:16]}...); "
                "release it first with remove_node.yml"
            )


class EnrolmentWatcher(WatchedFile):
    """The enrolment the controller pushed; none (empty) until the first push."""

    what = "node enrolment"
    event = "enrolment-reload"
    max_bytes = MAX_ENROLMENT_BYTES

    def parse(self, text: bytes) -> Enrolments:
        if len(text) > MAX_ENROLMENT_BYTES:
            raise RegistryError(f"node enrolment {self.path} is larger than {MAX_ENROLMENT_BYTES} bytes")
        return parse_enrolment(text, f"node enrolment {self.path}")

    def missing(self) -> Enrolments:
        return Enrolments({})

    def loaded(self, previous: bytes | None) -> None:
        self._log.info(self.event, result="loaded", path=self.path, digest=self.digest, nodes=len(self.value.by_ek))


def parse_bindings(text: bytes, source: str) -> list[Binding]:
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        raise RegistryError(f"{source} is not JSON") from None
    if not isinstance(doc, dict) or doc.get("version") != BINDINGS_VERSION or not isinstance(doc.get("bindings"), list):
        raise RegistryError(f"{source} must be an object with version {BINDINGS_VERSION} and a list of bindings")
    return [binding_of(entry, f"{source}, binding {number}") for number, entry in enumerate(doc["bindings"])]


def binding_of(entry: object, where: str) -> Binding:
    if not isinstance(entry, dict):
        raise RegistryError(f"{where} must be an object")
    return Binding(
        _disk_uuid(where, entry.get("disk_uuid")),
        _text(where, entry, "ek", _IDENTITY),
        _node_name(where, entry.get("node_name")),
        _text(where, entry, "enrolment_id", re.compile(r"[0-9a-f]{0,64}"), False) or "",
        _text(where, entry, "bound_at", required=False) or "",
    )


class BindingMirror:
    """This control plane's copy of the disk bindings (0600, written atomically), by disk UUID."""

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()
        text = read_service_copy(path, "disk bindings", MAX_ENROLMENT_BYTES)
        try:
            bindings = parse_bindings(text, f"disk bindings {path}") if text is not None else []
        except RegistryError as exc:
            raise ConfigError(str(exc)) from None
        self._index({binding.disk_uuid: binding for binding in bindings})

    def _index(self, by_disk: dict[str, Binding]) -> None:
        # By EK as well: a join asks for an EK's bindings, which must not cost a scan of the whole cluster's.
        by_ek: dict[str, list[Binding]] = {}
        for binding in by_disk.values():
            by_ek.setdefault(binding.ek, []).append(binding)
        self._by_disk, self._by_ek = by_disk, by_ek

    def get(self, disk_uuid: str) -> Binding | None:
        return self._by_disk.get(disk_uuid)

    def of_ek(self, ek: str) -> list[Binding]:
        return list(self._by_ek.get(ek, ()))

    def all(self) -> list[Binding]:
        return list(self._by_disk.values())

    def record(self, binding: Binding) -> None:
        with self._lock:
            if self._by_disk.get(binding.disk_uuid) == binding:
                return
            by_disk = dict(self._by_disk, **{binding.disk_uuid: binding})
            self._write(by_disk)

    def replace(self, bindings: list[Binding]) -> bool:
        """The cluster's bindings replace this copy; whether anything changed."""
        with self._lock:
            by_disk = {binding.disk_uuid: binding for binding in bindings}
            if by_disk == self._by_disk:
                return False
            self._write(by_disk)
            return True

    def _write(self, by_disk: dict[str, Binding]) -> None:
        document = {"version": BINDINGS_VERSION, "bindings": [by_disk[disk].to_document() for disk in sorted(by_disk)]}
        write_file_atomically(self.path, (json.dumps(document, indent=1, sort_keys=True) + "\n").encode(), 0o600)
        self._index(by_disk)


def chains_to(certificate_der: bytes, cas: list, now: datetime.datetime) -> bool:
    """Whether a DER certificate is valid now and directly issued by a CA certificate of ``cas``."""
    try:
        certificate = x509.load_der_x509_certificate(certificate_der)
        if not certificate.not_valid_before_utc <= now <= certificate.not_valid_after_utc:
            return False
        for anchor in cas:
            if (
                anchor.subject != certificate.issuer
                or not anchor.not_valid_before_utc <= now <= anchor.not_valid_after_utc
            ):
                continue
            try:
                if not anchor.extensions.get_extension_for_class(x509.BasicConstraints).value.ca:
                    continue
                certificate.verify_directly_issued_by(anchor)
            except (x509.ExtensionNotFound, ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
                continue
            return True
    except ValueError:
        return False
    return False


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


class NodeRegistry:
    """Decides what one request is granted (``grant``); the disk binding it needs is claimed by the caller."""

    def __init__(
        self, enrolment: EnrolmentWatcher, mirror: BindingMirror, ek_cas: list, pool_prefix: str | None, now=_utcnow
    ):
        self.enrolment = enrolment
        self.mirror = mirror
        self._ek_cas = ek_cas
        self._pool_prefix = pool_prefix
        self._now = now

    def grant(self, identity: NodeIdentity, flow: str, node_name: str, control_plane: bool, disk_uuid: str) -> Grant:
        enrolments = self.enrolment.current()
        entry = enrolments.by_ek.get(identity.ek)
        if entry is not None:
            name, may_be_control_plane, source = entry.node_name, entry.control_plane, ENROLLED
        else:
            name, may_be_control_plane, source = self._pool_name(identity, enrolments), False, POOL
        if control_plane and not may_be_control_plane:
            raise RegistryRefusal(
                "role-not-granted",
                (
                    f"this TPM is enrolled as worker {name}: only TPMs enrolled as control planes get the control-plane role"
                    if entry is not None
                    else f"this TPM is not enrolled: under the pool rule it joins as worker {name}, never as a control plane"
                ),
            )
        if node_name and node_name != name:
            raise RegistryRefusal(
                "name-not-granted",
                f"this TPM is {'enrolled' if entry is not None else 'admitted by the pool rule'} "
                f"as node {name}; it may not join as {node_name!r}",
            )
        disk = check_disk_uuid(disk_uuid)
        mine = self.disk_of(identity.ek, enrolments)
        holder = self.holder_of(disk, enrolments)
        if holder is not None and holder[0] != identity.ek:
            raise RegistryRefusal(
                "disk-not-granted",
                f"disk {disk} is bound to another node's TPM ({holder[1]}): a node gets "
                "only its own disk's key; an operator releases a disk with remove_node.yml",
            )
        if mine is not None and mine != disk:
            raise RegistryRefusal(
                "disk-not-granted",
                f"the state disk bound to this TPM is {mine}; it may not ask for the key of disk {disk}",
            )
        bind = None
        if mine is None and flow != "join":
            raise RegistryRefusal(
                "disk-not-granted",
                f"no state disk is bound to this TPM (node {name}): it never joined "
                "through the join service, or was enrolled afresh since; a rejoin serves "
                "only a bound disk",
            )
        bound, enrolment_id = self.mirror.get(disk), entry.enrolment_id if entry is not None else ""
        if flow == "join" and (bound is None or bound.enrolment_id != enrolment_id):
            # A first binding, or an enrolled disk the cluster's API does not hold yet: claimed there before any key.
            bind = Binding(disk, identity.ek, name, enrolment_id, self._now().strftime("%Y-%m-%dT%H:%M:%SZ"))
        return Grant(identity.ek, name, control_plane and may_be_control_plane, disk, source, bind)

    def _pool_name(self, identity: NodeIdentity, enrolments: Enrolments) -> str:
        if not self._pool_prefix:
            raise RegistryRefusal(
                "not-enrolled",
                f"this TPM (EK {identity.ek[:16]}...) is not enrolled and the pool rule is off: "
                "enrol the node (join.yml enrols inventory hosts) or enable joinservice_pool_workers",
            )
        if not self.enrolment.digest:
            raise RegistryRefusal(
                "not-enrolled",
                "no node enrolment has been pushed to this join service yet: pool nodes may join once the "
                "controller has enrolled the cluster's own nodes (join.yml)",
            )
        if identity.ek_certificate is None or not self._ek_cas:
            raise RegistryRefusal(
                "not-enrolled",
                "this TPM is not enrolled, and the pool rule admits only TPMs whose EK certificate chains "
                "to the EK CA (the evidence carries no EK certificate, or no EK CA is configured)",
            )
        try:
            certified = public_key_digest(x509.load_der_x509_certificate(identity.ek_certificate).public_key()).hex()
        except (ValueError, UnsupportedAlgorithm):
            certified = ""
        if certified != identity.ek or not chains_to(identity.ek_certificate, self._ek_cas, self._now()):
            raise RegistryRefusal(
                "not-enrolled",
                "this TPM is not enrolled, and its EK certificate does not certify its EK under the "
                "configured EK CA: the pool rule does not admit it",
            )
        name = pool_node_name(self._pool_prefix, identity.ek)
        if name in enrolments.by_name:
            raise RegistryRefusal("name-not-granted", f"the pool name {name} of this TPM is enrolled for another TPM")
        return name

    def disk_of(self, ek: str, enrolments: Enrolments) -> str | None:
        """The disk bound to an EK: the enrolled one, else its binding made under its current enrolment (pool: any)."""
        entry = enrolments.by_ek.get(ek)
        if entry is not None and entry.disk_uuid:
            return entry.disk_uuid
        enrolment_id = entry.enrolment_id if entry is not None else ""
        bound = sorted(
            (b for b in self.mirror.of_ek(ek) if b.enrolment_id == enrolment_id),
            key=lambda b: (b.bound_at, b.disk_uuid),
        )
        return bound[0].disk_uuid if bound else None

    def holder_of(self, disk_uuid: str, enrolments: Enrolments | None = None) -> tuple[str, str] | None:
        """The EK a disk belongs to and its node: its binding in the cluster's API (mirrored here), which outranks the
        enrolment and holds until an operator releases it (remove_node.yml), whatever the enrolment says since; else
        the enrolment that names the disk."""
        binding = self.mirror.get(disk_uuid)
        if binding is not None:
            return binding.ek, binding.node_name
        enrolments = enrolments or self.enrolment.current()
        entry = enrolments.by_disk.get(disk_uuid)
        return (entry.ek, entry.node_name) if entry is not None else None

    def owner_of(self, disk_uuid: str, enrolments: Enrolments | None = None) -> str | None:
        """The EK a disk belongs to (``holder_of``)."""
        holder = self.holder_of(disk_uuid, enrolments)
        return holder[0] if holder is not None else None
