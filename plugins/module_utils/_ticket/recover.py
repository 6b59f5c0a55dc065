# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The recover hand-over (DESIGN section 7): the controller's answer to a control plane that waits for keys.

After every control plane lost power, no join service answers a rejoin: each node's boot-time join waits for keys.
The controller, which holds the root secrets, attests each waiting control plane (nonce, evidence bound to a fresh
ephemeral key, PCR 15 zero, its EK enrolled as a control plane, the disk it reports = the disk enrolled for it) and
seals to it ``RecoverHandOver``: its own state disk's key and the measurement secret and salt (the cluster ID), no
more. The node (``recover()``) opens it, checks the cluster ID against its join record, takes the node lock again
(PCR 15 mark) and opens its state disk; its boot-time join then finds it a member and the kubelet and the join service
start. The master secret never travels: a control plane keeps the root secrets of its join service from its join.

``standing()`` says whether a node waits for this hand-over, and why not when it does not; it changes nothing.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

from .._crypto import derive
from .._crypto.root_secrets import RootSecrets
from . import TicketError, key_state_disk, luks_uuid, open_sealed, secret_bytes, take_ephemeral_key
from .join import MEMBER, REBOOTED, NodeJoin

FLOW = "recover"
VERSION = 1
WAITING_FOR_KEYS = "waiting-for-keys"
# Reason codes of the controller's refusals (the play names one per refused node).
REFUSALS = ("evidence", "not-enrolled", "not-a-control-plane", "name-not-granted", "disk-not-bound")


@dataclass(frozen=True, repr=False)
class RecoverHandOver:
    """What a waiting control plane gets: the key of its bound state disk and the measurement secret and salt."""

    disk_uuid: str
    state_disk_key: bytes
    measurement_secret: bytes
    measurement_salt: bytes

    @classmethod
    def for_disk(cls, secrets: RootSecrets, disk_uuid: str) -> "RecoverHandOver":
        uuid = disk_uuid.lower()
        disk_key = derive.state_disk_key(secrets.master_key, secrets.master_salt, uuid)
        return cls(uuid, disk_key, secrets.measurement_secret(), secrets.measurement_salt)

    def cluster_id(self) -> bytes:
        return derive.cluster_id(self.measurement_secret, self.measurement_salt)

    def to_bytes(self) -> bytes:
        document = {"version": VERSION, "flow": FLOW, "disk_uuid": self.disk_uuid,
                    "state_disk_key": base64.b64encode(self.state_disk_key).decode(),
                    "measurement_secret": base64.b64encode(self.measurement_secret).decode(),
                    "measurement_salt": base64.b64encode(self.measurement_salt).decode()}
        return json.dumps(document, sort_keys=True).encode()

    @classmethod
    def from_payload(cls, payload: dict) -> "RecoverHandOver":
        if payload.get("version") != VERSION or payload.get("flow") != FLOW:
            raise TicketError(f"the sealed payload is not a version {VERSION} recover hand-over")
        uuid = payload.get("disk_uuid")
        if not isinstance(uuid, str) or not uuid:
            raise TicketError("the recover hand-over names no disk")
        return cls(uuid, secret_bytes(payload, "state_disk_key"), secret_bytes(payload, "measurement_secret"),
                   secret_bytes(payload, "measurement_salt"))


@dataclass(frozen=True)
class Standing:
    """Where a node stands for recover: ``waiting`` when it needs the hand-over; ``reason`` says why not otherwise."""

    node_state: str
    boot_state: str
    waiting: bool
    reason: str
    disk_uuid: str
    cluster_id: str

    def to_result(self) -> dict:
        return {"node_state": self.node_state, "boot_state": self.boot_state, "waiting": self.waiting,
                "reason": self.reason, "disk_uuid": self.disk_uuid, "cluster_id": self.cluster_id}


def boot_state(status_file: str) -> str:
    """What the boot-time join last reported (member, joining, waiting-for-keys), or "none"."""
    try:
        with open(status_file, encoding="utf-8") as handle:
            state = json.load(handle).get("state")
    except (OSError, ValueError, AttributeError):
        return "none"
    return state if isinstance(state, str) else "none"


def standing(joining: NodeJoin, status_file: str) -> Standing:
    """Whether the node waits for the recover hand-over: a rebooted member whose boot-time join waits for keys.

    Raises TicketError (or NodeLockError, TpmError) for a node that is no member of any cluster in a usable way."""
    state = joining.state()
    booted = boot_state(status_file)
    record = joining.record() or {}
    cluster = record.get("cluster_id", "")
    if state == MEMBER:
        why = "a member: PCR 15 carries the cluster's mark and its disk is open"
        return Standing(state, booted, False, why, "", cluster)
    if state != REBOOTED:
        why = f"not a member of a cluster ({state}): the join playbook is the way"
        return Standing(state, booted, False, why, "", cluster)
    uuid = luks_uuid(joining.settings.state_disk)
    if booted != WAITING_FOR_KEYS:
        why = f"rebooted, but its boot-time join does not wait for keys ({booted})"
        return Standing(state, booted, False, why, uuid, cluster)
    return Standing(state, booted, True, "", uuid, cluster)


def recover(joining: NodeJoin, sealed_b64: str, nonce_hex: str, verifier_id: str, ephemeral_key_path: str) -> dict:
    """Open the hand-over, check it against the node's join record and disk, re-take the node lock, open the disk."""
    key = take_ephemeral_key(ephemeral_key_path, False)
    hand_over = RecoverHandOver.from_payload(open_sealed(key, sealed_b64, FLOW, nonce_hex, verifier_id))
    record = joining.record()
    cluster_id = hand_over.cluster_id()
    if record is None or record["cluster_id"] != cluster_id.hex():
        raise TicketError(f"the recover hand-over is for cluster {cluster_id.hex()}, but this node joined "
                          f"{record['cluster_id'] if record else 'no cluster'}; nothing was changed")
    uuid = luks_uuid(joining.settings.state_disk)
    if uuid.lower() != hand_over.disk_uuid:
        raise TicketError(f"the recover hand-over is for disk {hand_over.disk_uuid}, but this node's state disk is "
                          f"{uuid}; nothing was changed")
    locked, lock = joining.lock.take(cluster_id)
    disk = key_state_disk(joining.settings.state_disk, hand_over.state_disk_key, False)
    return {"changed": locked or disk["changed"], "cluster_id": cluster_id.hex(), "node_lock": lock.to_result(),
            "state_disk": disk}
