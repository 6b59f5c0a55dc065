"""The container runtime of the lab's rows: Debian bookworm's containerd and CNI plugins, pinned by package version and
sha256 (the values apt's signed index lists), repacked into upstream's release shapes and served from the lab's mirror
tree, so that the node role installs them on a VM node like any row's runtime (issue 28).

    <cache>/runtime/<package>_<version>_amd64.deb   each package, downloaded once with `apt-get download` and
                                                    verified against its pin before every use
    <mirror tree>/containerd/containerd/releases/download/v1.6.20/containerd-1.6.20-linux-amd64.tar.gz
                                                    bin/containerd, ctr and the shims, as upstream's tarball holds them
    <mirror tree>/containernetworking/plugins/releases/download/v1.1.1/cni-plugins-linux-amd64-v1.1.1.tgz
                                                    ./bridge, ./host-local, ... as upstream's

The packing is deterministic (fixed owners, modes and times), so each artefact's sha256 in the row is that of the
packed bytes, the same on every machine with the same packages. The rows provide no runc: bookworm's 1.1.5 lacks the
fixes of CVE-2025-31133, CVE-2025-52565 and CVE-2025-52881, which the versions table refuses in any row; the VM runs the
guest image's Debian runc (its host's), found on containerd's PATH.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import LabError
from .host import file_sha256, run
from .mirror import ARCH, ROW_BASE_URL, load_json, packed_tarball, place, sha256_or_none
from .paths import LabPaths

Log = Callable[[str], None]


@dataclass(frozen=True)
class RuntimePackage:
    """One Debian package pinned by version and sha256, and the row artefact repacked from it."""

    artifact: str
    package: str
    version: str
    sha256: str
    # The artefact's version (upstream's) and its URL path on the mirror (upstream's release layout).
    upstream_version: str
    url_path: str
    # The files of the package that go into the artefact, by their path in the package: their name in the archive.
    members: dict[str, str]

    @property
    def filename(self) -> str:
        return f"{self.package}_{self.version}_{ARCH}.deb"


CNI_PLUGINS = ("bandwidth", "bridge", "firewall", "host-local", "loopback", "portmap", "ptp", "tuning")
PACKAGES = (
    RuntimePackage(
        "containerd",
        "containerd",
        "1.6.20~ds1-1+deb12u3",
        "8669d264eeb0fcdb4a0b1ba436ab88ec5dafde4a66e1278ec279d830db4c2216",
        "1.6.20",
        f"containerd/containerd/releases/download/v1.6.20/containerd-1.6.20-linux-{ARCH}.tar.gz",
        {
            f"usr/bin/{name}": f"bin/{name}"
            for name in ("containerd", "containerd-shim", "containerd-shim-runc-v1", "containerd-shim-runc-v2", "ctr")
        },
    ),
    RuntimePackage(
        "cni_plugins",
        "containernetworking-plugins",
        "1.1.1+ds1-3+b5",
        "4cac8143474d1249b19f7b0e80b8d0daaa6dfdaa8bd514bc468d38d4a108099f",
        "1.1.1",
        f"containernetworking/plugins/releases/download/v1.1.1/cni-plugins-linux-{ARCH}-v1.1.1.tgz",
        {f"usr/lib/cni/{name}": f"./{name}" for name in CNI_PLUGINS},
    ),
)


def package_file(paths: LabPaths, package: RuntimePackage, log: Log) -> Path:
    """The package's .deb in the lab cache, downloaded when missing; refused when it is not the pinned one."""
    target = paths.cache_dir / "runtime" / package.filename
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as work:
            try:
                run(
                    ["apt-get", "download", f"{package.package}={package.version}"],
                    what=f"apt-get download {package.package}={package.version}",
                    cwd=work,
                )
            except LabError as exc:
                raise LabError(
                    f"{exc}: the lab's runtime pins Debian's {package.package} {package.version}; if the mirror has "
                    f"moved on, pin the new version and its sha256 (apt-cache show {package.package}) in cklab/runtime.py"
                ) from exc
            (Path(work) / package.filename).replace(target)
        log(f"runtime: downloaded {package.filename}")
    digest = file_sha256(target)
    if digest != package.sha256:
        target.unlink()
        raise LabError(
            f"{target} has sha256 {digest}, not the pinned {package.sha256} of {package.package} {package.version}: "
            "removed; nothing was installed"
        )
    return target


def artefact_bytes(deb: Path, package: RuntimePackage) -> bytes:
    """The artefact packed from the package's files, byte-identical for the same package."""
    with tempfile.TemporaryDirectory() as work:
        run(["dpkg-deb", "-x", deb, work], what=f"dpkg-deb -x {deb.name}")
        try:
            return packed_tarball(
                [(name, (Path(work) / path).read_bytes()) for path, name in sorted(package.members.items())]
            )
        except FileNotFoundError as exc:
            raise LabError(f"{deb.name} has no {Path(exc.filename).relative_to(work)}") from exc


def ensure_runtime(paths: LabPaths, tree: Path, log: Log) -> dict:
    """The rows' runtime artefacts ({name: entry}, runc null), packed into `tree` where they are missing or differ.

    `lab up` runs this every time: an artefact in the tree that still has the sha256 recorded when it was packed from
    the pinned package (packed.json beside the packages) is taken as it is, without unpacking the package again."""
    record_file = paths.cache_dir / "runtime" / "packed.json"
    record = load_json(record_file)
    entries: dict = {"runc": None}
    for package in PACKAGES:
        target = tree / package.url_path
        packed = record.get(str(target), {})
        if packed.get("package_sha256") == package.sha256 and sha256_or_none(target) == packed.get("sha256"):
            entries[package.artifact] = row_entry(package, packed["sha256"])
            continue
        data = artefact_bytes(package_file(paths, package, log), package)
        digest = hashlib.sha256(data).hexdigest()
        if sha256_or_none(target) != digest:
            place(target, data=data)
            log(f"runtime: packed {package.url_path} from {package.filename}")
        record[str(target)] = {"package_sha256": package.sha256, "sha256": digest}
        place(record_file, data=(json.dumps(record, indent=2, sort_keys=True) + "\n").encode())
        entries[package.artifact] = row_entry(package, digest)
    return entries


def row_entry(package: RuntimePackage, sha256: str) -> dict:
    """The package's artefact in the versions table's format, on the rows' base URL."""
    return {"version": package.upstream_version, ARCH: {"url": f"{ROW_BASE_URL}/{package.url_path}", "sha256": sha256}}


def with_runtime(rows: dict, paths: LabPaths, tree: Path, log: Log) -> dict:
    """The lab's rows with the runtime's artefacts (ensure_runtime) entered in each."""
    runtime = ensure_runtime(paths, tree, log)
    return {version: {**row, "artifacts": {**row["artifacts"], **runtime}} for version, row in rows.items()}
