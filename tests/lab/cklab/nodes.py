"""One lab node: its files on the host, its nspawn process, and how it is stopped.

nodes/NAME/ holds upper/ (the overlay upper dir: authorized_keys, the node's SSH host
key, the state-disk file), etc/ (hostname, hosts and network unit, bound read-only), tpm/
(bound to /run/tpm), tpm-state/, node.json, the pid files and the logs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import asdict
from pathlib import Path

from . import LabError
from .base import (
    DOUBLES_MOUNT,
    IMAGE_BINARIES,
    IMAGE_VERSIONS_MOUNT,
    KUBERNETES_MOUNT,
    UPGRADE_IMAGE_BINARIES,
    Base,
    hosts_file,
)
from .host import run
from .plan import BRIDGE, MACHINE_PREFIX, NodeSpec, network_unit
from .paths import UPGRADE_VERSION, LabPaths

STATE_DISK = "srv/state-disk.img"
STATE_DISK_BYTES = 64 * 1024 * 1024
STOP_WAIT_SECONDS = 15.0


def upper_dir(paths: LabPaths, name: str) -> Path:
    return paths.node_dir(name) / "upper"


def host_public_key(paths: LabPaths, name: str) -> Path:
    return upper_dir(paths, name) / "etc/ssh/ssh_host_ed25519_key.pub"


def prepare(paths: LabPaths, node: NodeSpec, image_id: str, authorized_key: str) -> None:
    """Write the node's own files; those already made (host key, state disk) are kept."""
    directory = paths.node_dir(node.name)
    upper = upper_dir(paths, node.name)
    ssh_dir = upper / "root/.ssh"
    ssh_dir.mkdir(parents=True, exist_ok=True)
    ssh_dir.chmod(0o700)
    authorized = ssh_dir / "authorized_keys"
    authorized.write_text(authorized_key)
    authorized.chmod(0o600)
    host_key = upper / "etc/ssh/ssh_host_ed25519_key"
    if not host_key.is_file():
        host_key.parent.mkdir(parents=True, exist_ok=True)
        run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{node.name}", "-f", host_key],
            what=f"ssh-keygen for {node.name}",
        )
    disk = upper / STATE_DISK
    if not disk.exists():
        disk.parent.mkdir(parents=True, exist_ok=True)
        with open(disk, "wb") as sparse:
            sparse.truncate(STATE_DISK_BYTES)
    etc = directory / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "hostname").write_text(node.name + "\n")
    (etc / "hosts").write_text(hosts_file(node.name, node.address))
    (etc / "80-container-host0.network").write_text(network_unit(node))
    (directory / "node.json").write_text(json.dumps({**asdict(node), "image_id": image_id}, indent=2) + "\n")


def recorded(paths: LabPaths, name: str) -> dict | None:
    """What node.json says about a node, or None when the node has no state."""
    try:
        return json.loads((paths.node_dir(name) / "node.json").read_text())
    except (OSError, ValueError):
        return None


def nspawn_command(paths: LabPaths, node: NodeSpec, base: Base) -> list[str]:
    directory = paths.node_dir(node.name)
    return [
        "systemd-nspawn",
        "--quiet",
        "--register=no",
        "--keep-unit",
        "--boot",
        f"--machine={MACHINE_PREFIX}{node.name}",
        f"--directory={base.root}",
        f"--overlay={base.root}:{upper_dir(paths, node.name)}:/",
        f"--network-bridge={BRIDGE}",
        f"--bind-ro={directory}/etc/hostname:/etc/hostname",
        f"--bind-ro={directory}/etc/hosts:/etc/hosts",
        f"--bind-ro={directory}/etc/80-container-host0.network:/etc/systemd/network/80-container-host0.network",
        f"--bind={directory}/tpm:/run/tpm",
        f"--bind-ro={paths.doubles_dir}:{DOUBLES_MOUNT}",
        *(f"--bind-ro={paths.kubernetes_bin / name}:{KUBERNETES_MOUNT}/{name}" for name in IMAGE_BINARIES),
        *(
            f"--bind-ro={paths.upgrade_bin / name}:{IMAGE_VERSIONS_MOUNT}/{UPGRADE_VERSION}/bin/{name}"
            for name in UPGRADE_IMAGE_BINARIES
        ),
        "--console=read-only",
        "--link-journal=no",
        "--resolv-conf=off",
        "--timezone=off",
    ]


