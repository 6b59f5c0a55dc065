"""The lab's VM nodes: QEMU guests booted from the cached guest image (guest.py), beside the nspawn nodes.

A VM node is what a real host is and an nspawn node is not: its own kernel booted by UEFI firmware (OVMF) that
measures it into a TPM device (its swtpm, `/dev/tpmrm0` in the guest, EK certificate from the lab's CA as for every
node), a real event log, a second virtio disk for its state that device-mapper can map, and a NIC on the lab bridge
(a tap device). nodes/NAME/ holds:

    root.qcow2          the root disk: a qcow2 overlay over the cached root.img (which QEMU never writes)
    state-disk.img      the state disk (sparse raw, /dev/disk/by-id/virtio-cklab-state in the guest)
    OVMF_VARS.fd        this node's UEFI variables (a copy of OVMF's template)
    seed/, seed.img     hostname, hosts, network unit, SSH host key, the lab's authorized key: an ext4 made with
                        `mkfs.ext4 -d`, read at boot by the image's cklab-seed.service (not measured)
    tpm/, tpm-state/    the swtpm's control socket and its state
    console.log         the serial console; qemu.log, swtpm.log, qemu.pid, swtpm.pid, monitor.sock, node.json

The kernel command line is the same for every VM, so PCR 9 (the EFI stub measures the command line and the initrd)
is a golden value; everything node-specific comes from the seed disk.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from . import LabError, tpm
from .base import hosts_file
from .guest import SEED_LABEL, GuestImage
from .host import run
from .measure import TAMPER_ARGUMENT
from .nodes import live_pid, send_signal, wait_gone
from .paths import LabPaths
from .plan import BRIDGE, HOST_ADDRESS, LAB_INDEX, PREFIX_LENGTH, TAP_PREFIX, NodeSpec

QEMU = "qemu-system-x86_64"
MEMORY_MIB = 2048
# One vCPU: under TCG a second one costs more than it gives on a 2-core machine that also runs the rest of the lab (a
# vCPU thread preempted while it holds a guest lock leaves the other spinning).
CPUS = 1
# The host CPUs QEMU may run on (a comma-separated list, as `taskset -c` takes it without ranges); unset: any. The
# suite keeps the VM on a core of its own this way (scripts/test.sh).
VM_CPUS_VARIABLE = "CK_LAB_VM_CPUS"
# The same for every VM (PCR 9) but a tampered one, which gets measure.TAMPER_ARGUMENT appended; cgroup v1 because the
# 1.20 kubelet prefers it (REAL-NODE.md).
KERNEL_COMMAND_LINE = "root=/dev/vda rw console=ttyS0 systemd.unified_cgroup_hierarchy=0"
# The kernel's copy of the firmware's TCG event log in the guest.
EVENT_LOG = "/sys/kernel/security/tpm0/binary_bios_measurements"
# A 256 MiB translation cache instead of TCG's default: qemu's RSS about 0.84 GiB instead of 1.5 (REAL-NODE.md).
TCG_ACCELERATOR = "tcg,thread=multi,tb-size=256"
OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE_4M.fd")
OVMF_VARS = Path("/usr/share/OVMF/OVMF_VARS_4M.fd")
STATE_DISK_BYTES = 8 * 1024 * 1024 * 1024
STATE_DISK_SERIAL = "cklab-state"
STATE_DISK_DEVICE = f"/dev/disk/by-id/virtio-{STATE_DISK_SERIAL}"
SEED_SIZE = "8M"
PID_FILE_WAIT_SECONDS = 30.0
STOP_WAIT_SECONDS = 15.0
ACCELERATOR_VARIABLE = "CK_LAB_VM_ACCEL"


# ---- accelerator ------------------------------------------------------------------------


@dataclass(frozen=True)
class Accelerator:
    name: str  # "kvm" or "tcg"
    reason: str


def choose_accelerator(
    cpuinfo: str, kvm_device: bool, loaded_modules: frozenset[str], override: str | None = None
) -> Accelerator:
    """KVM only when a stock kernel boots under it: /dev/kvm, hardware virtualisation, and not a PVM host.

    A PVM host (the kvm_pvm module: a pagetable-based hypervisor inside a VM without VT-x) offers /dev/kvm, but a stock
    Debian kernel stalls in its decompressor under it (REAL-NODE.md), so the lab emulates with TCG there.
    """
    if override:
        if override not in ("kvm", "tcg"):
            raise LabError(f"{ACCELERATOR_VARIABLE} must be kvm or tcg, not {override!r}")
        return Accelerator(override, f"{ACCELERATOR_VARIABLE}={override}")
    if not kvm_device:
        return Accelerator("tcg", "no /dev/kvm")
    if "kvm_pvm" in loaded_modules:
        return Accelerator("tcg", "the host's KVM is PVM (kvm_pvm loaded), which boots no stock kernel")
    flags = {word for line in cpuinfo.splitlines() if line.startswith("flags") for word in line.split()}
    if not flags & {"vmx", "svm"}:
        return Accelerator("tcg", "no vmx or svm in /proc/cpuinfo")
    return Accelerator("kvm", "/dev/kvm with hardware virtualisation")


def detect_accelerator() -> Accelerator:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    modules = (
        frozenset(entry.name for entry in Path("/sys/module").iterdir())
        if Path("/sys/module").is_dir()
        else frozenset()
    )
    return choose_accelerator(
        cpuinfo, os.access("/dev/kvm", os.R_OK | os.W_OK), modules, os.environ.get(ACCELERATOR_VARIABLE)
    )


# ---- the node's identity on the lab network ---------------------------------------------


def tap_name(name: str) -> str:
    """The host side of the VM's NIC: ckvI-vm-N (at most 15 bytes, IFNAMSIZ)."""
    tap = TAP_PREFIX + name
    if len(tap) > 15:
        raise LabError(f"the tap name {tap} of {name} is longer than 15 bytes")
    return tap


