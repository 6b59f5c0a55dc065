"""The lab bridge on the host, the veths nspawn attaches to it and the VM nodes' taps."""

from __future__ import annotations

import json

from . import LabError
from .host import run
from .plan import BRIDGE, HOST_ADDRESS, MACHINE_PREFIX, PREFIX_LENGTH, TAP_PREFIX, is_lab_node_name


def _links() -> list[dict]:
    return json.loads(run(["ip", "-json", "link", "show"], what="ip link show") or "[]")


def bridge_exists() -> bool:
    return any(link.get("ifname") == BRIDGE for link in _links())


def ensure_bridge() -> None:
    """Create the lab bridge with the host address, unless it is already there."""
    if not bridge_exists():
        try:
            run(["ip", "link", "add", BRIDGE, "type", "bridge"], what="ip link add (bridge)")
        except LabError as exc:
            raise LabError(
                f"cannot create the lab bridge {BRIDGE}; this kernel may lack bridge support ({exc})"
            ) from exc
    addresses = json.loads(run(["ip", "-json", "addr", "show", "dev", BRIDGE], what="ip addr show"))
    have = {(a.get("local"), a.get("prefixlen")) for entry in addresses for a in entry.get("addr_info", [])}
    if (HOST_ADDRESS, PREFIX_LENGTH) not in have:
        run(["ip", "addr", "add", f"{HOST_ADDRESS}/{PREFIX_LENGTH}", "dev", BRIDGE], what="ip addr add")
    run(["ip", "link", "set", BRIDGE, "up"], what="ip link set up")


def lab_veths() -> list[str]:
    """Host-side veths and taps of lab nodes: nspawn names veths vb-<machine name>, the lab taps TAP_PREFIX<name>, or
    they hang off the bridge."""
    found = []
    for link in _links():
        name = link.get("ifname", "")
        base = name.split("@", 1)[0]
        ours = base.startswith("vb-" + MACHINE_PREFIX) and is_lab_node_name(base[3 + len(MACHINE_PREFIX) :])
        ours = ours or (base.startswith(TAP_PREFIX) and is_lab_node_name(base[len(TAP_PREFIX) :]))
        if ours or link.get("master") == BRIDGE:
            found.append(base)
    return found


def remove_network() -> None:
    """Delete lab veths and the bridge. A veth may vanish on its own meanwhile: its netns just died."""
    for veth in lab_veths():
        try:
            run(["ip", "link", "delete", veth], what=f"ip link delete {veth}")
        except LabError:
            if veth in lab_veths():
                raise
    if bridge_exists():
        run(["ip", "link", "delete", BRIDGE], what=f"ip link delete {BRIDGE}")
