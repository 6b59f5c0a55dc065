# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The recover hand-over (DESIGN section 7): the controller's answer to a control plane that waits for keys.

After every control plane lost power, no join service answers a rejoin: each node's boot-time join waits for keys.
The controller, which holds the root secrets, attests each waiting control plane (nonce, evidence bound to a fresh
ephemeral key, PCR 15 zero, its EK enrolled as a control plane, the disk it reports = the disk enrolled for it) and
seals to it ``RecoverHandOver`` (``_join.protocol``): its own state disk's key and the measurement secret and salt (the cluster ID), no
more. The node (``recover()``) opens it, checks the cluster ID against its join record, takes the node lock again
(PCR 15 mark) and opens its state disk; its boot-time join then finds it a member and the kubelet and the join service
start. The master secret never travels: a control plane keeps the root secrets of its join service from its join.

``standing()`` says whether a node waits for this hand-over, and why not when it does not; it changes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .._join.protocol import RECOVER, ProtocolError, RecoverHandOver
from . import TicketError, cluster_id_of, key_state_disk, luks_uuid, open_envelope, take_ephemeral_key
from .join import MEMBER, REBOOTED, NodeJoin

# The boot-time join's state (in its status file) of a rebooted node that reaches no join service.
WAITING_FOR_KEYS = "waiting-for-keys"


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
        return {
            "node_state": self.node_state,
            "boot_state": self.boot_state,
            "waiting": self.waiting,
            "reason": self.reason,
            "disk_uuid": self.disk_uuid,
            "cluster_id": self.cluster_id,
        }


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
    try:
        hand_over = RecoverHandOver.from_bytes(open_envelope(key, sealed_b64, RECOVER, nonce_hex, verifier_id))
    except ProtocolError as exc:
        raise TicketError(str(exc)) from None
    record = joining.record()
    cluster_id = cluster_id_of(hand_over)
    if record is None or record["cluster_id"] != cluster_id.hex():
        raise TicketError(
            f"the recover hand-over is for cluster {cluster_id.hex()}, but this node joined "
            f"{record['cluster_id'] if record else 'no cluster'}; nothing was changed"
        )
    uuid = luks_uuid(joining.settings.state_disk)
    if uuid.lower() != hand_over.disk_uuid:
        raise TicketError(
            f"the recover hand-over is for disk {hand_over.disk_uuid}, but this node's state disk is "
            f"{uuid}; nothing was changed"
        )
    locked, lock = joining.lock.take(cluster_id)
    disk = key_state_disk(joining.settings.state_disk, hand_over.state_disk_key, False)
    return {
        "changed": locked or disk["changed"],
        "cluster_id": cluster_id.hex(),
        "node_lock": lock.to_result(),
        "state_disk": disk,
    }