def mac_address(node: NodeSpec) -> str:
    """A locally administered MAC of QEMU's prefix, made of the lab index and the node's last address byte."""
    last = int(node.address.rsplit(".", 1)[1])
    return f"52:54:00:77:{LAB_INDEX:02x}:{last:02x}"


def network_unit(node: NodeSpec) -> str:
    """The guest's systemd-networkd unit: the lab-owned static address on the NIC with this node's MAC."""
    return (
        "[Match]\n"
        f"MACAddress={mac_address(node)}\n"
        "\n"
        "[Network]\n"
        f"Address={node.address}/{PREFIX_LENGTH}\n"
        f"Gateway={HOST_ADDRESS}\n"
        "LinkLocalAddressing=no\n"
        "IPv6AcceptRA=no\n"
    )


# ---- QEMU -------------------------------------------------------------------------------


@dataclass(frozen=True)
class VmConfig:
    """Everything one QEMU run of a VM node needs (paths absolute)."""

    name: str
    accelerator: str
    kernel: Path
    initrd: Path
    root_disk: Path
    state_disk: Path
    seed_disk: Path
    ovmf_vars: Path
    tpm_socket: Path
    tap: str
    mac: str
    console_log: Path
    monitor_socket: Path
    pid_file: Path
    ovmf_code: Path = OVMF_CODE
    command_line: str = KERNEL_COMMAND_LINE
    memory_mib: int = MEMORY_MIB
    cpus: int = CPUS


def host_cpus(value: str) -> set[int]:
    """The host CPUs of CK_LAB_VM_CPUS ("1" or "0,1"); empty for an unset or empty value."""
    if not value.strip():
        return set()
    try:
        cpus = {int(item) for item in value.split(",")}
    except ValueError:
        raise LabError(f"{VM_CPUS_VARIABLE}={value!r}: not a comma-separated list of CPU numbers") from None
    available = os.sched_getaffinity(0)
    if not cpus <= available:
        raise LabError(f"{VM_CPUS_VARIABLE}={value!r}: CPU {sorted(cpus - available)} is not one this process may use")
    return cpus


