"""The VM nodes' guest image: Debian bookworm built once per machine, cached, verified by sha256 before every use.

Layout under CK_LAB_CACHE/guest (the part other code relies on is IMAGE_KEY[:20]/):

    <key>/root.img      raw ext4 (label `root`) made with `mkfs.ext4 -d` from the debootstrap tree (no loop mount)
    <key>/vmlinuz       the guest's kernel and initrd, for QEMU's direct kernel boot
    <key>/initrd.img
    <key>/manifest.json the recipe key, the kernel release, each file's sha256 and each step's time; written last:
                        no manifest, no image
    build/              the debootstrap tree while building, logs/STEP.log
    lock                flock held for a whole ensure (shared for a check)

The key hashes the recipe (IMAGE_VERSION, suite, packages, the files the image gets): a changed recipe is another
image. Nothing node-specific is in the image: each VM gets its hostname, address, SSH host key and the lab's
authorized key from a small seed disk read at boot (`cklab-seed.service`), so one image serves every lab index.
A file that differs from the manifest means the image is rebuilt whole (about 8 minutes): mkfs output is not
reproducible byte for byte, so there is no partial repair.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import LabError
from .host import file_sha256
from .kubernetes import StepRunner, host_mirror, missing_debian_packages
from .paths import LabPaths

Log = Callable[[str], None]

IMAGE_VERSION = "cklab-guest-2"
SUITE = "bookworm"
IMAGE_SIZE = "4G"
# What the lab needs on the host to build the image and run VMs (swtpm comes with the lab's own packages).
HOST_PACKAGES = ("qemu-system-x86", "qemu-utils", "ovmf", "debootstrap", "e2fsprogs")
# REAL-NODE.md's list: a systemd guest with sshd, the TPM tools, dm-crypt and what kubeadm checks for; and what the
# node role apt-installs (node_runtime_packages, python3-apt for its apt module): the VM reaches no Debian mirror, so
# the role finds them present (issue 28). containerd and the CNI plugins are not here: the role installs the lab row's
# (cklab/runtime.py). runc is, as the host's: the row provides none (bookworm's lacks the 2025 container-escape fixes).
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "udev",
    "dbus",
    "openssh-server",
    "linux-image-amd64",
    "initramfs-tools",
    "tpm2-tools",
    "cryptsetup",
    "runc",
    "iproute2",
    "python3",
    "kmod",
    "iptables",
    "conntrack",
    "ebtables",
    "ethtool",
    "socat",
    "procps",
    "e2fsprogs",
    "ca-certificates",
    "python3-venv",
    "python3-apt",
    "cryptsetup-bin",
)
FILES = ("root.img", "vmlinuz", "initrd.img")
MANIFEST = "manifest.json"
SEED_LABEL = "cklab-seed"
SEED_MOUNT = "/run/cklab-seed"
SEED_DEVICE_UNIT = "dev-disk-by\\x2dlabel-cklab\\x2dseed.device"

SSHD_CONFIG = """\
# confidential-kubernetes lab VM: root by key only; host key and authorized key come from the seed disk.
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
HostKey /etc/ssh/ssh_host_ed25519_key
UseDNS no
"""

# Copies the VM's own files from its seed disk before sshd and networkd start; the seed is not measured, so every VM
# boots the same measured kernel command line.
SEED_SCRIPT = f"""\
#!/bin/sh
# Apply this lab VM's seed disk (label {SEED_LABEL}): hostname, hosts, network unit, SSH host key, authorized key.
set -eu
mkdir -p {SEED_MOUNT}
mount -o ro /dev/disk/by-label/{SEED_LABEL} {SEED_MOUNT}
trap 'umount {SEED_MOUNT}' EXIT
install -m 0644 {SEED_MOUNT}/hostname /etc/hostname
cat /etc/hostname > /proc/sys/kernel/hostname
install -m 0644 {SEED_MOUNT}/hosts /etc/hosts
install -D -m 0644 {SEED_MOUNT}/10-cklab.network /etc/systemd/network/10-cklab.network
install -m 0600 {SEED_MOUNT}/ssh_host_ed25519_key /etc/ssh/ssh_host_ed25519_key
install -m 0644 {SEED_MOUNT}/ssh_host_ed25519_key.pub /etc/ssh/ssh_host_ed25519_key.pub
install -d -m 0700 /root/.ssh
install -m 0600 {SEED_MOUNT}/authorized_keys /root/.ssh/authorized_keys
"""

SEED_UNIT = f"""\
[Unit]
Description=Apply the lab VM seed disk (hostname, address, SSH keys)
DefaultDependencies=no
Requires={SEED_DEVICE_UNIT}
After={SEED_DEVICE_UNIT} local-fs.target
Before=ssh.service systemd-networkd.service network-pre.target sysinit.target
Wants=network-pre.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/cklab-seed

