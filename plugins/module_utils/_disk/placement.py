# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node's cluster state on the mounted state disk (DESIGN section 6), as in Constellation.

Each directory of ``CLUSTER_STATE_PATHS`` lives on the disk at ``<mount path>/<its path>``
and is bind-mounted onto its usual place. On first use the disk side is filled
with what the directory already holds (kubeadm's preflight pulls images into
containerd's store before the node lock), copied to a temporary name and renamed,
so that an interrupted copy is never taken for a placed directory. A directory
already bound from the disk is left alone; one that has something else mounted
on it is refused. Services that write these directories (containerd, the
kubelet) are stopped while a directory is copied and bound, and started again.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from . import StateDiskError, find_binary

CLUSTER_STATE_PATHS = ("/etc/kubernetes", "/var/lib/etcd", "/var/lib/kubelet", "/var/lib/containerd")
# The services that write them, stopped while a directory moves onto the disk.
CLUSTER_STATE_SERVICES = ("kubelet.service", "containerd.service")
# The mode of a directory that does not exist yet (kubeadm wants etcd's data directory 0700).
_NEW_MODE = {"/etc/kubernetes": 0o755, "/var/lib/containerd": 0o711}
_DEFAULT_NEW_MODE = 0o700
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")
MOUNTINFO = "/proc/self/mountinfo"


def disk_side(mount_path: str, path: str) -> str:
    """Where ``path`` lives on the disk mounted at ``mount_path``."""
    return os.path.join(mount_path, path.lstrip("/"))


def is_placed(mount_path: str, path: str) -> bool:
    """Whether ``path`` is the disk-side directory (bound from it), compared by device and inode."""
    try:
        here, there = os.stat(path), os.stat(disk_side(mount_path, path))
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def unescape_mountinfo(field: str) -> str:
    return _OCTAL_ESCAPE.sub(lambda match: chr(int(match.group(1), 8)), field)


def mount_points(mountinfo: str = MOUNTINFO) -> set[str]:
    """Every mount point (bind mounts of the same filesystem included, which os.path.ismount misses)."""
    with open(mountinfo, encoding="utf-8", errors="replace") as handle:
        return {unescape_mountinfo(line.split()[4]) for line in handle if line.strip()}


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    binary = find_binary(argv[0])
    if not binary:
        raise StateDiskError(f"{argv[0]} was not found on this host")
    return subprocess.run(
        [binary, *argv[1:]],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ, LC_ALL="C", LANG="C"),
    )


def _active_services(services: tuple[str, ...]) -> list[str]:
    if not services or not find_binary("systemctl"):
        return []
    return [unit for unit in services if _run(["systemctl", "is-active", "--quiet", unit]).returncode == 0]


def _fill_disk_side(path: str, target: str) -> None:
    """Copy what ``path`` holds (owners, modes, links, extended attributes) to ``target``, atomically by rename."""
    partial = f"{target}.partial"
    if os.path.lexists(partial):
        shutil.rmtree(partial)
    os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
    if os.path.isdir(path):
        result = _run(["cp", "-a", "--", path, partial])
        if result.returncode != 0:
            raise StateDiskError(f"copying {path} onto the state disk ({partial}) failed: {result.stderr.strip()}")
    else:
        os.mkdir(partial, _NEW_MODE.get(path, _DEFAULT_NEW_MODE))
    os.rename(partial, target)


def _bind(path: str, target: str) -> None:
    os.makedirs(path, mode=_NEW_MODE.get(path, _DEFAULT_NEW_MODE), exist_ok=True)
    result = _run(["mount", "--bind", target, path])
    if result.returncode != 0:
        raise StateDiskError(f"mount --bind {target} {path} failed: {result.stderr.strip()}")


def place_cluster_state(
    mount_path: str,
    paths: tuple[str, ...] = CLUSTER_STATE_PATHS,
    services: tuple[str, ...] = CLUSTER_STATE_SERVICES,
    check_mode: bool = False,
) -> list[str]:
    """Bind every path of ``paths`` from the disk mounted at ``mount_path``; returns the paths that were (or would be) bound."""
    pending = [path for path in paths if not is_placed(mount_path, path)]
    points = mount_points() if pending else set()
    for path in pending:
        if os.path.realpath(path) in points:
            raise StateDiskError(
                f"{path} has another filesystem mounted on it, not the state disk's {disk_side(mount_path, path)}: "
                "unmount it (the state disk holds the node's cluster state), then run again"
            )
        if os.path.lexists(path) and not os.path.isdir(path):
            raise StateDiskError(f"{path} is not a directory: it cannot be placed on the state disk")
    if not pending or check_mode:
        return pending
    stopped: list[str] = []
    try:
        for unit in _active_services(services):
            result = _run(["systemctl", "stop", unit])
            if result.returncode != 0:
                raise StateDiskError(
                    f"systemctl stop {unit} failed ({result.stderr.strip()}): its directories were not moved onto the state disk"
                )
            stopped.append(unit)
        for path in pending:
            target = disk_side(mount_path, path)
            if not os.path.isdir(target):
                _fill_disk_side(path, target)
            _bind(path, target)
    finally:
        for unit in reversed(stopped):
            _run(["systemctl", "start", unit])
    return pending
