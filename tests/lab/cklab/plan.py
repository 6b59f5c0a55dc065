"""The shape of a lab: node names, roles and addresses on the lab bridge.

Control planes take 10.77.I.10-19 and workers 10.77.I.20-254, so a lab holds up to
10 control planes and 235 workers. I is CK_LAB_INDEX (0-9, default 0): labs with
different indexes (and different CK_LAB_DIRs) run side by side on their own bridges.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from . import LabError


def lab_index() -> int:
    raw = os.environ.get("CK_LAB_INDEX", "0")
    if not raw.isdigit() or not 0 <= int(raw) <= 9:
        raise LabError(f"CK_LAB_INDEX must be a number from 0 to 9, not {raw!r}")
    return int(raw)


LAB_INDEX = lab_index()
BRIDGE = f"cklab{LAB_INDEX}"
NETWORK_PREFIX = f"10.77.{LAB_INDEX}"
# nspawn names a node's host-side veth vb-<machine name>; a per-lab prefix keeps them apart.
MACHINE_PREFIX = f"l{LAB_INDEX}-" if LAB_INDEX else ""
PREFIX_LENGTH = 24
HOST_ADDRESS = f"{NETWORK_PREFIX}.1"
CONTROL_PLANE_FIRST = 10
WORKER_FIRST = 20
MAX_CONTROL_PLANES = WORKER_FIRST - CONTROL_PLANE_FIRST
MAX_WORKERS = 254 - WORKER_FIRST + 1

ROLE_CONTROL_PLANE = "control_plane"
ROLE_WORKER = "worker"


@dataclass(frozen=True)
class NodeSpec:
    name: str
    role: str
    address: str
    tampered: bool = False

    @property
    def group(self) -> str:
        return "control_plane" if self.role == ROLE_CONTROL_PLANE else "workers"


def plan_nodes(control_planes: int, workers: int, tampered: frozenset[str] | set[str] = frozenset()) -> list[NodeSpec]:
    """The nodes of a lab with that many control planes and workers, control planes first."""
    if not 1 <= control_planes <= MAX_CONTROL_PLANES:
        raise LabError(f"--control-planes must be between 1 and {MAX_CONTROL_PLANES}, not {control_planes}")
    if not 0 <= workers <= MAX_WORKERS:
        raise LabError(f"--workers must be between 0 and {MAX_WORKERS}, not {workers}")
    nodes = [
        NodeSpec(f"cp-{i}", ROLE_CONTROL_PLANE, f"{NETWORK_PREFIX}.{CONTROL_PLANE_FIRST + i}")
        for i in range(control_planes)
    ] + [NodeSpec(f"worker-{i}", ROLE_WORKER, f"{NETWORK_PREFIX}.{WORKER_FIRST + i}") for i in range(workers)]
    unknown = sorted(set(tampered) - {node.name for node in nodes})
    if unknown:
        raise LabError(f"--tamper names no node of this lab: {', '.join(unknown)}")
    return [NodeSpec(n.name, n.role, n.address, n.name in tampered) for n in nodes]


def network_unit(node: NodeSpec) -> str:
    """The node's 80-container-host0.network: a static address instead of nspawn's DHCP default."""
    return (
        "[Match]\n"
        "Virtualization=container\n"
        "Name=host0\n"
        "\n"
        "[Network]\n"
        f"Address={node.address}/{PREFIX_LENGTH}\n"
        f"Gateway={HOST_ADDRESS}\n"
        "LinkLocalAddressing=no\n"
        "IPv6AcceptRA=no\n"
    )


def is_lab_node_name(name: str) -> bool:
    """Whether a name has the form of a lab node name (used to find leftovers)."""
    for prefix in ("cp-", "worker-"):
        if name.startswith(prefix) and name[len(prefix) :].isdigit():
            return True
    return False