[Install]
WantedBy=sysinit.target
"""

FSTAB = "/dev/vda / ext4 rw,errors=remount-ro 0 1\n"

# Units that only slow a disposable VM's boot down.
MASKED_UNITS = (
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "e2scrub_all.timer",
    "e2scrub_reap.service",
    "fstrim.timer",
    "man-db.timer",
    "systemd-networkd-wait-online.service",
    "systemd-timesyncd.service",
)


def image_key() -> str:
    """Hash of the recipe: equal keys mean an equal image (bump IMAGE_VERSION when the build steps change)."""
    digest = hashlib.sha256()
    for part in (IMAGE_VERSION, SUITE, IMAGE_SIZE, "\n".join(PACKAGES), SSHD_CONFIG, SEED_SCRIPT, SEED_UNIT, FSTAB):
        digest.update(part.encode())
        digest.update(b"\0")
    digest.update("\n".join(MASKED_UNITS).encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class GuestImage:
    """A verified guest image: what QEMU boots."""

    key: str
    root_image: Path
    kernel: Path
    initrd: Path
    kernel_release: str


class GuestLayout:
    def __init__(self, paths: LabPaths, key: str) -> None:
        self.key = key
        self.root = paths.cache_dir / "guest"
        self.image_dir = self.root / key[:20]
        self.manifest = self.image_dir / MANIFEST
        self.build_dir = self.root / "build"
        self.tree = self.build_dir / "root"
        self.logs = self.build_dir / "logs"
        self.lock = self.root / "lock"


# ---- verification -----------------------------------------------------------------------


def render_manifest(key: str, kernel_release: str, digests: Mapping[str, str], seconds: Mapping[str, float]) -> str:
    record = {
        "image_version": IMAGE_VERSION,
        "key": key,
        "kernel_release": kernel_release,
        "sha256": {name: digests[name] for name in FILES},
        "build_seconds": {step: round(value, 1) for step, value in seconds.items()},
    }
    return json.dumps(record, indent=2) + "\n"


def parse_manifest(text: str, key: str) -> dict:
    """The manifest's record; LabError unless it is for this key and names a sha256 for every file."""
    try:
        record = json.loads(text)
    except ValueError as exc:
        raise LabError(f"the guest image manifest is not JSON ({exc})") from exc
    if not isinstance(record, dict) or record.get("key") != key:
        raise LabError("the guest image manifest is for another recipe key")
    digests = record.get("sha256")
    if not isinstance(digests, dict) or any(
        not isinstance(digests.get(name), str) or len(digests[name]) != 64 for name in FILES
    ):
        raise LabError(f"the guest image manifest lacks a sha256 for one of {', '.join(FILES)}")
    if not isinstance(record.get("kernel_release"), str):
        raise LabError("the guest image manifest lacks the kernel release")
    return record


def check_files(image_dir: Path, digests: Mapping[str, str]) -> dict[str, str]:
    """File name -> why it cannot be used, for every file that is missing or differs from the manifest."""
    problems: dict[str, str] = {}
    for name in FILES:
        path = image_dir / name
        if not path.is_file():
            problems[name] = "missing"
            continue
        actual = file_sha256(path)
        if actual != digests[name]:
            problems[name] = f"sha256 {actual[:12]}... but the manifest records {digests[name][:12]}..."
    return problems


