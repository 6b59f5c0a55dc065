# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's verified artefact cache of the Kubernetes versions table's rows (``module_utils/_versions``).

One row of the table pins every binary a node runs (Constellation: the Kubernetes version sent at init controls
every download). Each artefact is fetched once, from upstream, a mirror (same paths under another base URL) or a
local directory (air-gapped), hashed while it streams into a temporary file, and renamed into the cache only when
its sha256 is the table's. A cache hit is a verified hit: a cached file is hashed again before it is used, unless it
still has the stat fingerprint recorded beside it (``<file>.verified``) when it was last hashed and found good - no
write, truncate or chmod since, and not replaced (see ``_files.Fingerprint``).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import os
import re
import shutil
import tempfile
import time
import urllib.error
import urllib.parse
from collections.abc import Callable

from ansible.module_utils.urls import ConnectionError as UrlsConnectionError
from ansible.module_utils.urls import open_url

from ansible_collections.confidential.kubernetes.plugins.module_utils._files import (
    FileDigest,
    Fingerprint,
    file_digest,
    write_file_atomically,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils import _versions
from ansible_collections.confidential.kubernetes.plugins.module_utils._versions import Artifact

CHUNK = 1 << 20
PROGRESS_SECONDS = 5.0
# Beside a cached file: its sha256, mode and fingerprint when it was last hashed and found to be the table's.
VERIFIED_SUFFIX = ".verified"
VERIFIED_RECORD = re.compile(r"^([0-9a-f]{64}) ([0-7]{4}) ([0-9]+ [0-9]+ [0-9]+ [0-9]+)\n$")


class ArtifactError(RuntimeError):
    """An artefact cannot be fetched, or its sha256 is not the table's."""


# The options every action that reads a row of the versions table takes, and how it reads them (row_of).
ROW_ARGUMENT_SPEC = dict(
    kubernetes_version=dict(type="str", required=True),
    versions_file=dict(type="path"),  # the collection's own table by default (its path differs per installation)
    versions_extra=dict(type="dict", default={}),
    allow_end_of_life=dict(type="bool", default=False),
    today=dict(type="str", default=""),
)
# The options of an action that fetches a row's files once into the controller's cache (binaries, images): the nodes'
# architectures, where the cache is, and the one source it fetches from (upstream by default).
FETCH_ARGUMENT_SPEC = dict(
    ROW_ARGUMENT_SPEC,
    architectures=dict(type="list", elements="str", default=["x86_64"]),
    cache_dir=dict(type="path", default="~/.cache/confidential-kubernetes/artifacts"),
    mirror_url=dict(type="str", default=""),
    source_dir=dict(type="path", default=""),
    timeout=dict(type="int", default=60),
)
# Refused by such an action before anything is fetched.
SOURCES_CONFLICT = "mirror_url and source_dir are alternatives; set one of them"


def row_of(params: dict) -> _versions.Row:
    """The checked row of ``kubernetes_version`` (the shipped table with the extra rows over it), refused when it is
    end of life and not allowed; VersionTableError otherwise."""
    try:
        today = datetime.date.fromisoformat(params["today"]) if params["today"] else datetime.date.today()
    except ValueError:
        raise _versions.VersionTableError(f"today is {params['today']!r}, not a date YYYY-MM-DD") from None
    shipped = _versions.load_table(params["versions_file"] or _versions.TABLE_FILE)
    table = _versions.merged_table(shipped, params["versions_extra"])
    version = str(params["kubernetes_version"]).lstrip("v")
    strict = frozenset(shipped) - frozenset(str(v) for v in params["versions_extra"])
    row = _versions.select_row(table, version, strict)
    _versions.refuse_end_of_life(row, today, params["allow_end_of_life"])
    return row


def source_url(artifact: Artifact, mirror_url: str | None) -> str:
    """Upstream's URL, or the same path under the mirror's base URL."""
    if not mirror_url:
        return artifact.url
    return mirror_url.rstrip("/") + urllib.parse.urlsplit(artifact.url).path


def cache_path(cache_dir: str, artifact: Artifact) -> str:
    # Content-addressed: two rows sharing an artefact share one file, and a changed checksum never hits a stale file.
    return os.path.join(cache_dir, artifact.sha256, artifact.filename)


Progress = Callable[[str], None]


def _stream_verified(
    source, target_dir: str, artifact: Artifact, origin: str, total: int | None, progress: Progress
) -> str:
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
                f"{digest.hexdigest()}; it was not cached and nothing was installed"
            )
        return tmp
    except BaseException:
        os.unlink(tmp)
        raise


def fetch(
    artifact: Artifact,
    cache_dir: str,
    mirror_url: str | None = None,
    source_dir: str | None = None,
    timeout: float = 60.0,
    progress: Progress = lambda line: None,
) -> tuple[str, bool]:
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
    recorded = read_record(record)
    try:
        found = file_digest(path, recorded if recorded is not None and recorded.sha256 == artifact.sha256 else None)
    except OSError as exc:
        raise ArtifactError(f"cannot read the cached {artifact.label} at {path}: {exc}") from exc
    if found.sha256 != artifact.sha256:
        return False
    if found != recorded:
        write_record(record, found)
    return True


def write_record(record: str, found: FileDigest) -> None:
    """Record a verified file's digest and fingerprint, when it has settled, for the next run's fast path."""
    if found.fingerprint is None:
        return
    try:
        # Written whole or not at all, so that a concurrent run reads either record; both name a verified file.
        write_file_atomically(record, f"{found.sha256} {found.mode:04o} {found.fingerprint}\n".encode("ascii"), 0o644)
    except OSError:
        pass  # a cache this controller cannot write to is still verified, by hashing, on every run


def read_record(record: str) -> FileDigest | None:
    """The digest a ``.verified`` record holds; None when there is none, or it is not one."""
    try:
        with open(record, encoding="ascii") as handle:
            match = VERIFIED_RECORD.match(handle.read(256))
    except (OSError, UnicodeDecodeError):
        return None
    if match is None:
        return None
    return FileDigest(match.group(1), int(match.group(2), 8), Fingerprint.parse(match.group(3)))


def _fetch_to_temporary(
    artifact: Artifact,
    directory: str,
    mirror_url: str | None,
    source_dir: str | None,
    timeout: float,
    progress: Progress,
) -> str:
    if source_dir:
        origin = os.path.join(source_dir, urllib.parse.urlsplit(artifact.url).path.lstrip("/"))
        progress(f"{artifact.label}: copying {origin}")
        try:
            with open(origin, "rb") as source:
                return _stream_verified(
                    source, directory, artifact, origin, os.fstat(source.fileno()).st_size, progress
                )
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
