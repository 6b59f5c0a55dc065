"""The lab's Kubernetes mirror: its row of the versions table, the artefact tree, and the HTTP server on the bridge.

Written with the build (`ensure_kubernetes`, under the cache lock) next to the binaries it comes from:

    v1.20.2/mirror/<URL path>     the artefacts under upstream's URL paths (release/v1.20.2/bin/linux/amd64/kubeadm,
                                  helm-v3.17.2-linux-amd64.tar.gz), served as they are
    v1.20.2/versions-row.json     {"1.20.2": row}: the row in the format of plugins/module_utils/_versions/kubernetes_versions.yml
    v1.20.2/mirror-packed.json    which recorded binary each packed artefact was packed from
    v1.20.3-lab.1/versions-row.json, mirror-packed.json   the same for the relabelled build (kubernetes.RELABELLED),
                                  whose artefacts go into v1.20.2/mirror/ under their own URL paths

A binary's sha256 is the one SHA256SUMS recorded when it was built; helm's tarball is packed deterministically from
the recorded helm, and its sha256 is that of the packed bytes. Nothing is hashed from a download. The row's URLs are
on `lab-mirror.invalid`, a name that never resolves: `lab up` serves the tree on the bridge address and sets
`kubernetes_mirror_url`, which the node role puts in front of each URL's path.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from . import LabError
from .host import file_sha256
from .paths import LabPaths
from .plan import HOST_ADDRESS

VERSION = "1.20.2"
ARCH = "amd64"
ROW_BASE_URL = "http://lab-mirror.invalid"
PORT = 8780
START_SECONDS = 10.0


def packed_tarball(members: list[tuple[str, bytes | None]]) -> bytes:
    """A .tar.gz of these members in this order (name, content; None: a directory), byte-identical for the same
    members: fixed modes (0755), owners and times."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for name, content in members:
            member = tarfile.TarInfo(name)
            member.mode = 0o755
            if content is None:
                member.type = tarfile.DIRTYPE
                archive.addfile(member)
            else:
                member.size = len(content)
                archive.addfile(member, io.BytesIO(content))
    packed = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=packed, mtime=0, compresslevel=6) as compressed:
        compressed.write(raw.getvalue())
    return packed.getvalue()


def helm_tarball(data: bytes) -> bytes:
    """Upstream's helm-vX-linux-ARCH.tar.gz shape (linux-ARCH/helm), byte-identical for the same binary."""
    return packed_tarball([(f"linux-{ARCH}", None), (f"linux-{ARCH}/helm", data)])


@dataclass(frozen=True)
class MirrorArtifact:
    """One artefact of the lab's row: which built binary it comes from and how it is shaped for the role."""

    name: str
    version: str
    url_path: str
    source: str
    # How the built binary becomes the artefact; None: the binary as it is (its sha256 is SHA256SUMS').
    pack: Callable[[bytes], bytes] | None = None


def artifacts(version: str) -> tuple[MirrorArtifact, ...]:
    """The lab's row of one build, one entry per artefact it provides (one more is one more line)."""
    return (
        MirrorArtifact("kubeadm", version, f"release/v{version}/bin/linux/{ARCH}/kubeadm", "kubeadm"),
        MirrorArtifact("kubelet", version, f"release/v{version}/bin/linux/{ARCH}/kubelet", "kubelet"),
        MirrorArtifact("kubectl", version, f"release/v{version}/bin/linux/{ARCH}/kubectl", "kubectl"),
        MirrorArtifact("helm", "3.17.2", f"helm-v3.17.2-linux-{ARCH}.tar.gz", "helm-3.17.2", helm_tarball),
    )


ARTIFACTS = artifacts(VERSION)
# The kubelet stand-in is the container runtime and brings its own crictl: the row says it provides none of these.
NOT_PROVIDED = ("crictl", "containerd", "runc", "cni_plugins")


