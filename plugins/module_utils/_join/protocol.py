# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The messages sealed to an attested node, as types: the join ticket, the rejoin ticket and the recover hand-over.

Each is a frozen dataclass whose attributes are the message's fields, with one ``to_bytes`` (what is sealed: JSON with
sorted keys, bytes in base64) and one ``from_bytes`` that is strict: a wrong version, a missing or unknown field, or a
field of the wrong type or size is refused with a ``ProtocolError`` naming the field. The issuer builds an object,
the node reads attributes; no other module spells a field's name. The wire format is the ``_join`` README's (step 4)
and DESIGN section 7's, byte for byte.

Also here, once: the ticket and hand-over versions, the gRPC metadata key of a refusal's reason code, the recover
refusal codes and the control-plane PKI files a ticket may carry. The flow names are the HPKE context's
(``_crypto.seal``), which binds them into every envelope.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass, field, fields

from .._crypto import derive
from .._crypto.root_secrets import FIELDS as ROOT_SECRET_FIELDS, SECRET_BYTES, RootSecrets, RootSecretsError
from .._crypto.seal import JOIN, RECOVER, REJOIN

TICKET_FLOWS = (JOIN, REJOIN)
TICKET_VERSION = 1
HAND_OVER_VERSION = 1
# The trailing gRPC metadata that carries a refusal's reason code (also the start of the status details).
REASON_METADATA = "confidential-kubernetes-reason"
# Relative to the PKI directory -> file mode on the joining node: keys 0600, certificates and public keys 0644.
CONTROL_PLANE_FILE_MODES = {
    "ca.crt": 0o644,
    "ca.key": 0o600,
    "sa.key": 0o600,
    "sa.pub": 0o644,
    "front-proxy-ca.crt": 0o644,
    "front-proxy-ca.key": 0o600,
    "etcd/ca.crt": 0o644,
    "etcd/ca.key": 0o600,
}
CONTROL_PLANE_FILES = frozenset(CONTROL_PLANE_FILE_MODES)
_MODE = re.compile(r"0[0-7]{3}")
_HEX32 = re.compile(r"[0-9a-f]{64}")


class ProtocolError(ValueError):
    """A message that is not what its type says; ``field`` names the field at fault (empty for the whole message)."""

    def __init__(self, message: str, field_name: str = ""):
        super().__init__(message)
        self.field = field_name


# --- field codecs: (encode value -> JSON value, decode JSON value -> value or ProtocolError) -------------------------


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def _unb64(what: str, name: str, value: object) -> bytes:
    if not isinstance(value, str):
        raise ProtocolError(f"{what} field {name!r} must be base64 text", name)
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError(f"{what} field {name!r} is not base64", name) from None


def _text(what: str, name: str, value: object, empty: bool = False) -> str:
    if not isinstance(value, str) or not (value or empty):
        raise ProtocolError(f"{what} field {name!r} must be {'' if empty else 'non-empty '}text", name)
    return value


def _text_or_empty(what: str, name: str, value: object) -> str:
    return _text(what, name, value, empty=True)


def _secret(what: str, name: str, value: object) -> bytes:
    raw = _unb64(what, name, value)
    if len(raw) != SECRET_BYTES:
        raise ProtocolError(f"{what} field {name!r} must be {SECRET_BYTES} bytes", name)
    return raw


def _cluster_id(what: str, name: str, value: object) -> bytes:
    if not isinstance(value, str) or not _HEX32.fullmatch(value):
        raise ProtocolError(f"{what} field {name!r} must be 64 lower-case hex digits", name)
    return bytes.fromhex(value)


