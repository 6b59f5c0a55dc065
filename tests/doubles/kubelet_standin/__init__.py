"""A stand-in for the kubelet: TLS bootstrap, Node + Lease, static pods run as local processes (see README.md)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

# The CRI endpoint this stand-in answers for. It is a name, not a socket: bin/crictl answers for it.
ENDPOINT = "unix:///run/kubelet-standin/runtime.sock"
RUNTIME = "kubelet-standin://0.1.0"
STATE_DIR = Path(os.environ.get("KUBELET_STANDIN_STATE", "/run/kubelet-standin"))
LOG_DIR = Path(os.environ.get("KUBELET_STANDIN_LOGS", "/var/log/pods"))
# The components kubeadm runs as static pods; kube-proxy, pause and coredns have no local binary.
COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd")
# Where binaries of other versions are (<dir>/<version>/bin/<component>): the lab binds its relabelled build's there,
# so that an image of that tag (after `kubeadm upgrade`) maps to a binary of exactly that version.
IMAGE_VERSIONS_DIR = Path(os.environ.get("KUBELET_STANDIN_IMAGE_VERSIONS", "/opt/kubernetes/versions"))
_VERSIONS: dict[tuple, str] = {}


class StandinError(Exception):
    """A failure the stand-in reports in one line (fatal ones end the kubelet with exit 255)."""


def write_private(path: Path, data: bytes) -> None:
    """path (0600) written whole or not at all: a temporary file beside it, then renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as output:
        output.write(data)
    temporary.replace(path)


def bin_dir() -> Path:
    """Where the Kubernetes binaries are: beside the kubelet/crictl link that was run (set by bin/*)."""
    return Path(os.environ.get("KUBELET_STANDIN_BIN_DIR") or "/usr/local/bin")


def same_endpoint(endpoint: str) -> bool:
    """Whether a CRI endpoint names this stand-in's (with or without unix://, as kubelet and crictl accept)."""
    return endpoint in (ENDPOINT, ENDPOINT.removeprefix("unix://"))


def binary_version(path: Path, *args: str) -> str:
    """The x.y.z a Kubernetes or etcd binary reports (with --version, or the given arguments); cached per file."""
    try:
        stat = path.stat()
        key = (str(path), args, stat.st_mtime_ns, stat.st_size)
        if key not in _VERSIONS:
            out = subprocess.run(
                [str(path), *(args or ["--version"])], capture_output=True, text=True, timeout=30, check=False
            ).stdout
            found = re.search(r"(?:^v|Kubernetes v|etcd Version: )(\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?)", out)
            if not found:
                raise StandinError(f"{path} printed no version: {out.strip()[:80]!r}")
            _VERSIONS[key] = found.group(1)
    except OSError as exc:
        raise StandinError(f"cannot run {path}: {exc.strerror}") from None
    return _VERSIONS[key]


def kubernetes_version() -> str:
    """The version of the Kubernetes binaries beside the stand-in (`kubeadm version -o short`), e.g. v1.20.2."""
    return "v" + binary_version(bin_dir() / "kubeadm", "version", "-o", "short")


def resolve_image(reference: str) -> tuple[str, Path, str]:
    """(component, local binary, its version) of an image whose tag the binary's version matches: exactly for kube-*,
    in major.minor for etcd (nodes have Debian's etcd 3.4.23, kubeadm 1.20 asks for etcd:3.4.13-0). The binary beside
    the stand-in is looked at first, then IMAGE_VERSIONS_DIR/<tag>/bin/<component>."""
    name, colon, tag = reference.rpartition(":")
    if "@" in reference or not colon or "/" in tag or not name:
        raise StandinError(f"image {reference!r}: a [registry/]path/component:tag reference is needed")
    component = name.rsplit("/", 1)[-1]
    if component not in COMPONENTS:
        raise StandinError(f"image {reference!r}: no local binary for {component!r} (only {', '.join(COMPONENTS)})")
    wanted = tag.split("-")[0].split(".")[:2] if component == "etcd" else [tag]
    found = []
    for binary in (bin_dir() / component, IMAGE_VERSIONS_DIR / tag / "bin" / component):
        version = binary_version(binary) if binary.exists() else ""
        if version and (version.split(".")[:2] if component == "etcd" else ["v" + version]) == wanted:
            return component, binary, version
        found.append(f"{binary} " + (f"is version {version}" if version else "does not exist"))
    raise StandinError(f"image {reference!r}: " + "; ".join(found))
