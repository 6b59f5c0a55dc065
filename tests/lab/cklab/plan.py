"""The shape of a lab: node names, roles and addresses on the lab bridge.

Control planes take 10.77.I.10-19, nspawn workers 10.77.I.20-239 and VM workers (vm-N, cklab/vm.py)
10.77.I.240-254, so a lab holds up to 10 control planes, 220 workers and 15 VM workers, and adding
nodes of one kind never moves another's address. I is CK_LAB_INDEX (0-9, default 0): labs with
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
# A VM node's tap device on the bridge is TAP_PREFIX + its name (cklab/vm.py).
TAP_PREFIX = f"ckv{LAB_INDEX}-"
PREFIX_LENGTH = 24
HOST_ADDRESS = f"{NETWORK_PREFIX}.1"
CONTROL_PLANE_FIRST = 10
WORKER_FIRST = 20
VM_WORKER_FIRST = 240
MAX_CONTROL_PLANES = WORKER_FIRST - CONTROL_PLANE_FIRST
MAX_WORKERS = VM_WORKER_FIRST - WORKER_FIRST
MAX_VM_WORKERS = 254 - VM_WORKER_FIRST + 1

ROLE_CONTROL_PLANE = "control_plane"
ROLE_WORKER = "worker"
KIND_NSPAWN = "nspawn"
KIND_VM = "vm"
NODE_NAME_PREFIXES = ("cp-", "worker-", "vm-")


@dataclass(frozen=True)
class NodeSpec:
    name: str
    role: str
    address: str
    tampered: bool = False
    kind: str = KIND_NSPAWN

    @property
    def group(self) -> str:
        return "control_plane" if self.role == ROLE_CONTROL_PLANE else "workers"


def plan_nodes(
    control_planes: int, workers: int, tampered: frozenset[str] | set[str] = frozenset(), vm_workers: int = 0
) -> list[NodeSpec]:
    """The nodes of a lab with that many control planes, workers and VM workers, in that order."""
    if not 1 <= control_planes <= MAX_CONTROL_PLANES:
        raise LabError(f"--control-planes must be between 1 and {MAX_CONTROL_PLANES}, not {control_planes}")
    if not 0 <= workers <= MAX_WORKERS:
        raise LabError(f"--workers must be between 0 and {MAX_WORKERS}, not {workers}")
    if not 0 <= vm_workers <= MAX_VM_WORKERS:
        raise LabError(f"--vm-workers must be between 0 and {MAX_VM_WORKERS}, not {vm_workers}")
    nodes = [
        NodeSpec(f"cp-{i}", ROLE_CONTROL_PLANE, f"{NETWORK_PREFIX}.{CONTROL_PLANE_FIRST + i}")
        for i in range(control_planes)
    ]
    nodes += [NodeSpec(f"worker-{i}", ROLE_WORKER, f"{NETWORK_PREFIX}.{WORKER_FIRST + i}") for i in range(workers)]
    nodes += [
        NodeSpec(f"vm-{i}", ROLE_WORKER, f"{NETWORK_PREFIX}.{VM_WORKER_FIRST + i}", kind=KIND_VM)
        for i in range(vm_workers)
    ]
    unknown = sorted(set(tampered) - {node.name for node in nodes})
    if unknown:
        raise LabError(f"--tamper names no node of this lab: {', '.join(unknown)}")
    return [NodeSpec(n.name, n.role, n.address, n.name in tampered, n.kind) for n in nodes]


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
    for prefix in NODE_NAME_PREFIXES:
        if name.startswith(prefix) and name[len(prefix) :].isdigit():
            return True
    return False