def qemu_command(config: VmConfig) -> list[str]:
    """The qemu-system-x86_64 argument list: q35, OVMF with the node's variables, direct kernel boot, root, state and
    seed disks on virtio (vda, vdb, vdc in that order), a TPM TIS device on the node's swtpm, a tap NIC on the bridge,
    the serial console to a file, no display."""
    option_paths = (
        config.kernel,
        config.initrd,
        config.root_disk,
        config.state_disk,
        config.seed_disk,
        config.ovmf_code,
        config.ovmf_vars,
        config.tpm_socket,
        config.console_log,
        config.monitor_socket,
    )
    for path in option_paths:
        if "," in str(path) or not Path(path).is_absolute():
            raise LabError(f"QEMU option paths must be absolute and without commas: {path}")
    if config.accelerator == "tcg":
        accelerator = ["-accel", TCG_ACCELERATOR, "-cpu", "max"]
    elif config.accelerator == "kvm":
        accelerator = ["-accel", "kvm", "-cpu", "host"]
    else:
        raise LabError(f"unknown accelerator {config.accelerator!r}")
    return [
        QEMU,
        "-name",
        f"cklab{LAB_INDEX}-{config.name}",
        "-nodefaults",
        "-no-user-config",
        "-machine",
        "q35",
        *accelerator,
        "-m",
        str(config.memory_mib),
        "-smp",
        str(config.cpus),
        "-drive",
        f"if=pflash,format=raw,unit=0,readonly=on,file={config.ovmf_code}",
        "-drive",
        f"if=pflash,format=raw,unit=1,file={config.ovmf_vars}",
        "-kernel",
        str(config.kernel),
        "-initrd",
        str(config.initrd),
        "-append",
        config.command_line,
        "-drive",
        f"file={config.root_disk},format=qcow2,if=none,id=root",
        "-device",
        "virtio-blk-pci,drive=root",
        "-drive",
        f"file={config.state_disk},format=raw,if=none,id=state",
        "-device",
        f"virtio-blk-pci,drive=state,serial={STATE_DISK_SERIAL}",
        "-drive",
        f"file={config.seed_disk},format=raw,if=none,id=seed,readonly=on",
        "-device",
        "virtio-blk-pci,drive=seed",
        "-chardev",
        f"socket,id=chrtpm,path={config.tpm_socket}",
        "-tpmdev",
        "emulator,id=tpm0,chardev=chrtpm",
        "-device",
        "tpm-tis,tpmdev=tpm0",
        "-netdev",
        f"tap,id=net0,ifname={config.tap},script=no,downscript=no",
        "-device",
        f"virtio-net-pci,netdev=net0,mac={config.mac}",
        "-display",
        "none",
        "-serial",
        f"file:{config.console_log}",
        "-monitor",
        f"unix:{config.monitor_socket},server=on,wait=off",
        "-pidfile",
        str(config.pid_file),
    ]


def swtpm_command(state_dir: Path, control_socket: Path, pid_file: Path, log_file: Path) -> list[str]:
    """The VM's swtpm: QEMU drives it through the control socket (the firmware sends TPM2_Startup itself)."""
    return [
        "swtpm",
        "socket",
        "--tpm2",
        "--tpmstate",
        f"dir={state_dir}",
        "--ctrl",
        f"type=unixio,path={control_socket}",
        "--pid",
        f"file={pid_file}",
        "--log",
        f"file={log_file}",
    ]


# ---- one node ---------------------------------------------------------------------------


def node_files(paths: LabPaths, name: str) -> Mapping[str, Path]:
    directory = paths.node_dir(name)
    return {
        "root_disk": directory / "root.qcow2",
        "state_disk": directory / "state-disk.img",
        "ovmf_vars": directory / "OVMF_VARS.fd",
        "seed_dir": directory / "seed",
        "seed_disk": directory / "seed.img",
        "host_key": directory / "ssh_host_ed25519_key",
        "tpm_socket": tpm.tpm_dir(paths, name) / "swtpm-ctrl.sock",
        "console_log": directory / "console.log",
        "monitor_socket": directory / "monitor.sock",
        "qemu_pid": directory / "qemu.pid",
        "swtpm_pid": directory / "swtpm.pid",
    }


def host_public_key(paths: LabPaths, name: str) -> Path:
    return paths.node_dir(name) / "ssh_host_ed25519_key.pub"