def _verified(layout: GuestLayout) -> tuple[GuestImage | None, dict[str, str]]:
    """The image when the manifest and every file agree; else None and the problems."""
    try:
        text = layout.manifest.read_text()
    except FileNotFoundError:
        return None, {MANIFEST: f"missing in {layout.image_dir} (not built yet)"}
    try:
        record = parse_manifest(text, layout.key)
    except LabError as exc:
        return None, {MANIFEST: str(exc)}
    problems = check_files(layout.image_dir, record["sha256"])
    if problems:
        return None, problems
    directory = layout.image_dir
    image = GuestImage(
        layout.key, directory / "root.img", directory / "vmlinuz", directory / "initrd.img", record["kernel_release"]
    )
    return image, {}


def manifest_digests(image: GuestImage) -> dict[str, str]:
    """The sha256 of each file of a verified image, as its manifest records them (what measured boot digests)."""
    return parse_manifest((image.kernel.parent / MANIFEST).read_text(), image.key)["sha256"]


def verify_guest(paths: LabPaths, log: Log = print) -> dict[str, str]:
    """Problems of the cached image for the current recipe, without repairing anything ({} when it is usable)."""
    layout = GuestLayout(paths, image_key())
    with _locked(layout, fcntl.LOCK_SH, log):
        return _verified(layout)[1]


def cached_guest(paths: LabPaths, log: Log = print) -> GuestImage:
    """The cached image, verified; LabError naming the problems when it cannot be used (nothing is built)."""
    layout = GuestLayout(paths, image_key())
    with _locked(layout, fcntl.LOCK_SH, log):
        image, problems = _verified(layout)
    if image is None:
        found = "; ".join(f"{name}: {problem}" for name, problem in problems.items())
        raise LabError(f"the cached guest image cannot be used ({found}); 'lab up' or 'lab guest' builds it")
    return image


# ---- ensure -----------------------------------------------------------------------------


def ensure_guest(paths: LabPaths, log: Log = print) -> GuestImage:
    """The verified guest image: built the first time, rebuilt whole when a file differs from its manifest. The host
    packages that run it (HOST_PACKAGES) are installed when missing, also beside a cached image."""
    layout = GuestLayout(paths, image_key())
    started = time.monotonic()
    with _locked(layout, fcntl.LOCK_EX, log):
        image, problems = _verified(layout)
        if image is not None and missing_debian_packages(HOST_PACKAGES):
            log(f"guest: apt: {_apt_step(StepRunner(layout.logs, subject='guest'))}")
        if image is not None:
            log(
                f"guest: image {layout.key[:20]} verified ({len(FILES)} files match) in {time.monotonic() - started:.1f} s"
            )
            return image
        for name, problem in problems.items():
            log(f"guest: {name}: {problem}")
        _build(layout, log)
        image, problems = _verified(layout)
        if image is None:
            raise LabError(f"the guest image build left files that do not match its manifest: {problems}")
        log(f"guest: image {layout.key[:20]} ready in {layout.image_dir} after {time.monotonic() - started:.0f} s")
        return image


@contextmanager
def _locked(layout: GuestLayout, mode: int, log: Log) -> Iterator[None]:
    layout.root.mkdir(parents=True, exist_ok=True)
    with open(layout.lock, "a") as lock:
        try:
            fcntl.flock(lock, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"guest: waiting for another build or check holding {layout.lock}")
            fcntl.flock(lock, mode)
        yield


def _build(layout: GuestLayout, log: Log) -> None:
    """Every step afresh into a staging dir that becomes the image dir, manifest last."""
    log(f"guest: building image {layout.key[:20]} (about 3 minutes on 2 cores)")
    runner = StepRunner(layout.logs, subject="guest")
    seconds: dict[str, float] = {}

    def step(name: str, action: Callable[[], str]) -> None:
        started = time.monotonic()
        what = action()
        seconds[name] = time.monotonic() - started
        log(f"guest: {name}: {what} in {seconds[name]:.1f} s")

    for leftover in layout.root.glob(".image-*.tmp"):
        shutil.rmtree(leftover, ignore_errors=True)
    staging = layout.root / f".image-{os.getpid()}.tmp"
    staging.mkdir()
    try:
        step("apt", lambda: _apt_step(runner))
        step("debootstrap", lambda: _debootstrap_step(layout, runner))
        step("configure", lambda: _configure_step(layout, runner))
        release = _kernel_release(layout.tree)
        step("kernel", lambda: _kernel_step(layout, staging, release))
        step("mkfs", lambda: _mkfs_step(layout, runner, staging))
        started = time.monotonic()
        digests = {name: file_sha256(staging / name) for name in FILES}
        seconds["sha256"] = time.monotonic() - started
        (staging / MANIFEST).write_text(render_manifest(layout.key, release, digests, seconds))
        shutil.rmtree(layout.image_dir, ignore_errors=True)
        staging.rename(layout.image_dir)
        log(f"guest: recorded {layout.manifest} (sha256 of {len(FILES)} files in {seconds['sha256']:.1f} s)")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(layout.tree, ignore_errors=True)


