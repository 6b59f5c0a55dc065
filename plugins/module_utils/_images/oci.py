# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""An OCI image-layout tar archive (image-spec ``image-layout.md``), verified in pure Python.

The archive's ``index.json`` names one image by the digest of its manifest (or of its image index, for an image of
several platforms). That digest is what the versions table pins or the lock file records; a verified archive is one
whose every blob hashes to its name, whose named manifest is present with its config and layers (for an index: the
manifest of each wanted architecture), and whose size stays within bounds. The controller verifies an archive before
it caches it, the node again before it imports it.

This module owns the archive rules, and what it verifies must be what containerd imports: the tar is read as
containerd's importer (``images/archive/importer.go``) reads it - member names cleaned like Go's ``path.Clean``,
regular files only, the last of a name winning - so every member the two could read differently is refused, naming
it: a name twice after cleaning, a non-canonical name (``./`` in front is the one other spelling allowed), an absolute
or escaping name, ``CONTTYPE``, sparse, link and device members, members outside the layout, a Docker archive's
``manifest.json``/``repositories`` (containerd reads the image from them when it reads no ``oci-layout``; Docker
archives are not supported), data after a damaged header (where Python's reader stops and Go's fails). index.json's
name annotations are covered by no digest: they must be the wanted reference or absent. The node imports not the
archive but :func:`write_canonical_archive`'s copy of its verified blobs with an index.json of its own.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile
from dataclasses import dataclass, field

# Bounds: an archive, and the JSON documents read whole into memory.
MAX_ARCHIVE_BYTES = 4 << 30
MAX_JSON_BYTES = 4 << 20
MAX_MEMBERS = 10000
CHUNK = 1 << 20
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
# Member names, cleaned (``clean_name``): the blobs, the layout's two documents, its directories; a Docker archive's
# documents are refused (containerd reads the image from manifest.json when no oci-layout is a regular file).
BLOB = re.compile(r"^blobs/sha256/([0-9a-f]{64})$")
LAYOUT_DOCUMENTS = ("index.json", "oci-layout")
DOCKER_DOCUMENTS = ("manifest.json", "repositories")
DIRECTORIES = (".", "blobs", "blobs/sha256")
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")
MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json")
# The annotations containerd and other tools name an image by in index.json.
NAME_ANNOTATIONS = ("io.containerd.image.name", "org.opencontainers.image.ref.name")


class ImageArchiveError(ValueError):
    """An archive is not a complete OCI image layout, or not the pinned image."""


@dataclass(frozen=True)
class ArchiveImage:
    """What a verified archive holds: the digest index.json names, its media type and the platforms present."""

    digest: str
    media_type: str
    architectures: tuple[str, ...]
    size: int = field(default=0, compare=False)


def verify_archive(
    path: str,
    label: str,
    expected_digest: str | None = None,
    architectures: tuple[str, ...] = (),
    reference: str | None = None,
) -> ArchiveImage:
    """Verify the archive at ``path`` (``label`` names the image in every error); return what it holds.

    ``expected_digest`` (pinned or locked) must be the digest index.json names; ``architectures`` (amd64, arm64)
    must each have their manifest in the archive; ``reference``, when given, is the only name index.json's image
    may carry (its annotations are covered by no digest).
    """
    return _read_archive(path, label, expected_digest, architectures, reference, None)


