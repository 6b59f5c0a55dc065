# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The snapshot manifest, owned here once: what a kept snapshot directory ``etcd-<UTC time>/`` is (its name, time,
etcd revision, member, cluster ID, the file's size and SHA-256), its JSON codec (``manifest.json``), and the one
reading of a directory that trusts only what is authenticated.

The authority is the snapshot's own format-2 header (time, revision, member, cluster ID, under the cluster's key, see
README.md); ``manifest.json`` is its readable copy and must agree with it field by field. A directory is this
cluster's snapshot only when its header authenticates and its name is the authenticated time: a renamed or copied
snapshot, a planted directory and an edited manifest are each refused by name. Pruning and "latest" see only such
snapshots, so nothing planted is chosen or makes a genuine snapshot go.
"""

from __future__ import annotations

import calendar
import json
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass, fields

from .._files import file_sha256, read_bounded, write_file_atomically
from . import snapshot

SNAPSHOT_FILE = "etcd.cksnap"
MANIFEST_FILE = "manifest.json"
MANIFEST_VERSION = 2
TIME_FORMAT = "%Y%m%dT%H%M%SZ"
NAME = re.compile(r"etcd-(\d{8}T\d{6}Z)")
PARTIAL = re.compile(r"\.etcd-\d{8}T\d{6}Z\.part")
MANIFEST_LIMIT = 1 << 16


class ManifestError(ValueError):
    """A snapshot directory is not one backup wrote for this cluster, or its manifest was altered; says which."""


@dataclass(frozen=True)
class Manifest:
    """One kept snapshot. ``authenticated`` is False only for a format-1 snapshot (its header holds no provenance)."""

    name: str
    time: str
    revision: int
    member: str
    cluster_id: str
    size: int
    sha256: str
    snapshot_size: int
    total_keys: int
    etcd_hash: int
    format: int = snapshot.VERSION
    authenticated: bool = True

    def to_document(self) -> dict:
        document = asdict(self)
        del document["authenticated"]
        return dict(document, version=MANIFEST_VERSION)

    def to_json(self) -> bytes:
        return (json.dumps(self.to_document(), indent=2, sort_keys=True) + "\n").encode()

    @classmethod
    def from_document(cls, document: object, source: str) -> Manifest:
        """Parse ``manifest.json`` strictly (types, no missing field). Version 1 manifests describe format-1 files."""
        if not isinstance(document, dict) or document.get("version") not in (1, MANIFEST_VERSION):
            raise ManifestError(f"{source}: not a snapshot manifest of version 1 or {MANIFEST_VERSION}")
        values = dict(document)
        if values.pop("version") == 1:
            values.setdefault("format", 1)
            for optional in ("snapshot_size", "total_keys", "etcd_hash"):
                values.setdefault(optional, 0)
        wanted = {field.name: field.type for field in fields(cls) if field.name != "authenticated"}
        missing = [name for name in wanted if name not in values]
        if missing:
            raise ManifestError(f"{source} lacks {', '.join(missing)}")
        for name, kind in wanted.items():
            expected = int if kind == "int" else str
            if not isinstance(values[name], expected) or isinstance(values[name], bool):
                raise ManifestError(f"{source}: {name} must be {'an integer' if expected is int else 'a string'}")
        return cls(**{name: values[name] for name in wanted}, authenticated=values["format"] >= 2)


def stamp(seconds: float) -> str:
    return time.strftime(TIME_FORMAT, time.gmtime(seconds))


def name_for(seconds: float) -> str:
    """The directory name of a snapshot taken at ``seconds`` (UTC, to the second)."""
    return f"etcd-{stamp(seconds)}"


def check_name(name: str) -> int:
    """The time a snapshot name says, in Unix seconds; ManifestError unless ``name`` is exactly etcd-<time>."""
    match = NAME.fullmatch(name)
    if not match:
        raise ManifestError(f"snapshot name {name!r} is not etcd-<YYYYmmddTHHMMSSZ>")
    try:
        return calendar.timegm(time.strptime(match.group(1), TIME_FORMAT))
    except ValueError:
        raise ManifestError(f"snapshot name {name!r} is not a valid UTC time") from None


def provenance(name: str, revision: int, total_keys: int, etcd_hash: int, member: str) -> snapshot.Provenance:
    """What the header of the snapshot ``name`` will authenticate."""
    return snapshot.Provenance(check_name(name), revision, total_keys, etcd_hash, member)


def from_info(info: snapshot.SnapshotInfo, size: int, sha256: str) -> Manifest:
    """The manifest of a format-2 file, from its (authenticated) header."""
    origin = info.provenance
    if origin is None:
        raise ManifestError("a format-1 snapshot has no authenticated manifest")
    return Manifest(
        name=name_for(origin.time),
        time=stamp(origin.time),
        revision=origin.revision,
        member=origin.member,
        cluster_id=info.cluster_id,
        size=size,
        sha256=sha256,
        snapshot_size=info.plaintext_size,
        total_keys=origin.total_keys,
        etcd_hash=origin.etcd_hash,
        format=info.version,
    )


def write(directory: str, manifest: Manifest) -> None:
    write_file_atomically(os.path.join(directory, MANIFEST_FILE), manifest.to_json(), 0o600)


def load_document(directory: str) -> Manifest:
    """``manifest.json`` as written (not yet compared with the snapshot)."""
    path = os.path.join(directory, MANIFEST_FILE)
    try:
        document = json.loads(read_bounded(path, MANIFEST_LIMIT))
    except FileNotFoundError:
        raise ManifestError(f"{path} is missing: not a snapshot written by backup.yml") from None
    except ValueError:
        raise ManifestError(f"{path} is not JSON (or larger than {MANIFEST_LIMIT} bytes)") from None
    return Manifest.from_document(document, path)


def read(directory: str, key: bytes, cluster_id: bytes, whole_file: bool = True) -> Manifest:
    """The manifest of the snapshot in ``directory``, as far as it is authenticated.

    The name is the directory's (checked with fullmatch); the header must authenticate under this cluster's key, its
    time must be the name, and ``manifest.json`` must agree with it on every field. With ``whole_file`` every chunk
    and the file's SHA-256 are checked too (a restore); without, the header and first chunk only (pruning).
    A format-1 file authenticates its chunks but not its manifest: it comes back with ``authenticated`` False.
    Raises ManifestError or snapshot.SnapshotError (a subclass per fault); writes nothing.
    """
    name = os.path.basename(os.path.normpath(directory))
    check_name(name)
    written = load_document(directory)
    path = os.path.join(directory, SNAPSHOT_FILE)
    if not os.path.isfile(path):
        raise ManifestError(f"{path} is missing")
    if written.cluster_id != cluster_id.hex():
        raise snapshot.WrongClusterError(
            f"{path}: snapshot of cluster {written.cluster_id}, not of this cluster {cluster_id.hex()}"
        )
    info = snapshot.verify_file(key, cluster_id, path, header_only=not whole_file)
    size = os.path.getsize(path)
    digest = file_sha256(path) if whole_file else written.sha256
    if info.provenance is None:
        if written.format != 1 or written.name != name:
            raise ManifestError(f"{directory}: a format-1 snapshot whose manifest says format {written.format}")
        if whole_file and (size != written.size or digest != written.sha256):
            raise ManifestError(f"{path} authenticates but is not the file its manifest describes (size or sha256)")
        return Manifest(**{**asdict(written), "snapshot_size": info.plaintext_size, "authenticated": False})
    genuine = from_info(info, size, digest)
    if genuine.name != name:
        raise ManifestError(
            f"{directory}: the snapshot in it was taken at {genuine.time} (authenticated), so its directory is "
            f"{genuine.name}: it was renamed or copied, and is refused"
        )
    altered = [field.name for field in fields(Manifest) if getattr(written, field.name) != getattr(genuine, field.name)]
    if altered:
        raise ManifestError(
            f"{directory}/{MANIFEST_FILE} differs from the snapshot's authenticated header in "
            f"{', '.join(altered)}: it was altered, and is refused"
        )
    return genuine


@dataclass(frozen=True)
class Listing:
    """A snapshot directory's contents: this cluster's authenticated snapshots (oldest first), format-1 ones (their
    order is not authenticated) and everything else named like a snapshot, with why it is not one."""

    snapshots: list
    format1: list
    unauthenticated: dict

    @property
    def newest(self) -> Manifest | None:
        return self.snapshots[-1] if self.snapshots else None


def listing(directory: str, key: bytes, cluster_id: bytes) -> Listing:
    """Every ``etcd-<time>`` entry of ``directory``, each read with ``read`` (header and first chunk)."""
    snapshots, format1, unauthenticated = [], [], {}
    entries = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
    for entry in entries:
        if not NAME.fullmatch(entry):
            continue
        path = os.path.join(directory, entry)
        if os.path.islink(path) or not os.path.isdir(path):
            unauthenticated[entry] = "not a directory"
            continue
        try:
            found = read(path, key, cluster_id, whole_file=False)
        except (ManifestError, snapshot.SnapshotError, OSError) as exc:
            unauthenticated[entry] = str(exc)
            continue
        (snapshots if found.authenticated else format1).append(found)
    snapshots.sort(key=lambda found: (found.time, found.revision))
    return Listing(snapshots, format1, unauthenticated)


def prune(directory: str, keep: int, key: bytes, cluster_id: bytes, written: str) -> dict:
    """Remove all but the newest ``keep`` authenticated snapshots of this cluster, never ``written`` (the snapshot
    just taken, even if a clock stepped back). Nothing else is ever removed: a planted or altered directory is
    reported (``unauthenticated``), a format-1 snapshot left for the operator."""
    if keep < 1:
        raise ManifestError(f"keep must be at least 1, got {keep}")
    found = listing(directory, key, cluster_id)
    pruned = [old.name for old in found.snapshots[:-keep] if old.name != written]
    for name in pruned:
        shutil.rmtree(os.path.join(directory, name))
    return dict(
        pruned=pruned,
        kept=[genuine.name for genuine in found.snapshots if genuine.name not in pruned],
        format1=[old.name for old in found.format1],
        unauthenticated=found.unauthenticated,
    )
