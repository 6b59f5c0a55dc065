# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Kubernetes versions table and the controller's verified artefact cache.

One row of the table pins every binary a node runs (Constellation: the Kubernetes version sent at init controls
every download). Each artefact is fetched once, from upstream, a mirror (same paths under another base URL) or a
local directory (air-gapped), hashed while it streams into a temporary file, and renamed into the cache only when
its sha256 is the table's. A cache hit is a verified hit: a cached file is hashed again before it is used, unless it
still has the stat fingerprint recorded beside it (``<file>.verified``) when it was last hashed and found good - no
write, truncate or chmod since, and not replaced (see ``_files.Fingerprint``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
import time
import urllib.error
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

import yaml
from ansible.module_utils.urls import ConnectionError as UrlsConnectionError
from ansible.module_utils.urls import open_url

from ansible_collections.confidential.kubernetes.plugins.module_utils._files import (
    FileDigest,
    Fingerprint,
    file_digest,
    write_file_atomically,
)

ARTIFACTS = ("kubeadm", "kubelet", "kubectl", "crictl", "containerd", "runc", "cni_plugins", "helm")
# Artefacts that are the same file on every architecture (Helm charts): version, url and sha256 in the entry itself.
CHARTS = ("cilium",)
IMAGES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy", "etcd", "coredns", "pause")
ARCHITECTURES = ("amd64", "arm64")
# Ansible's ansible_architecture (uname -m) to the architecture names release URLs use.
MACHINE_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
SHA256 = re.compile(r"^[0-9a-f]{64}$")
# An image reference with an explicit tag: registry/path:tag.
IMAGE_REF = re.compile(r"^[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)+:[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
CHUNK = 1 << 20
PROGRESS_SECONDS = 5.0
# Beside a cached file: its sha256, mode and fingerprint when it was last hashed and found to be the table's.
VERIFIED_SUFFIX = ".verified"
VERIFIED_RECORD = re.compile(r"^([0-9a-f]{64}) ([0-7]{4}) ([0-9]+ [0-9]+ [0-9]+ [0-9]+)\n$")


class VersionTableError(ValueError):
    """The versions table is malformed, or the requested version is not in it."""


class ArtifactError(RuntimeError):
    """An artefact cannot be fetched, or its sha256 is not the table's."""


@dataclass(frozen=True)
class Artifact:
    name: str
    version: str
    arch: str | None  # None: the same file on every architecture (a chart)
    url: str
    sha256: str

    @property
    def filename(self) -> str:
        return os.path.basename(urllib.parse.urlsplit(self.url).path)

    @property
    def label(self) -> str:
        return f"{self.name} {self.version} ({self.arch or 'chart'})"


def load_table(path: str) -> dict:
    """The shipped table: the mapping under ``node_kubernetes_versions``."""
    try:
        with open(path, encoding="utf-8") as stream:
            document = yaml.safe_load(stream)
    except (OSError, yaml.YAMLError) as exc:
        raise VersionTableError(f"cannot read the versions table {path}: {exc}") from exc
    if not isinstance(document, dict) or not isinstance(document.get("node_kubernetes_versions"), dict):
        raise VersionTableError(f"{path} has no 'node_kubernetes_versions' mapping")
    return {str(version): row for version, row in document["node_kubernetes_versions"].items()}


def merged_table(shipped: dict, extra: dict | None) -> dict:
    """The shipped rows with the inventory's rows merged over them (an extra row replaces a shipped one whole)."""
    table = dict(shipped)
    table.update({str(version): row for version, row in (extra or {}).items()})
    return table


def row_problems(version: str, row, shipped: bool = True) -> list[str]:
    """Every problem of one row, not just the first: missing artefacts and arches, bad URLs, bad sha256, bad images.

    A shipped row must be complete and use https. An inventory's extra row may point at a plain-http mirror and
    may set an artefact to null, saying explicitly that it provides none (a lab build without crictl).
    """
    problems: list[str] = []
    if not isinstance(row, dict):
        return [f"{version}: the row is not a mapping"]
    artifacts = row.get("artifacts")
    if not isinstance(artifacts, dict):
        return [f"{version}: no 'artifacts' mapping"]
    for name in ARTIFACTS + CHARTS:
        entry = artifacts.get(name)
        if entry is None and name in artifacts and not shipped:
            continue
        if not isinstance(entry, dict):
            problems.append(f"{version}: artefact {name} is missing")
            continue
        if not str(entry.get("version") or ""):
            problems.append(f"{version}: artefact {name} has no version")
        if name in CHARTS:
            unknown = sorted(str(key) for key in entry if key not in ("version", "url", "sha256"))
            if unknown:
                problems.append(f"{version}: artefact {name} is the same on every architecture; unknown keys {unknown}")
            problems += _item_problems(version, name, entry, shipped)
            continue
        arches = [arch for arch in entry if arch != "version"]
        if not arches:
            problems.append(f"{version}: artefact {name} has no architecture")
        for arch in arches:
            if arch not in ARCHITECTURES:
                problems.append(f"{version}: artefact {name} has an unknown architecture {arch!r}")
                continue
            problems += _item_problems(version, f"{name} {arch}", entry[arch], shipped)
    images = row.get("images")
    if not isinstance(images, dict):
        problems.append(f"{version}: no 'images' mapping")
    else:
        for image in IMAGES:
            if not IMAGE_REF.match(str(images.get(image) or "")):
                problems.append(f"{version}: image {image} is missing or has no tag ({images.get(image)!r})")
    return problems


def _item_problems(version: str, label: str, item, shipped: bool) -> list[str]:
    """The problems of one file's url and sha256."""
    if not isinstance(item, dict):
        return [f"{version}: {label} is not a mapping"]
    problems = []
    url = str(item.get("url") or "")
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in (("https",) if shipped else ("https", "http")) or not urllib.parse.urlsplit(url).path:
        problems.append(f"{version}: {label} url {url!r} is not an {'https' if shipped else 'http(s)'} URL")
    if not SHA256.match(str(item.get("sha256") or "")):
        problems.append(f"{version}: {label} sha256 is not 64 lower-case hex digits")
    return problems


def select_row(table: dict, version: str, shipped_versions: frozenset[str] = frozenset()) -> dict:
    """The row for ``version``, checked; an unknown version fails with the list of supported ones."""
    version = str(version).lstrip("v")
    if version not in table:
        supported = ", ".join(sorted(table, key=_version_key)) or "none"
        raise VersionTableError(f"Kubernetes {version or '(empty)'} is not in the versions table; supported: {supported}")
    problems = row_problems(version, table[version], shipped=version in shipped_versions)
    if problems:
        raise VersionTableError("the versions table row is malformed: " + "; ".join(problems))
    return table[version]


def row_artifacts(version: str, row: dict, arches: list[str], names: tuple[str, ...] = ARTIFACTS) -> list[Artifact]:
    """The artefacts ``names`` of a row (the node binaries by default) for the given arches, in table order; a chart
    once, whatever the arches. An arch the row lacks is an error; an artefact the row sets to null is left out."""
    result = []
    for name in (name for name in CHARTS if name in names):
        entry = row["artifacts"][name]
        if entry is not None:
            result.append(Artifact(name, str(entry["version"]), None, entry["url"], entry["sha256"]))
    for arch in arches:
        for name in (name for name in ARTIFACTS if name in names):
            entry = row["artifacts"][name]
            if entry is None:
                continue
            if arch not in entry:
                raise VersionTableError(f"Kubernetes {version} has no {name} for {arch}")
            result.append(Artifact(name, str(entry["version"]), arch, entry[arch]["url"], entry[arch]["sha256"]))
    return result


def node_arch(machine: str) -> str:
    try:
        return MACHINE_ARCH[machine]
    except KeyError:
        raise VersionTableError(f"no Kubernetes builds for the node architecture {machine!r} (supported: x86_64, aarch64)") from None


def source_url(artifact: Artifact, mirror_url: str | None) -> str:
    """Upstream's URL, or the same path under the mirror's base URL."""
    if not mirror_url:
        return artifact.url
    return mirror_url.rstrip("/") + urllib.parse.urlsplit(artifact.url).path


def cache_path(cache_dir: str, artifact: Artifact) -> str:
    # Content-addressed: two rows sharing an artefact share one file, and a changed checksum never hits a stale file.
    return os.path.join(cache_dir, artifact.sha256, artifact.filename)


Progress = Callable[[str], None]


def _stream_verified(source, target_dir: str, artifact: Artifact, origin: str, total: int | None,
                     progress: Progress) -> str:
    """Copy ``source`` into a temporary file in ``target_dir`` while hashing; return its path only when it matches."""
    digest = hashlib.sha256()
    done = 0
    last = time.monotonic()
    fd, tmp = tempfile.mkstemp(prefix=f".{artifact.filename}.", dir=target_dir)
    try:
        with os.fdopen(fd, "wb") as sink:
            for chunk in iter(lambda: source.read(CHUNK), b""):
                digest.update(chunk)
                sink.write(chunk)
                done += len(chunk)
                if time.monotonic() - last >= PROGRESS_SECONDS:
                    last = time.monotonic()
                    of = f" of {total / 1048576:.1f}" if total else ""
                    progress(f"{artifact.label}: {done / 1048576:.1f}{of} MiB from {origin}")
        if digest.hexdigest() != artifact.sha256:
            raise ArtifactError(
                f"sha256 mismatch for {artifact.label} from {origin}: expected {artifact.sha256}, got "
                f"{digest.hexdigest()}; it was not cached and nothing was installed")
        return tmp
    except BaseException:
        os.unlink(tmp)
        raise


def fetch(artifact: Artifact, cache_dir: str, mirror_url: str | None = None, source_dir: str | None = None,
          timeout: float = 60.0, progress: Progress = lambda line: None) -> tuple[str, bool]:
    """The verified cached file of ``artifact``: (path, fetched). fetched is False on a verified cache hit.

    A cached file whose hash no longer matches is removed and fetched again. With ``source_dir`` the artefact is
    read from ``<source_dir>/<URL path>`` (a mirror's tree on disk) and nothing touches the network.
    """
    path = cache_path(cache_dir, artifact)
    if os.path.exists(path):
        if _cached_file_verifies(path, artifact):
            return path, False
        for stale in (path, path + VERIFIED_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    try:
        tmp = _fetch_to_temporary(artifact, os.path.dirname(path), mirror_url, source_dir, timeout, progress)
    except ArtifactError:
        _remove_empty(os.path.dirname(path))
        raise
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path, True


def _cached_file_verifies(path: str, artifact: Artifact) -> bool:
    """Whether the cached file is the table's: its recorded fingerprint holds, or it hashes to the table's sha256 (and
    then its fingerprint is recorded, when it has settled, for the next run)."""
    record = path + VERIFIED_SUFFIX
    recorded = _read_record(record)
    try:
        found = file_digest(path, recorded if recorded is not None and recorded.sha256 == artifact.sha256 else None)
    except OSError as exc:
        raise ArtifactError(f"cannot read the cached {artifact.label} at {path}: {exc}") from exc
    if found.sha256 != artifact.sha256:
        return False
    if found.fingerprint is not None and found != recorded:
        try:
            # Written whole or not at all, so that a concurrent run reads either record; both name a verified file.
            write_file_atomically(record, f"{found.sha256} {found.mode:04o} {found.fingerprint}\n".encode("ascii"), 0o644)
        except OSError:
            pass  # a cache this controller cannot write to is still verified, by hashing, on every run
    return True


def _read_record(record: str) -> FileDigest | None:
    """The digest a ``.verified`` record holds; None when there is none, or it is not one."""
    try:
        with open(record, encoding="ascii") as handle:
            match = VERIFIED_RECORD.match(handle.read(256))
    except (OSError, UnicodeDecodeError):
        return None
    if match is None:
        return None
    return FileDigest(match.group(1), int(match.group(2), 8), Fingerprint.parse(match.group(3)))


def _fetch_to_temporary(artifact: Artifact, directory: str, mirror_url: str | None, source_dir: str | None,
                        timeout: float, progress: Progress) -> str:
    if source_dir:
        origin = os.path.join(source_dir, urllib.parse.urlsplit(artifact.url).path.lstrip("/"))
        progress(f"{artifact.label}: copying {origin}")
        try:
            with open(origin, "rb") as source:
                return _stream_verified(source, directory, artifact, origin, os.fstat(source.fileno()).st_size, progress)
        except OSError as exc:
            raise ArtifactError(f"cannot read {artifact.label} from {origin}: {exc}") from exc
    origin = source_url(artifact, mirror_url)
    progress(f"{artifact.label}: downloading {origin}")
    try:
        with open_url(origin, timeout=timeout) as response:
            length = response.headers.get("Content-Length")
            return _stream_verified(response, directory, artifact, origin, int(length) if length else None, progress)
    except (urllib.error.URLError, UrlsConnectionError, OSError, ValueError) as exc:
        raise ArtifactError(f"cannot download {artifact.label} from {origin}: {exc}") from exc


def _remove_empty(directory: str) -> None:
    # A failed fetch leaves no empty <sha256> directory behind; a successful one keeps its file in it.
    if os.path.isdir(directory) and not os.listdir(directory):
        shutil.rmtree(directory)


def fetch_all(artifacts: list[Artifact], cache_dir: str, **options) -> tuple[dict, list[str]]:
    """Fetch every artefact; returns ({name: {arch: path}}, labels fetched); a chart's arch is None. Stops at the
    first failure."""
    paths: dict[str, dict[str, str]] = {}
    fetched: list[str] = []
    for artifact in artifacts:
        path, was_fetched = fetch(artifact, cache_dir, **options)
        paths.setdefault(artifact.name, {})[artifact.arch] = path
        if was_fetched:
            fetched.append(artifact.label)
    return paths, fetched


def _version_key(version: str) -> tuple:
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"[.+-]", version))