def images(version: str) -> dict[str, str]:
    """kubeadm 1.20's images; the stand-in runs the kube-* and etcd ones as processes of the binaries bound from the
    host, the kube-* ones of exactly the tag's version."""
    return {
        "kube-apiserver": f"k8s.gcr.io/kube-apiserver:v{version}",
        "kube-controller-manager": f"k8s.gcr.io/kube-controller-manager:v{version}",
        "kube-scheduler": f"k8s.gcr.io/kube-scheduler:v{version}",
        "kube-proxy": f"k8s.gcr.io/kube-proxy:v{version}",
        "etcd": "k8s.gcr.io/etcd:3.4.13-0",
        "coredns": "k8s.gcr.io/coredns:1.7.0",
        "pause": "k8s.gcr.io/pause:3.2",
    }


IMAGES = images(VERSION)
# The Debian packages kubeadm 1.20's preflight checks for beside the base system's (conntrack, iptables and ip are
# errors when missing; ethtool, socat, ebtables and tc warnings). The lab's base has them all: the node role finds
# nothing to install.
HOST_PACKAGES = ("conntrack", "iptables", "iproute2", "ethtool", "socat", "ebtables")


def tree_dir(version_dir: Path) -> Path:
    return version_dir / "mirror"


def row_file(version_dir: Path) -> Path:
    return version_dir / "versions-row.json"


def packed_file(version_dir: Path) -> Path:
    return version_dir / "mirror-packed.json"


def render_row(digests: Mapping[str, str], version: str = VERSION) -> dict:
    """The lab's row of one build from the sha256 of each artefact's file in the tree."""
    row_artifacts: dict = {name: None for name in NOT_PROVIDED}
    for artifact in artifacts(version):
        row_artifacts[artifact.name] = {
            "version": artifact.version,
            ARCH: {"url": f"{ROW_BASE_URL}/{artifact.url_path}", "sha256": digests[artifact.name]},
        }
    return {"artifacts": row_artifacts, "images": images(version)}


def ensure_mirror(
    version_dir: Path,
    recorded: Mapping[str, str],
    log: Callable[[str], None],
    version: str = VERSION,
    tree: Path | None = None,
) -> None:
    """Write the tree and the row from the recorded binaries in version_dir/bin; leave what is already right.

    The caller holds the cache lock and has checked the binaries against `recorded` (SHA256SUMS). A binary is in the
    tree as a hard link to the verified one (checked by inode, not hashed again); a packed artefact is packed again
    only when its source's recorded sha256 changed (packed.json remembers which source each packing came from).
    `tree` is where the artefacts go (default: version_dir's own; a relabelled build's go into the served tree).
    """
    tree = tree or tree_dir(version_dir)
    packed_record = load_json(packed_file(version_dir))
    digests: dict[str, str] = {}
    packed: dict[str, dict[str, str]] = {}
    written = []
    for artifact in artifacts(version):
        target = tree / artifact.url_path
        source = version_dir / "bin" / artifact.source
        if artifact.pack is None:
            digests[artifact.name] = recorded[artifact.source]
            if not _same_file(target, source):
                place(target, source=source)
                written.append(artifact.url_path)
            continue
        before = packed_record.get(artifact.name, {})
        if before.get("source_sha256") == recorded[artifact.source] and sha256_or_none(target) == before.get("sha256"):
            digests[artifact.name] = before["sha256"]
        else:
            data = artifact.pack(source.read_bytes())
            digests[artifact.name] = hashlib.sha256(data).hexdigest()
            place(target, data=data)
            written.append(artifact.url_path)
        packed[artifact.name] = {"source_sha256": recorded[artifact.source], "sha256": digests[artifact.name]}
    row = json.dumps({version: render_row(digests, version)}, indent=2, sort_keys=True) + "\n"
    if written or not _same_text(row_file(version_dir), row) or packed != packed_record:
        place(packed_file(version_dir), data=(json.dumps(packed, indent=2, sort_keys=True) + "\n").encode())
        place(row_file(version_dir), data=row.encode())
        log(f"kubernetes: mirror: wrote {' '.join(written) or 'nothing new'} and the row {row_file(version_dir)}")