def _flag(what: str, name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ProtocolError(f"{what} field {name!r} must be true or false", name)
    return value


def _pins(what: str, name: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(pin, str) and pin for pin in value):
        raise ProtocolError(f"{what} field {name!r} must be a non-empty list of CA pins", name)
    return tuple(value)


@dataclass(frozen=True)
class ControlPlaneFile:
    """One control-plane PKI file: its path relative to the PKI directory, content and mode."""

    path: str
    content: bytes = field(repr=False)
    mode: int


def _encode_files(files: tuple[ControlPlaneFile, ...]) -> dict:
    return {f.path: {"content": _b64(f.content), "mode": f"{f.mode:04o}"} for f in files}


def _decode_files(what: str, name: str, value: object) -> tuple[ControlPlaneFile, ...]:
    if not isinstance(value, dict):
        raise ProtocolError(f"{what} field {name!r} must be a mapping of PKI files", name)
    files = []
    for path, entry in sorted(value.items()):
        where = f"{name}.{path}"
        if path not in CONTROL_PLANE_FILES:
            raise ProtocolError(f"{what} carries an unexpected control-plane file {path!r}", where)
        if not isinstance(entry, dict) or sorted(entry) != ["content", "mode"]:
            raise ProtocolError(f"{what} field {where!r} must have exactly 'content' and 'mode'", where)
        if not isinstance(entry["mode"], str) or not _MODE.fullmatch(entry["mode"]):
            raise ProtocolError(
                f"{what} field {where + '.mode'!r} must be an octal mode such as '0600'", where + ".mode"
            )
        files.append(ControlPlaneFile(path, _unb64(what, where + ".content", entry["content"]), int(entry["mode"], 8)))
    return tuple(files)


def _decode_secrets(what: str, name: str, value: object) -> RootSecrets:
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(ROOT_SECRET_FIELDS))
        if unknown:
            raise ProtocolError(f"{what} field {name!r} has unknown field(s): {', '.join(unknown)}", name)
    try:
        return RootSecrets.from_document(value, f"{what} field {name!r}")
    except RootSecretsError as exc:
        raise ProtocolError(str(exc), name) from None


def _as_is(value):
    return value


# How each field crosses the wire (a field's metadata); ``optional``: left out of the message when None.
_SECRET = {"encode": _b64, "decode": _secret, "optional": False}
_TEXT = {"encode": _as_is, "decode": _text, "optional": False}
_TEXT_OR_EMPTY = {"encode": _as_is, "decode": _text_or_empty, "optional": False}
_FLAG = {"encode": _as_is, "decode": _flag, "optional": False}
_CLUSTER_ID = {"encode": bytes.hex, "decode": _cluster_id, "optional": False}
_PINS = {"encode": list, "decode": _pins, "optional": False}
_FILES = {"encode": _encode_files, "decode": _decode_files, "optional": False}
_OPTIONAL_ROOT_SECRETS = {"encode": RootSecrets.to_document, "decode": _decode_secrets, "optional": True}


class _Message:
    """What every message shares: the header (version, and the flow where the message names it) and the codecs."""

    WHAT = ""
    VERSION = 0
    FLOW = ""  # a message that names its flow carries it in the field "flow"

    @classmethod
    def _header(cls) -> dict:
        return dict({"version": cls.VERSION}, **({"flow": cls.FLOW} if cls.FLOW else {}))

    def to_bytes(self) -> bytes:
        document = self._header()
        for spec in fields(self):
            value = getattr(self, spec.name)
            if value is None and spec.metadata["optional"]:
                continue
            document[spec.name] = spec.metadata["encode"](value)
        return json.dumps(document, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes):
        try:
            document = json.loads(data)
        except (UnicodeDecodeError, ValueError):
            raise ProtocolError(f"the {cls.WHAT} is not JSON") from None
        if not isinstance(document, dict):
            raise ProtocolError(f"the {cls.WHAT} must be a JSON object")
        header = cls._header()
        version = document.get("version")
        # bool is an int in Python: true must not pass for version 1.
        if (
            isinstance(version, bool)
            or not isinstance(version, int)
            or any(document.get(k) != v for k, v in header.items())
        ):
            raise ProtocolError(f"the sealed payload is not a version {cls.VERSION} {cls.WHAT}", "version")
        specs = fields(cls)
        missing = [s.name for s in specs if s.name not in document and not s.metadata["optional"]]
        if missing:
            raise ProtocolError(f"the {cls.WHAT} lacks field(s): {', '.join(missing)}", missing[0])
        unknown = sorted(set(document) - set(header) - {s.name for s in specs})
        if unknown:
            raise ProtocolError(f"the {cls.WHAT} has unknown field(s): {', '.join(unknown)}", unknown[0])
        values = {s.name: s.metadata["decode"](cls.WHAT, s.name, document[s.name]) for s in specs if s.name in document}
        message = cls(**values)
        message._check()
        return message

    def _check(self) -> None:
        """Rules across fields, beyond each field's own type."""