def prepare(paths: LabPaths, node: NodeSpec, image: GuestImage, authorized_key: str) -> None:
    """The node's disks, firmware variables, host key and seed; those already made (disks, key) are kept."""
    files = node_files(paths, node.name)
    directory = paths.node_dir(node.name)
    directory.mkdir(parents=True, exist_ok=True)
    if not files["root_disk"].is_file():
        run(
            ["qemu-img", "create", "-q", "-f", "qcow2", "-b", image.root_image, "-F", "raw", files["root_disk"]],
            what=f"qemu-img create of {node.name}'s root overlay",
        )
    if not files["state_disk"].exists():
        with open(files["state_disk"], "wb") as sparse:
            sparse.truncate(STATE_DISK_BYTES)
    if not files["ovmf_vars"].is_file():
        shutil.copyfile(OVMF_VARS, files["ovmf_vars"])
    if not files["host_key"].is_file():
        run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{node.name}", "-f", files["host_key"]],
            what=f"ssh-keygen for {node.name}",
        )
    seed = files["seed_dir"]
    shutil.rmtree(seed, ignore_errors=True)
    seed.mkdir()
    (seed / "hostname").write_text(node.name + "\n")
    (seed / "hosts").write_text(hosts_file(node.name, node.address))
    (seed / "10-cklab.network").write_text(network_unit(node))
    (seed / "authorized_keys").write_text(authorized_key)
    shutil.copyfile(files["host_key"], seed / "ssh_host_ed25519_key")
    shutil.copyfile(host_public_key(paths, node.name), seed / "ssh_host_ed25519_key.pub")
    for entry in seed.iterdir():
        entry.chmod(0o600)
    run(
        ["mkfs.ext4", "-q", "-F", "-L", SEED_LABEL, "-d", seed, files["seed_disk"], SEED_SIZE],
        what=f"mkfs.ext4 of {node.name}'s seed disk",
    )
    record = {**asdict(node), "image_id": image.key}
    (directory / "node.json").write_text(json.dumps(record, indent=2) + "\n")


def ensure_tap(node: NodeSpec) -> str:
    """The node's tap device, enslaved to the lab bridge and up (made afresh: a leftover may belong to a dead QEMU)."""
    tap = tap_name(node.name)
    remove_tap(node.name)
    run(["ip", "tuntap", "add", "dev", tap, "mode", "tap"], what=f"ip tuntap add {tap}")
    run(["ip", "link", "set", tap, "master", BRIDGE], what=f"ip link set {tap} master {BRIDGE}")
    run(["ip", "link", "set", tap, "up"], what=f"ip link set {tap} up")
    return tap


def remove_tap(name: str) -> None:
    tap = tap_name(name)
    if Path("/sys/class/net", tap).exists():
        run(["ip", "link", "delete", tap], what=f"ip link delete {tap}")


def start(
    paths: LabPaths,
    node: NodeSpec,
    image: GuestImage,
    setup_conf: Path,
    authorized_key: str,
    log: Callable[[str], None],
) -> int:
    """Manufacture the TPM (once, EK certificate checked), prepare the node, start its swtpm and QEMU; return QEMU's
    pid. Booting takes minutes under TCG: the caller waits for SSH."""
    files = node_files(paths, node.name)
    accelerator = detect_accelerator()
    prepare(paths, node, image, authorized_key)
    new_tpm = not (tpm.tpm_state_dir(paths, node.name) / "tpm2-00.permall").is_file()
    tpm.manufacture(paths, node.name, setup_conf)
    if new_tpm:
        _check_ek_certificate(paths, node.name)
    tap = ensure_tap(node)
    _start_swtpm(paths, node.name)
    config = VmConfig(
        name=node.name,
        accelerator=accelerator.name,
        kernel=image.kernel,
        initrd=image.initrd,
        root_disk=files["root_disk"],
        state_disk=files["state_disk"],
        seed_disk=files["seed_disk"],
        ovmf_vars=files["ovmf_vars"],
        tpm_socket=files["tpm_socket"],
        tap=tap,
        mac=mac_address(node),
        console_log=files["console_log"],
        monitor_socket=files["monitor_socket"],
        pid_file=files["qemu_pid"],
        command_line=KERNEL_COMMAND_LINE + (TAMPER_ARGUMENT if node.tampered else ""),
    )
    files["qemu_pid"].unlink(missing_ok=True)
    directory = paths.node_dir(node.name)
    cpus = host_cpus(os.environ.get(VM_CPUS_VARIABLE, ""))
    with open(directory / "qemu.log", "ab") as qemu_log:
        process = subprocess.Popen(
            qemu_command(config),
            stdin=subprocess.DEVNULL,
            stdout=qemu_log,
            stderr=qemu_log,
            start_new_session=True,
            # Before exec, so that every thread QEMU starts inherits it.
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
        )
    deadline = time.monotonic() + PID_FILE_WAIT_SECONDS
    while not files["qemu_pid"].is_file():
        if process.poll() is not None:
            raise LabError(f"QEMU of {node.name} exited with {process.returncode}: {_tail(directory / 'qemu.log')}")
        if time.monotonic() > deadline:
            raise LabError(f"QEMU of {node.name} wrote no pid file within {PID_FILE_WAIT_SECONDS:.0f} s")
        time.sleep(0.1)
    log(f"{node.name}: QEMU {process.pid} booting with {accelerator.name} ({accelerator.reason}) on {tap}")
    return process.pid