def load_row(version_dir: Path) -> dict:
    """{"1.20.2": row} as the build wrote it, with the host packages its kubeadm checks for; a missing row means the
    build has not written the mirror yet. (The packages are added here, not written into the shared build's row.)"""
    try:
        rows = json.loads(row_file(version_dir).read_text())
    except (OSError, ValueError) as exc:
        raise LabError(f"no lab versions row at {row_file(version_dir)} ({exc}): run tests/lab/lab kubernetes") from exc
    return {version: {**row, "host_packages": list(HOST_PACKAGES)} for version, row in rows.items()}


def sha256_or_none(path: Path) -> str | None:
    try:
        return file_sha256(path)
    except OSError:
        return None


def _same_file(target: Path, source: Path) -> bool:
    try:
        return target.samefile(source)
    except OSError:
        return False


def load_json(path: Path) -> dict:
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _same_text(path: Path, text: str) -> bool:
    try:
        return path.read_text() == text
    except OSError:
        return False


def place(path: Path, *, data: bytes | None = None, source: Path | None = None) -> None:
    """path written whole or not at all: the bytes, or a hard link to (else a copy of) source, renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.unlink(missing_ok=True)
    if source is None:
        temporary.write_bytes(data or b"")
        temporary.chmod(0o644)
    else:
        try:
            os.link(source, temporary)
        except OSError:
            shutil.copyfile(source, temporary)
    temporary.rename(path)


# ---- the server -------------------------------------------------------------------------


def url() -> str:
    return f"http://{HOST_ADDRESS}:{PORT}"


def _pid_file(paths: LabPaths) -> Path:
    return paths.lab_dir / "mirror.pid"


def _command(tree: Path) -> list[str]:
    return [sys.executable, "-m", "http.server", "--bind", HOST_ADDRESS, "--directory", str(tree), str(PORT)]


def live_pid(paths: LabPaths) -> int | None:
    """The pid in mirror.pid if that process is alive and is this lab's mirror server."""
    try:
        pid = int(_pid_file(paths).read_text().split()[0])
        line = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError, IndexError):
        return None
    wanted = [part.encode() for part in ("http.server", "--bind", HOST_ADDRESS, str(PORT))]
    return pid if all(part in line for part in wanted) else None


def serve(paths: LabPaths, tree: Path) -> str:
    """The mirror's URL, its server started (once, pid-file tracked) on the bridge address only."""
    running = live_pid(paths)
    if running is not None and (str(tree).encode() in (Path("/proc") / str(running) / "cmdline").read_bytes()):
        return url()
    if running is not None:
        stop(paths)
    log_file = paths.lab_dir / "mirror.log"
    with open(log_file, "ab") as output:
        process = subprocess.Popen(
            _command(tree), stdin=subprocess.DEVNULL, stdout=output, stderr=output, start_new_session=True
        )
    _pid_file(paths).write_text(f"{process.pid}\n")
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_file.read_text(errors="replace").strip().splitlines()[-5:]
            raise LabError(
                f"the lab mirror server exited ({process.returncode}) on {HOST_ADDRESS}:{PORT}: " + " | ".join(tail)
            )
        try:
            with socket.create_connection((HOST_ADDRESS, PORT), timeout=1.0):
                return url()
        except OSError:
            time.sleep(0.1)
    stop(paths)
    raise LabError(f"the lab mirror server did not listen on {HOST_ADDRESS}:{PORT} within {START_SECONDS:g} s")


def stop(paths: LabPaths) -> None:
    """Stop this lab's mirror server (by its pid file, nothing else), waiting a bounded time."""
    pid = live_pid(paths)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and live_pid(paths) == pid:
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    break
            except ChildProcessError:
                pass
            time.sleep(0.1)
        if live_pid(paths) == pid:
            os.kill(pid, signal.SIGKILL)
    _pid_file(paths).unlink(missing_ok=True)
