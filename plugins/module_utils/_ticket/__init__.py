# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node side of a sealed hand-over (init secrets or a join ticket).

Open the sealed payload with the ephemeral key the evidence was bound to, derive
the cluster ID, take the node lock, then write the files the payload carries.
The same steps serve init and join; only the flow name and the payload differ.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re

from .._files import write_private_file
from .._crypto import derive
from .._crypto.root_secrets import RootSecrets, RootSecretsError
from .._crypto.seal import EphemeralKey, SealError
from .._reset import NEEDS_RESET

SECRETS_FILE = "/etc/confidential-kubernetes/cluster-secrets.json"


class TicketError(RuntimeError):
    """The sealed payload cannot be opened or applied; the message says why."""


class NoJoinService(TicketError):
    """No join service answered (every endpoint unreachable, busy or not serving): a node that waits may try again."""


def take_ephemeral_key(path: str, check_mode: bool) -> EphemeralKey:
    """Read the ephemeral private key and delete it: a key opens one hand-over only."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(4096)
    except FileNotFoundError:
        raise TicketError(
            f"ephemeral key {path} does not exist: it was already used, or tpm_evidence did not keep it"
        ) from None
    except OSError as exc:
        raise TicketError(f"cannot read ephemeral key {path}: {exc.strerror}") from None
    finally:
        if not check_mode and os.path.exists(path):
            os.unlink(path)
    try:
        return EphemeralKey.from_private_bytes(raw)
    except SealError as exc:
        raise TicketError(f"ephemeral key {path}: {exc}") from None


def open_envelope(key: EphemeralKey, sealed_b64: str, flow: str, nonce_hex: str, verifier_id: str) -> bytes:
    """The plaintext of a sealed hand-over given as base64, with its nonce as hex (as the modules get them)."""
    try:
        envelope = base64.b64decode(sealed_b64, validate=True)
        if not re.fullmatch(r"[0-9a-fA-F]{64}", nonce_hex):  # bytes.fromhex alone skips whitespace
            raise ValueError(nonce_hex)
        nonce = bytes.fromhex(nonce_hex)
    except (binascii.Error, ValueError, TypeError):
        raise TicketError("sealed payload must be base64 and the nonce 64 hex characters") from None
    try:
        return key.open(envelope, flow, nonce, verifier_id)
    except SealError as exc:
        raise TicketError(str(exc)) from None


def open_sealed(key: EphemeralKey, sealed_b64: str, flow: str, nonce_hex: str, verifier_id: str) -> dict:
    """The init hand-over: a JSON object."""
    plaintext = open_envelope(key, sealed_b64, flow, nonce_hex, verifier_id)
    try:
        payload = json.loads(plaintext)
    except ValueError:
        raise TicketError("sealed payload is not JSON") from None
    if not isinstance(payload, dict):
        raise TicketError("sealed payload must be a JSON object")
    return payload


def root_secrets(document: object, source: str) -> RootSecrets:
    try:
        return RootSecrets.from_document(document, source)
    except RootSecretsError as exc:
        raise TicketError(str(exc)) from None


def keep_root_secrets(path: str, secrets: RootSecrets, check_mode: bool) -> bool:
    """The node's copy of the root secrets, for its join service (0600)."""
    return write_if_changed(
        path, (json.dumps(secrets.to_document(), sort_keys=True) + "\n").encode(), 0o600, check_mode
    )


def cluster_id_of(message) -> bytes:
    """The cluster ID a node derives from a ticket or hand-over (its measurement secret and salt), never the one it states."""
    return derive.cluster_id(message.measurement_secret, message.measurement_salt)


def write_if_changed(path: str, content: bytes, mode: int, check_mode: bool) -> bool:
    """Write a file atomically with ``mode`` unless it already holds ``content`` with that mode."""
    try:
        with open(path, "rb") as handle:
            same = hashlib.sha256(handle.read()).digest() == hashlib.sha256(content).digest()
        if same and os.stat(path).st_mode & 0o777 == mode:
            return False
    except FileNotFoundError:
        pass
    if not check_mode:
        write_private_file(path, content)
        os.chmod(path, mode)
    return True


# Options of the state disk inside init_ticket and join_ticket (see the state_disk module).
STATE_DISK_OPTIONS = dict(
    device=dict(type="path", required=True),
    state=dict(type="str", default="formatted", choices=["formatted", "opened", "mounted"]),
    name=dict(type="str", default="state"),
    mount_path=dict(type="path", default="/var/lib/confidential-kubernetes/state"),
    pbkdf_memory=dict(type="int"),
    pbkdf_iterations=dict(type="int"),
)


def state_disk_of(options: dict, check_mode: bool):
    from .._disk.luks import StateDisk

    return StateDisk(
        options["device"],
        name=options["name"],
        mount_path=options["mount_path"],
        pbkdf_memory=options.get("pbkdf_memory"),
        pbkdf_iterations=options.get("pbkdf_iterations"),
        check_mode=check_mode,
    )


def state_disk_ready(options: dict) -> bool:
    """Whether the state disk is as open as its ``state`` asks (mapped; mounted with the cluster state bound from it).

    A formatted-only disk holds no cluster state, so it is always ready. Nothing is changed."""
    if options.get("state", "formatted") == "formatted":
        return True
    from .._disk.placement import is_placed

    disk = state_disk_of(options, True)
    if not disk.is_mapped(strict=False):
        return False
    if options["state"] == "opened":
        return True
    source = disk.mount_source()
    if source is None or os.path.realpath(source) != os.path.realpath(disk.mapper_path):
        return False
    return all(is_placed(disk.mount_path, path) for path in disk.cluster_state_paths)


def disk_uuid(options: dict, check_mode: bool) -> tuple[str | None, bool]:
    """Format the state disk with a throw-away key if it is not LUKS yet; returns (LUKS UUID, changed)."""
    result = state_disk_of(options, check_mode).ensure("formatted", uuid_only=True)
    return result["uuid"], result["changed"]


def luks_uuid(options: dict) -> str:
    """The UUID of a state disk that must already be LUKS (a member's disk is never formatted again)."""
    from .._disk import StateDiskError

    disk = state_disk_of(options, False)
    disk.check_device()
    if not disk.is_luks():
        raise StateDiskError(
            f"the state disk {options['device']} of this member has no LUKS header: it was replaced or wiped; "
            f"nothing was changed; {NEEDS_RESET}"
        )
    return disk.luks_uuid()


def key_state_disk(options: dict, disk_key: bytes, check_mode: bool) -> dict:
    """Re-key the state disk to ``disk_key`` (and map/mount it where asked); returns the state_disk result."""
    result = state_disk_of(options, check_mode).ensure(options["state"], disk_key)
    return {
        k: v
        for k, v in result.items()
        if k in ("changed", "uuid", "keyslots", "keyed", "mapped", "mapping_available", "mount_path")
    }
