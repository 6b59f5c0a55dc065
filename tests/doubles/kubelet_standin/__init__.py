"""A stand-in for the kubelet: TLS bootstrap, Node + Lease, static pods run as local processes (see README.md)."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

# The CRI endpoint this stand-in answers for. It is a name, not a socket: bin/crictl answers for it.
ENDPOINT = "unix:///run/kubelet-standin/runtime.sock"
RUNTIME = "kubelet-standin"
RUNTIME_VERSION = "0.1.0"
STATE_DIR = Path(os.environ.get("KUBELET_STANDIN_STATE", "/run/kubelet-standin"))
LOG_DIR = Path(os.environ.get("KUBELET_STANDIN_LOGS", "/var/log/pods"))


class StandinError(Exception):
    """A failure the stand-in reports in one line (and exits 1 for, where it is fatal)."""


def bin_dir() -> Path:
    """Where the Kubernetes binaries are: beside the kubelet/crictl link that was run (set by bin/*)."""
    return Path(os.environ.get("KUBELET_STANDIN_BIN_DIR") or "/usr/local/bin")


def same_endpoint(endpoint: str) -> bool:
    """Whether a CRI endpoint names this stand-in's (with or without unix://, as kubelet and crictl accept)."""
    return endpoint in (ENDPOINT, ENDPOINT.removeprefix("unix://"))


_VERSIONS: dict[tuple, str] = {}


def binary_version(path: Path, *args: str) -> str:
    """The x.y.z a Kubernetes or etcd binary reports (with --version, or the given arguments); cached per file."""
    try:
        stat = path.stat()
        key = (str(path), args, stat.st_mtime_ns, stat.st_size)
        if key in _VERSIONS:
            return _VERSIONS[key]
        out = subprocess.run([str(path), *(args or ["--version"])], capture_output=True, text=True, timeout=30,
                             check=False).stdout
    except OSError as exc:
        raise StandinError(f"cannot run {path}: {exc.strerror}") from None
    found = re.search(r"(?:^v|Kubernetes v|etcd Version: )(\d+\.\d+\.\d+)", out)
    if not found:
        raise StandinError(f"{path} printed no version: {out.strip()[:80]!r}")
    _VERSIONS[key] = found.group(1)
    return found.group(1)


def kubernetes_version() -> str:
    """The version of the Kubernetes binaries beside the stand-in (`kubeadm version -o short`), e.g. v1.20.2."""
    return "v" + binary_version(bin_dir() / "kubeadm", "version", "-o", "short")
