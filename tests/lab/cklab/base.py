"""The base root every node boots over: Debian bookworm with sshd, the TPM stack and the node venv.

Built once and cached under CK_LAB_CACHE/base-<key>, where the key hashes everything
that goes into it (this file included). A build happens in a temporary directory that
is renamed at the end, so a crash never leaves a half base that looks cached.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import LabError
from .host import run
from .paths import LabPaths

IMAGE_VERSION = "cklab-base-2"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
NODE_VENV = "/opt/confidential-kubernetes/venv"
DOUBLES_MOUNT = "/opt/k8s-doubles"
KUBERNETES_MOUNT = "/opt/kubernetes/bin"
# The control-plane "images" the kubelet stand-in runs as processes: bound one by one from the host's build
# (paths.kubernetes_bin) and linked into /usr/local/bin, where the stand-in looks for them. kubeadm, kubelet, kubectl
# and helm are not here: the node role installs them from the lab's mirror.
IMAGE_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd", "etcdctl")
# The relabelled build's control-plane binaries (paths.upgrade_bin), bound at <mount>/<version>/bin/<name>: the
# stand-in maps an image of that tag to them once `kubeadm upgrade` writes such images into the manifests.
IMAGE_VERSIONS_MOUNT = "/opt/kubernetes/versions"
UPGRADE_IMAGE_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
# The stand-in's crictl answers kubeadm's CRI calls (the lab's row provides no crictl).
STANDIN_TOOLS = ("crictl",)
# The program the node role's kubelet unit runs in the lab (node_stack_kubelet_path).
STANDIN_KUBELET = f"{DOUBLES_MOUNT}/bin/kubelet"
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "python3-venv",
    "iproute2",
    "cryptsetup-bin",
    "tpm2-tools",
    "libtss2-esys-3.0.2-0",
    "libtss2-tctildr0",
    "libtss2-tcti-swtpm0",
    "libtss2-mu0",
    "libtss2-rc0",
    "libtss2-fapi1",
    "ca-certificates",
    "procps",
    # What kubeadm's preflight looks for on a node.
    "conntrack",
    "iptables",
    "ethtool",
    "socat",
    "ebtables",
)
NODE_IMPORT_CHECK = "import tpm2_pytss, cryptography.hazmat.primitives.hpke, grpc, yaml"

SSHD_CONFIG = """\
# confidential-kubernetes lab: root by key only, one host key made per node.
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
HostKey /etc/ssh/ssh_host_ed25519_key
UseDNS no
"""

# Nodes get their host key from the lab before boot; this unit covers a node booted without one.
HOSTKEY_UNIT = """\
[Unit]
Description=Make the SSH host key of this lab node
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key
Before=ssh.service