@dataclass(frozen=True)
class RejoinTicket(_Message):
    """What a rebooted member gets (flow ``rejoin``): its disk key and the measurement secret, no more."""

    WHAT = "rejoin ticket"
    VERSION = TICKET_VERSION

    cluster_id: bytes = field(metadata=_CLUSTER_ID)
    measurement_secret: bytes = field(metadata=_SECRET, repr=False)
    measurement_salt: bytes = field(metadata=_SECRET, repr=False)
    state_disk_key: bytes = field(metadata=_SECRET, repr=False)


@dataclass(frozen=True)
class JoinTicket(_Message):
    """What a fresh node gets (flow ``join``): identity and disk as granted, the bootstrap token, the CA and its pins,
    its kubelet client certificate; a control plane also the PKI files and the root secrets of its own join service."""

    WHAT = "join ticket"
    VERSION = TICKET_VERSION

    node_name: str = field(metadata=_TEXT)
    control_plane: bool = field(metadata=_FLAG)
    cluster_id: bytes = field(metadata=_CLUSTER_ID)
    measurement_secret: bytes = field(metadata=_SECRET, repr=False)
    measurement_salt: bytes = field(metadata=_SECRET, repr=False)
    state_disk_key: bytes = field(metadata=_SECRET, repr=False)
    api_server_endpoint: str = field(metadata=_TEXT)
    bootstrap_token: str = field(metadata=_TEXT, repr=False)
    ca_cert_hashes: tuple = field(metadata=_PINS)
    ca_crt: str = field(metadata=_TEXT)
    kubelet_client_crt: str = field(metadata=_TEXT)
    control_plane_files: tuple = field(metadata=_FILES, repr=False)
    kubernetes_version: str = field(metadata=_TEXT_OR_EMPTY)  # empty: the node's kubeadm decides
    cluster_secrets: RootSecrets | None = field(default=None, metadata=_OPTIONAL_ROOT_SECRETS, repr=False)

    def __post_init__(self):
        # One order for the files, so that equal tickets compare equal however they were built.
        object.__setattr__(self, "control_plane_files", tuple(sorted(self.control_plane_files, key=lambda f: f.path)))

    def _check(self) -> None:
        # A control plane runs a join service of its own, which needs the root secrets; a worker never gets them.
        if self.control_plane != (self.cluster_secrets is not None):
            raise ProtocolError(
                f"the {self.WHAT} must carry 'cluster_secrets' for a control plane and only for one", "cluster_secrets"
            )


@dataclass(frozen=True)
class RecoverHandOver(_Message):
    """What a waiting control plane gets from the controller (flow ``recover``): the key of its bound state disk and the
    measurement secret and salt (the cluster ID), no more."""

    WHAT = "recover hand-over"
    VERSION = HAND_OVER_VERSION
    FLOW = RECOVER

    disk_uuid: str = field(metadata=_TEXT)
    state_disk_key: bytes = field(metadata=_SECRET, repr=False)
    measurement_secret: bytes = field(metadata=_SECRET, repr=False)
    measurement_salt: bytes = field(metadata=_SECRET, repr=False)

    @classmethod
    def for_disk(cls, secrets: RootSecrets, disk_uuid: str) -> "RecoverHandOver":
        uuid = disk_uuid.lower()
        disk_key = derive.state_disk_key(secrets.master_key, secrets.master_salt, uuid)
        return cls(uuid, disk_key, secrets.measurement_secret(), secrets.measurement_salt)


def ticket_type(flow: str) -> type:
    """The ticket a join service seals for ``flow``."""
    return {JOIN: JoinTicket, REJOIN: RejoinTicket}[flow]