def _check_ek_certificate(paths: LabPaths, name: str) -> None:
    """A fresh TPM's EK certificate must chain to the lab CA: checked once through a host-side swtpm, then stopped."""
    pid = tpm.start(paths, name)
    try:
        tpm.export_ek_ca(paths)
        tpm.verify_ek_certificate(paths, name)
    finally:
        send_signal(pid, signal.SIGTERM)
        if wait_gone([pid], STOP_WAIT_SECONDS):
            send_signal(pid, signal.SIGKILL)


def _start_swtpm(paths: LabPaths, name: str) -> None:
    files = node_files(paths, name)
    socket = files["tpm_socket"]
    socket.parent.mkdir(parents=True, exist_ok=True)
    if len(str(socket).encode()) > tpm.UNIX_PATH_MAX:
        raise LabError(f"CK_LAB_DIR is too long: the TPM socket path {socket} exceeds {tpm.UNIX_PATH_MAX} bytes")
    socket.unlink(missing_ok=True)
    files["swtpm_pid"].unlink(missing_ok=True)
    command = swtpm_command(
        tpm.tpm_state_dir(paths, name), socket, files["swtpm_pid"], paths.node_dir(name) / "swtpm.log"
    )
    process = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + tpm.SOCKET_WAIT_SECONDS
    while not (tpm.accepts_connections(socket) and files["swtpm_pid"].is_file()):
        if process.poll() is not None:
            raise LabError(f"swtpm of {name} exited with {process.returncode}; see {paths.node_dir(name)}/swtpm.log")
        if time.monotonic() > deadline:
            raise LabError(f"swtpm of {name} made no socket within {tpm.SOCKET_WAIT_SECONDS:.0f} s")
        time.sleep(0.02)


def is_running(paths: LabPaths, name: str) -> bool:
    return live_pid(paths, name, "qemu") is not None and live_pid(paths, name, "swtpm") is not None


def stop(paths: LabPaths, name: str) -> None:
    """Power the VM off (QEMU ends at SIGTERM, like pulling the plug), stop its swtpm, remove its tap."""
    pids = [pid for which in ("qemu", "swtpm") if (pid := live_pid(paths, name, which))]
    for pid in pids:
        send_signal(pid, signal.SIGTERM)
    left = wait_gone(pids, STOP_WAIT_SECONDS)
    for pid in left:
        send_signal(pid, signal.SIGKILL)
    if wait_gone(left, 5.0):
        raise LabError(f"{name}: processes would not stop: {' '.join(map(str, left))}")
    remove_tap(name)


def seconds_since_start(paths: LabPaths, name: str) -> float:
    """Time since QEMU wrote its pid file (at its start)."""
    return time.time() - node_files(paths, name)["qemu_pid"].stat().st_mtime


def qemu_rss_kib(paths: LabPaths, name: str) -> int | None:
    """QEMU's resident set (VmRSS) in KiB, or None when it is not running."""
    pid = live_pid(paths, name, "qemu")
    if pid is None:
        return None
    for line in (Path("/proc") / str(pid) / "status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return None


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:]) or "(no output)"
    except OSError:
        return "(no log)"