[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -q -t ed25519 -N "" -f /etc/ssh/ssh_host_ed25519_key

[Install]
WantedBy=multi-user.target
"""

# Beside the node role's kubelet unit: the stand-in runs static pods as its own child processes, so a kubelet restart
# must leave them running, and it finds the Kubernetes binaries in /usr/local/bin although it runs from DOUBLES_MOUNT.
STANDIN_DROPIN = """\
[Service]
KillMode=process
Environment=KUBELET_STANDIN_BIN_DIR=/usr/local/bin
"""

# systemd-sysctl skips containers (read-only /proc/sys); /proc/sys/net is the node's own and writable.
SYSCTL_CONF = """\
net.ipv4.ip_forward = 1
net.bridge.bridge-nf-call-iptables = 1
net.bridge.bridge-nf-call-ip6tables = 1
"""
SYSCTL_UNIT = """\
[Unit]
Description=Kubernetes network sysctls of this lab node
Before=kubelet.service

[Service]
Type=oneshot
ExecStart=/usr/sbin/sysctl -q -e -p /etc/sysctl.d/90-kubernetes.conf

[Install]
WantedBy=multi-user.target
"""

# Units that only slow a disposable container's boot down.
MASKED_UNITS = (
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "e2scrub_all.timer",
    "e2scrub_reap.service",
    "fstrim.timer",
    "systemd-networkd-wait-online.service",
    "getty@.service",
    "console-getty.service",
    "systemd-timesyncd.service",
)


@dataclass(frozen=True)
class Base:
    """A built base: the root directory and the image id the nodes measure."""

    root: Path
    image_id: str


def cache_key(requirements: str, build_source: str | None = None) -> str:
    """Hash of everything that goes into the base; equal keys mean an equal base."""
    if build_source is None:
        build_source = Path(__file__).read_text()
    digest = hashlib.sha256()
    for part in (IMAGE_VERSION, SUITE, "\n".join(PACKAGES), requirements, build_source):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


def base_dir(paths: LabPaths, key: str) -> Path:
    return paths.cache_dir / f"base-{key[:20]}"


def cached_base(paths: LabPaths) -> Base | None:
    key = cache_key(_requirements(paths))
    directory = base_dir(paths, key)
    if (directory / "image-id").is_file() and (directory / "root" / "usr").is_dir():
        return Base(root=directory / "root", image_id=(directory / "image-id").read_text().strip())
    return None


def ensure_base(paths: LabPaths, log=print) -> Base:
    """The cached base, built first when the cache has none for the current key."""
    found = cached_base(paths)
    if found is not None:
        return found
    key = cache_key(_requirements(paths))
    started = time.monotonic()
    log(f"building the lab base root {base_dir(paths, key)} (one time; a few minutes)")
    _build(paths, key)
    log(f"base root built in {time.monotonic() - started:.0f} s")
    found = cached_base(paths)
    if found is None:
        raise LabError("the base build finished but left no usable base root")
    return found


def _requirements(paths: LabPaths) -> str:
    try:
        return paths.requirements_node.read_text()
    except OSError as exc:
        raise LabError(f"cannot read {paths.requirements_node}: {exc.strerror}") from exc


def _build(paths: LabPaths, key: str) -> None:
    if sys.version_info[:2] != (3, 11):
        raise LabError(
            "building the base needs Python 3.11 on the host (node wheels must match "
            f"bookworm's python3), this is {sys.version.split()[0]}"
        )
    paths.cache_dir.mkdir(parents=True, exist_ok=True)
    work = paths.cache_dir / f".build-{key[:20]}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    root = work / "root"
    wheelhouse = work / "wheelhouse"
    try:
        run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "-r", paths.requirements_node, "-w", wheelhouse],
            timeout=1200,
            what="pip wheel of requirements-node.txt",
        )
        run(
            ["debootstrap", "--variant=minbase", "--include=" + ",".join(PACKAGES), SUITE, root, MIRROR],
            timeout=1800,
            what="debootstrap",
        )
        _configure(root, key)
        _install_venv(root, wheelhouse, paths.requirements_node)
        run(_nspawn_pipe(root) + ["/usr/bin/apt-get", "clean"], what="apt-get clean in the base")
        shutil.rmtree(wheelhouse)
        (work / "image-id").write_text(key + "\n")
        final = base_dir(paths, key)
        try:
            work.rename(final)
        except OSError:
            if not (final / "image-id").is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _configure(root: Path, key: str) -> None:
    for old_key in (root / "etc" / "ssh").glob("ssh_host_*"):
        old_key.unlink()
    (root / "etc/ssh/sshd_config.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/ssh/sshd_config.d/cklab.conf").write_text(SSHD_CONFIG)
    (root / "etc/systemd/system/cklab-ssh-hostkey.service").write_text(HOSTKEY_UNIT)
    (root / "etc/hostname").write_text("localhost\n")
    (root / "etc/hosts").write_text(hosts_file())
    (root / "etc/machine-id").write_text("")
    (root / "etc/confidential-kubernetes-lab-image").write_text(key + "\n")
    for directory in (
        DOUBLES_MOUNT,
        KUBERNETES_MOUNT,
        "srv",
        "root/.ssh",
        "run/tpm",
        "etc/systemd/system/kubelet.service.d",
        "etc/kubernetes/manifests",
        "etc/sysctl.d",
    ):
        (root / directory.lstrip("/")).mkdir(parents=True, exist_ok=True)
    (root / "root/.ssh").chmod(0o700)
    links = {
        **{name: f"{KUBERNETES_MOUNT}/{name}" for name in IMAGE_BINARIES},
        **{tool: f"{DOUBLES_MOUNT}/bin/{tool}" for tool in STANDIN_TOOLS},
    }
    for tool, target in links.items():
        link = root / "usr/local/bin" / tool
        link.unlink(missing_ok=True)
        link.symlink_to(target)
    for name in IMAGE_BINARIES:
        (root / KUBERNETES_MOUNT.lstrip("/") / name).touch()  # mount points of the binds
    (root / "etc/systemd/system/kubelet.service.d/20-kubelet-standin.conf").write_text(STANDIN_DROPIN)
    (root / "etc/sysctl.d/90-kubernetes.conf").write_text(SYSCTL_CONF)
    (root / "etc/systemd/system/cklab-sysctl.service").write_text(SYSCTL_UNIT)
    run(
        [
            "systemctl",
            f"--root={root}",
            "enable",
            "systemd-networkd.service",
            "ssh.service",
            "cklab-ssh-hostkey.service",
            "cklab-sysctl.service",
        ],
        what="systemctl enable in the base",
    )
    run(["systemctl", f"--root={root}", "mask", *MASKED_UNITS], what="systemctl mask in the base")


def hosts_file(name: str = "", address: str = "") -> str:
    """/etc/hosts: localhost, and the node's own name (without it getfqdn() waits for DNS that is not there)."""
    own = f"{address}\t{name}\n" if name else ""
    return f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{own}"


def _nspawn_pipe(root: Path, *extra: str) -> list[str]:
    return [
        "systemd-nspawn",
        "--quiet",
        "--register=no",
        "--keep-unit",
        "--pipe",
        f"--directory={root}",
        "--private-network",
        *extra,
    ]


def _install_venv(root: Path, wheelhouse: Path, requirements: Path) -> None:
    binds = [f"--bind-ro={wheelhouse}:/tmp/wheelhouse", f"--bind-ro={requirements}:/tmp/requirements-node.txt"]
    run(
        _nspawn_pipe(root, *binds) + ["/usr/bin/python3", "-m", "venv", NODE_VENV],
        timeout=300,
        what="python3 -m venv in the base",
    )
    run(
        _nspawn_pipe(root, *binds, "--setenv=PIP_DISABLE_PIP_VERSION_CHECK=1")
        + [
            f"{NODE_VENV}/bin/pip",
            "install",
            "--quiet",
            "--no-index",
            "--find-links=/tmp/wheelhouse",
            "-r",
            "/tmp/requirements-node.txt",
        ],
        timeout=600,
        what="pip install in the base",
    )
    run(
        _nspawn_pipe(root) + [f"{NODE_VENV}/bin/python", "-c", NODE_IMPORT_CHECK],
        timeout=120,
        what="import check of the node venv",
    )
