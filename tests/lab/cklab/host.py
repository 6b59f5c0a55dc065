"""The host side: one command runner, and the checks of what the lab needs."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from . import LabError

# Commands the lab runs on the host, and the Debian package that ships each.
REQUIRED_COMMANDS: dict[str, str] = {
    "debootstrap": "debootstrap",
    "systemd-nspawn": "systemd-container",
    "swtpm": "swtpm",
    "swtpm_setup": "swtpm-tools",
    "swtpm_localca": "swtpm-tools",
    "tpm2_pcrextend": "tpm2-tools",
    "tpm2_pcrread": "tpm2-tools",
    "tpm2_nvread": "tpm2-tools",
    "systemctl": "systemd",
    "ip": "iproute2",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "openssl": "openssl",
}


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    env: Mapping[str, str] | None = None,
    input_text: str | None = None,
    timeout: float = 120,
    what: str | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> str:
    """Run one command (argument list, never a shell string), in `cwd` if given; return its stdout."""
    args = [str(a) for a in argv]
    full_env = None if env is None else {**os.environ, **env}
    try:
        done = subprocess.run(
            args,
            env=full_env,
            cwd=cwd,
            input=input_text,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"{what or args[0]}: no answer within {timeout:.0f} s") from exc
    except FileNotFoundError as exc:
        raise LabError(f"{args[0]}: command not found") from exc
    if done.returncode != 0:
        detail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise LabError(f"{what or ' '.join(args[:3])} failed (exit {done.returncode}): {detail[0]}")
    return done.stdout


def missing_packages(which=shutil.which) -> list[str]:
    """Debian packages whose commands are absent, each named once, in a stable order."""
    missing: list[str] = []
    for command, package in REQUIRED_COMMANDS.items():
        if which(command) is None and package not in missing:
            missing.append(package)
    return missing


def missing_kernel_features(proc_filesystems: Path = Path("/proc/filesystems")) -> list[str]:
    """Kernel features the lab cannot work without that this kernel lacks.

    Bridge and veth support are checked when the bridge is made: a module may load on demand.
    """
    missing: list[str] = []
    try:
        filesystems = {line.split()[-1] for line in proc_filesystems.read_text().splitlines() if line.split()}
    except OSError:
        filesystems = set()
    if "overlay" not in filesystems:
        missing.append("overlayfs (no 'overlay' in /proc/filesystems)")
    return missing


def check_host() -> None:
    """Fail with one line naming what is missing on this host."""
    if os.geteuid() != 0:
        raise LabError("the lab needs root (it creates a bridge and boots nspawn nodes)")
    packages = missing_packages()
    if packages:
        raise LabError("missing host packages: " + " ".join(packages) + " (apt-get install " + " ".join(packages) + ")")
    features = missing_kernel_features()
    if features:
        raise LabError("missing kernel features: " + "; ".join(features))
    if not Path("/sys/fs/cgroup").is_dir():
        raise LabError("systemd-nspawn cannot run here: no /sys/fs/cgroup")


INOTIFY_INSTANCES = Path("/proc/sys/fs/inotify/max_user_instances")
# systemd, journald, networkd, logind and dbus in a node each hold inotify instances.
INOTIFY_INSTANCES_PER_NODE = 16


def ensure_inotify_instances(node_count: int, setting: Path = INOTIFY_INSTANCES, log=print) -> None:
    """Raise the kernel's per-user inotify instance limit (default 128) so many nodes can boot."""
    wanted = 512 + INOTIFY_INSTANCES_PER_NODE * node_count
    try:
        current = int(setting.read_text())
        if current < wanted:
            setting.write_text(f"{wanted}\n")
            log(f"raised fs.inotify.max_user_instances from {current} to {wanted} for {node_count} nodes")
    except (OSError, ValueError) as exc:
        raise LabError(
            f"cannot raise fs.inotify.max_user_instances to {wanted} "
            f"(nodes would fail with 'Too many open files'): {exc}"
        ) from exc


def file_sha256(path: Path) -> str:
    """The sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