def write_canonical_archive(
    path: str,
    label: str,
    expected_digest: str,
    architectures: tuple[str, ...],
    reference: str,
    destination: str,
    image_name: str,
) -> ArchiveImage:
    """Verify the archive at ``path`` as :func:`verify_archive` does and, in the same pass, write to ``destination``
    (an open-for-writing path the caller removes) a canonical OCI archive of the verified blobs only: every blob as
    ``blobs/sha256/<hex>`` hashed again while it is copied, then an ``oci-layout`` and an ``index.json`` of this
    module's own naming the verified digest, annotated ``io.containerd.image.name: <image_name>``. What containerd
    imports from it is what was verified, whatever the source archive's headers say."""
    with open(destination, "wb") as handle, tarfile.open(fileobj=handle, mode="w", format=tarfile.USTAR_FORMAT) as sink:
        found = _read_archive(path, label, expected_digest, architectures, reference, sink)
        index = {
            "schemaVersion": 2,
            "mediaType": INDEX_TYPES[0],
            "manifests": [
                {
                    "mediaType": found.media_type,
                    "digest": found.digest,
                    "size": found.size,
                    "annotations": {NAME_ANNOTATIONS[0]: image_name},
                }
            ],
        }
        _add_member(sink, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        _add_member(sink, "index.json", json.dumps(index, sort_keys=True).encode("utf-8"))
        handle.flush()
        os.fsync(handle.fileno())
    return found


def _add_member(sink: tarfile.TarFile, name: str, content: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(content), 0o644, 0
    sink.addfile(info, io.BytesIO(content))


def _read_archive(
    path: str,
    label: str,
    expected: str | None,
    architectures: tuple[str, ...],
    reference: str | None,
    sink: tarfile.TarFile | None,
) -> ArchiveImage:
    try:
        with open(path, "rb") as handle, tarfile.open(fileobj=handle, mode="r:") as archive:
            blobs, documents, total = _read_members(archive, label, sink)
            _check_end(handle, archive, label)
            return _check_layout(blobs, documents, total, label, expected, architectures, reference)
    except ImageArchiveError:
        raise
    except (OSError, tarfile.TarError, ValueError) as exc:  # tarfile raises ValueError on some malformed headers
        raise ImageArchiveError(f"{label}: cannot read the image archive {path}: {exc}") from exc


def clean_name(name: str) -> str:
    """A tar member's name as containerd's importer sees it: Go's ``path.Clean`` (lexical; ``/`` stays rooted)."""
    rooted = name.startswith("/")
    parts: list[str] = []
    for part in name.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts and parts[-1] != "..":
                parts.pop()
            elif not rooted:
                parts.append("..")
            continue
        parts.append(part)
    cleaned = "/".join(parts)
    if rooted:
        return "/" + cleaned
    return cleaned or "."


def _member_kind(member: tarfile.TarInfo) -> str | None:
    """Why containerd would not read the member as the regular file this module reads, or None when it would."""
    if member.type == tarfile.CONTTYPE:
        return "a contiguous file (CONTTYPE), which containerd's importer skips while Python reads it as a file"
    if member.type == tarfile.GNUTYPE_SPARSE or member.sparse is not None or _sparse_pax(member):
        return "a sparse file"
    if member.issym() or member.islnk():
        return f"a {'symbolic' if member.issym() else 'hard'} link to {member.linkname}, not a regular file"
    if member.ischr() or member.isblk() or member.isfifo():
        return "a device or FIFO, not a regular file"
    if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
        return f"of tar type {member.type!r}, not a regular file"
    return None


def _sparse_pax(member: tarfile.TarInfo) -> bool:
    return any(key.startswith("GNU.sparse.") for key in member.pax_headers)


def _member_name(member: tarfile.TarInfo, label: str, seen: set[str]) -> str:
    """The member's cleaned name, refused unless containerd and this module read the same one and only once."""
    raw = member.name
    where = f"{label}: the image archive member {raw!r}"
    if raw.startswith("/"):
        raise ImageArchiveError(f"{where} has an absolute name (containerd reads it as another file than {raw[1:]})")
    cleaned = clean_name(raw)
    if cleaned == ".." or cleaned.startswith("../"):
        raise ImageArchiveError(f"{where} escapes the archive's root")
    if raw not in (cleaned, "./" + cleaned) and not (member.isdir() and raw in (".", "./")):
        raise ImageArchiveError(f"{where} has a non-canonical name (containerd reads it as {cleaned!r})")
    if cleaned in seen:
        raise ImageArchiveError(
            f"{where} is a second member named {cleaned!r} (containerd and this check could read different ones)"
        )
    seen.add(cleaned)
    return cleaned


def _read_members(archive: tarfile.TarFile, label: str, sink: tarfile.TarFile | None = None) -> tuple[dict, dict, int]:
    """Hash every blob against its name (copying it into ``sink`` as it is hashed); keep index.json, oci-layout and
    the small blobs (manifests, configs). Members are read as containerd's importer reads them: names cleaned like
    Go's ``path.Clean``, regular files only; anything the two could read differently is refused, naming the member."""
    blobs: dict[str, tuple[int, bytes | None]] = {}  # digest -> size, content when small enough for a document
    documents: dict[str, bytes] = {}
    seen: set[str] = set()
    total = 0
    for count, member in enumerate(archive, start=1):
        if count > MAX_MEMBERS:
            raise ImageArchiveError(f"{label}: the image archive has more than {MAX_MEMBERS} members")
        kind = None if member.isdir() else _member_kind(member)
        if kind is not None:
            raise ImageArchiveError(f"{label}: the image archive member {member.name!r} is {kind}")
        name = _member_name(member, label, seen)
        if member.isdir():
            if name not in DIRECTORIES:
                raise ImageArchiveError(f"{label}: the image archive has an unexpected directory {member.name!r}")
            continue
        total += member.size
        if total > MAX_ARCHIVE_BYTES:
            raise ImageArchiveError(f"{label}: the image archive is larger than {MAX_ARCHIVE_BYTES} bytes")
        if name in DOCKER_DOCUMENTS:
            raise ImageArchiveError(
                f"{label}: the image archive member {member.name!r} belongs to a Docker archive; only OCI image "
                "layouts are imported (containerd could read the image from it instead of index.json)"
            )
        if name in LAYOUT_DOCUMENTS:
            documents[name] = _read_small(archive, member, label)
            continue
        match = BLOB.match(name)
        if match is None:
            raise ImageArchiveError(f"{label}: the image archive has an unexpected member {member.name}")
        digest, kept = _copy_blob(archive, member, sink, match.group(1))
        if digest != match.group(1):
            raise ImageArchiveError(
                f"{label}: blob sha256:{match.group(1)} in the image archive hashes to sha256:{digest}; "
                "the archive is corrupt or tampered with"
            )
        blobs["sha256:" + match.group(1)] = (member.size, kept)
    return blobs, documents, total


class _HashingReader:
    """Reads a member's stream for ``tarfile.addfile``, hashing what passes and keeping it when it is small."""

    def __init__(self, stream, keep: bool):
        self.stream = stream
        self.digest = hashlib.sha256()
        self.kept = bytearray() if keep else None

    def read(self, size: int = -1) -> bytes:
        chunk = self.stream.read(size)
        self.digest.update(chunk)
        if self.kept is not None:
            self.kept += chunk
        return chunk


def _copy_blob(
    archive: tarfile.TarFile, member: tarfile.TarInfo, sink: tarfile.TarFile | None, hexdigest: str
) -> tuple[str, bytes | None]:
    reader = _HashingReader(archive.extractfile(member), member.size <= MAX_JSON_BYTES)
    if sink is None:
        for dummy in iter(lambda: reader.read(CHUNK), b""):
            pass
    else:
        info = tarfile.TarInfo("blobs/sha256/" + hexdigest)
        info.size, info.mode, info.mtime = member.size, 0o644, 0
        sink.addfile(info, reader)
    return reader.digest.hexdigest(), None if reader.kept is None else bytes(reader.kept)


def _check_end(handle, archive: tarfile.TarFile, label: str) -> None:
    """Nothing but zero blocks after the last member: Python's reader stops at a header it cannot parse where Go's
    fails, so a member hidden behind one is refused here."""
    handle.seek(archive.offset)
    for chunk in iter(lambda: handle.read(CHUNK), b""):
        if chunk.strip(b"\0"):
            raise ImageArchiveError(
                f"{label}: the image archive has data after its end at byte {archive.offset} (a damaged header?)"
            )


def _read_small(archive: tarfile.TarFile, member: tarfile.TarInfo, label: str) -> bytes:
    if member.size > MAX_JSON_BYTES:
        raise ImageArchiveError(f"{label}: {member.name} in the image archive is larger than {MAX_JSON_BYTES} bytes")
    return archive.extractfile(member).read()


def _json(content: bytes | None, what: str, label: str) -> dict:
    if content is None:
        raise ImageArchiveError(f"{label}: {what} is missing from the image archive or too large")
    try:
        document = json.loads(content)
    except ValueError as exc:
        raise ImageArchiveError(f"{label}: {what} in the image archive is not JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise ImageArchiveError(f"{label}: {what} in the image archive is not a JSON object")
    return document


def _descriptor(value, what: str, label: str) -> tuple[str, str, int]:
    if not isinstance(value, dict) or not DIGEST.match(str(value.get("digest", ""))):
        raise ImageArchiveError(f"{label}: {what} is not a descriptor with a sha256 digest")
    size = value.get("size")
    if not isinstance(size, int) or size < 0:
        raise ImageArchiveError(f"{label}: {what} has no size")
    return value["digest"], str(value.get("mediaType", "")), size


def _check_layout(
    blobs: dict,
    documents: dict,
    total: int,
    label: str,
    expected: str | None,
    architectures: tuple[str, ...],
    reference: str | None = None,
) -> ArchiveImage:
    layout = _json(documents.get("oci-layout"), "oci-layout", label)
    if layout.get("imageLayoutVersion") != "1.0.0":
        raise ImageArchiveError(f"{label}: oci-layout is not imageLayoutVersion 1.0.0")
    index = _json(documents.get("index.json"), "index.json", label)
    manifests = index.get("manifests")
    if not isinstance(manifests, list) or len(manifests) != 1:
        raise ImageArchiveError(f"{label}: index.json must name exactly one image, it names {manifests!r:.200}")
    digest, media_type, dummy = _descriptor(manifests[0], "index.json's image", label)
    if expected is not None and digest != expected:
        raise ImageArchiveError(f"{label}: the image archive holds {digest}, but {expected} is pinned")
    if reference is not None:
        _check_names(manifests[0], reference, label)
    size = blobs[digest][0] if digest in blobs else 0
    top = _present(blobs, digest, "the image's manifest", label)
    if media_type in INDEX_TYPES or (not media_type and "manifests" in top):
        found = []
        for number, entry in enumerate(top.get("manifests") or []):
            child, dummy, dummy = _descriptor(entry, f"manifest {number} of the image index", label)
            arch = str((entry.get("platform") or {}).get("architecture", ""))
            if child in blobs:
                _check_manifest(blobs, _present(blobs, child, f"the {arch} manifest", label), arch, label)
                found.append(arch)
        missing = [arch for arch in architectures if arch not in found]
        if missing or not found:
            raise ImageArchiveError(
                f"{label}: the image archive has no manifest for {', '.join(missing) or 'any platform'}"
            )
        return ArchiveImage(digest, media_type or INDEX_TYPES[0], tuple(found), size)
    if media_type and media_type not in MANIFEST_TYPES:
        raise ImageArchiveError(f"{label}: index.json's image has the unknown media type {media_type}")
    arch = _check_manifest(blobs, top, "", label)
    if architectures and any(wanted != arch for wanted in architectures):
        raise ImageArchiveError(
            f"{label}: the image archive holds an image for {arch}, not for {', '.join(architectures)}"
        )
    return ArchiveImage(digest, media_type or MANIFEST_TYPES[0], (arch,), size)


def _check_names(descriptor: dict, reference: str, label: str) -> None:
    """The names index.json gives its image are covered by no digest: each must be the wanted reference (its tag, for
    the OCI ref name) or absent, else a genuine archive of one image could name another's reference."""
    annotations = descriptor.get("annotations") or {}
    if not isinstance(annotations, dict):
        raise ImageArchiveError(f"{label}: index.json's image annotations are not a mapping")
    allowed = {NAME_ANNOTATIONS[0]: (reference,), NAME_ANNOTATIONS[1]: (reference, reference.rsplit(":", 1)[-1])}
    for key, values in allowed.items():
        if key in annotations and annotations[key] not in values:
            raise ImageArchiveError(
                f"{label}: index.json names its image {annotations[key]!r} ({key}), not {reference}; "
                "an archive may name only the image it is fetched as"
            )


def _present(blobs: dict, digest: str, what: str, label: str) -> dict:
    if digest not in blobs:
        raise ImageArchiveError(f"{label}: {what} {digest} is missing from the image archive")
    return _json(blobs[digest][1], f"{what} {digest}", label)


def _check_manifest(blobs: dict, manifest: dict, arch: str, label: str) -> str:
    """The config and every layer of one manifest are present; returns the config's architecture."""
    config_digest, dummy, dummy = _descriptor(manifest.get("config"), "the manifest's config", label)
    config = _present(blobs, config_digest, "the image config", label)
    layers = manifest.get("layers")
    if not isinstance(layers, list) or not layers:
        raise ImageArchiveError(f"{label}: the {arch or 'image'} manifest has no layers")
    for number, layer in enumerate(layers):
        layer_digest, dummy, dummy = _descriptor(layer, f"layer {number}", label)
        if layer_digest not in blobs:
            raise ImageArchiveError(f"{label}: layer {layer_digest} is missing from the image archive")
    return str(config.get("architecture", ""))