def _apt_step(runner: StepRunner) -> str:
    missing = missing_debian_packages(HOST_PACKAGES)
    if not missing:
        return "host packages already present"
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    runner.run("apt", ["apt-get", "update", "-q"], env=environment, timeout=900)
    runner.run(
        "apt", ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], env=environment, timeout=900
    )
    return f"installed {' '.join(missing)}"


def _debootstrap_step(layout: GuestLayout, runner: StepRunner) -> str:
    shutil.rmtree(layout.tree, ignore_errors=True)
    layout.build_dir.mkdir(parents=True, exist_ok=True)
    mirror = host_mirror(runner)
    runner.run(
        "debootstrap",
        ["debootstrap", "--variant=minbase", "--include=" + ",".join(PACKAGES), SUITE, layout.tree, mirror],
        timeout=3600,
    )
    return f"{SUITE} from {mirror}"


def _configure_step(layout: GuestLayout, runner: StepRunner) -> str:
    tree = layout.tree
    for old_key in (tree / "etc/ssh").glob("ssh_host_*"):
        old_key.unlink()
    (tree / "etc/ssh/sshd_config.d").mkdir(parents=True, exist_ok=True)
    (tree / "etc/ssh/sshd_config.d/cklab.conf").write_text(SSHD_CONFIG)
    script = tree / "usr/local/sbin/cklab-seed"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(SEED_SCRIPT)
    script.chmod(0o755)
    (tree / "etc/systemd/system/cklab-seed.service").write_text(SEED_UNIT)
    (tree / "etc/fstab").write_text(FSTAB)
    (tree / "etc/hostname").write_text("localhost\n")
    (tree / "etc/machine-id").write_text("")
    (tree / "etc/confidential-kubernetes-lab-guest").write_text(layout.key + "\n")
    (tree / "root/.ssh").mkdir(mode=0o700, parents=True, exist_ok=True)
    runner.run(
        "configure",
        ["systemctl", f"--root={tree}", "enable", "systemd-networkd.service", "ssh.service", "cklab-seed.service"],
    )
    runner.run("configure", ["systemctl", f"--root={tree}", "mask", *MASKED_UNITS])
    for package in (tree / "var/cache/apt/archives").glob("*.deb"):
        package.unlink()
    return "seed unit, sshd, networkd; masked " + " ".join(MASKED_UNITS)


def _kernel_release(tree: Path) -> str:
    kernels = sorted(path.name.removeprefix("vmlinuz-") for path in (tree / "boot").glob("vmlinuz-*"))
    if len(kernels) != 1:
        raise LabError(f"guest kernel step: expected one /boot/vmlinuz-* in the guest tree, found {kernels}")
    if not (tree / "boot" / f"initrd.img-{kernels[0]}").is_file():
        raise LabError(f"guest kernel step: the guest tree has no /boot/initrd.img-{kernels[0]}")
    return kernels[0]


def _kernel_step(layout: GuestLayout, staging: Path, release: str) -> str:
    shutil.copyfile(layout.tree / "boot" / f"vmlinuz-{release}", staging / "vmlinuz")
    shutil.copyfile(layout.tree / "boot" / f"initrd.img-{release}", staging / "initrd.img")
    return f"vmlinuz and initrd.img of {release}"


def _mkfs_step(layout: GuestLayout, runner: StepRunner, staging: Path) -> str:
    image = staging / "root.img"
    runner.run("mkfs", ["mkfs.ext4", "-q", "-F", "-L", "root", "-d", layout.tree, image, IMAGE_SIZE], timeout=900)
    return f"{IMAGE_SIZE} ext4 from the tree"