def start(paths: LabPaths, node: NodeSpec, base: Base) -> int:
    """Boot the node in the background; its console goes to console.log. Return the nspawn pid."""
    directory = paths.node_dir(node.name)
    with open(directory / "console.log", "ab") as console:
        process = subprocess.Popen(
            nspawn_command(paths, node, base),
            stdin=subprocess.DEVNULL,
            stdout=console,
            stderr=console,
            start_new_session=True,
        )
    (directory / "nspawn.pid").write_text(f"{process.pid}\n")
    return process.pid


def read_pid(paths: LabPaths, name: str, which: str) -> int | None:
    try:
        return int((paths.node_dir(name) / f"{which}.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def live_pid(paths: LabPaths, name: str, which: str) -> int | None:
    """The pid in nodes/NAME/WHICH.pid if that process is alive and is really this node's."""
    pid = read_pid(paths, name, which)
    if pid is None:
        return None
    line = cmdline(pid)
    if str(paths.node_dir(name)) + "/" not in line:
        return None
    return pid


def is_running(paths: LabPaths, name: str) -> bool:
    return live_pid(paths, name, "nspawn") is not None and live_pid(paths, name, "swtpm") is not None


def console_tail(paths: LabPaths, name: str, lines: int = 15) -> str:
    try:
        text = (paths.node_dir(name) / "console.log").read_text(errors="replace")
    except OSError:
        return "(no console log)"
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text).replace("\r", "")
    kept = [line for line in text.splitlines() if line.strip()]
    return "\n".join("    " + line for line in kept[-lines:])


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The ppid is the second field after the parenthesised command name.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def send_signal(pid: int, signo: int) -> None:
    """Signal a process that may have ended meanwhile."""
    try:
        os.kill(pid, signo)
    except ProcessLookupError:
        pass


def wait_gone(pids: list[int], seconds: float) -> list[int]:
    """Wait until these processes are gone; return those still there after the bound."""
    deadline = time.monotonic() + seconds
    remaining = list(pids)
    while remaining and time.monotonic() < deadline:
        remaining = [pid for pid in remaining if _exists(pid)]
        if remaining:
            time.sleep(0.05)
    return [pid for pid in remaining if _exists(pid)]


def _exists(pid: int) -> bool:
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return False
    # A zombie has finished; its parent is not us, so it does not block teardown.
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def stop_container(nspawn_pid: int) -> None:
    """Kill the container's init, which ends its whole pid namespace, then let nspawn clean up."""
    for child in _children(nspawn_pid):
        send_signal(child, signal.SIGKILL)


def stop_processes(nspawn_pids: list[int], other_pids: list[int], container_inits: list[int] = ()) -> None:
    """Stop nspawn processes (container first), other processes, and orphaned container inits.

    A container init ignores SIGTERM, so it gets SIGKILL at once; others after a bounded wait.
    """
    for pid in nspawn_pids:
        stop_container(pid)
    for pid in container_inits:
        send_signal(pid, signal.SIGKILL)
    for pid in other_pids:
        send_signal(pid, signal.SIGTERM)
    left = wait_gone([*nspawn_pids, *other_pids, *container_inits], STOP_WAIT_SECONDS)
    for pid in left:
        send_signal(pid, signal.SIGKILL)
    left = wait_gone(left, 5.0)
    if left:
        raise LabError(f"processes would not stop: {' '.join(map(str, left))}")
