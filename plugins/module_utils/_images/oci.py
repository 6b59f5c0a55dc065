# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""An OCI image-layout tar archive (image-spec ``image-layout.md``), verified in pure Python.

The archive's ``index.json`` names one image by the digest of its manifest (or of its image index, for an image of
several platforms). That digest is what the versions table pins or the lock file records; a verified archive is one
whose every blob hashes to its name, whose named manifest is present with its config and layers (for an index: the
manifest of each wanted architecture), and whose size stays within bounds. The controller verifies an archive before
it caches it, the node again before it imports it.
"""

from __future__ import annotations

import hashlib
import json
import re
import tarfile
from dataclasses import dataclass

# Bounds: an archive, and the JSON documents read whole into memory.
MAX_ARCHIVE_BYTES = 4 << 30
MAX_JSON_BYTES = 4 << 20
MAX_MEMBERS = 10000
CHUNK = 1 << 20
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
BLOB = re.compile(r"^(?:\./)?blobs/sha256/([0-9a-f]{64})$")
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


def verify_archive(
    path: str, label: str, expected_digest: str | None = None, architectures: tuple[str, ...] = ()
) -> ArchiveImage:
    """Verify the archive at ``path`` (``label`` names the image in every error); return what it holds.

    ``expected_digest`` (pinned or locked) must be the digest index.json names; ``architectures`` (amd64, arm64)
    must each have their manifest in the archive.
    """
    try:
        with tarfile.open(path, mode="r:") as archive:
            blobs, documents, total = _read_members(archive, label)
            return _check_layout(blobs, documents, total, label, expected_digest, architectures)
    except (OSError, tarfile.TarError) as exc:
        raise ImageArchiveError(f"{label}: cannot read the image archive {path}: {exc}") from exc


def _read_members(archive: tarfile.TarFile, label: str) -> tuple[dict, dict, int]:
    """Hash every blob against its name; keep index.json, oci-layout and the small blobs (manifests, configs)."""
    blobs: dict[str, bytes | None] = {}  # digest -> content when small enough to be a manifest or config
    documents: dict[str, bytes] = {}
    total = 0
    for count, member in enumerate(archive, start=1):
        if count > MAX_MEMBERS:
            raise ImageArchiveError(f"{label}: the image archive has more than {MAX_MEMBERS} members")
        if member.isdir():
            continue
        if not member.isfile():
            raise ImageArchiveError(f"{label}: the image archive member {member.name} is not a regular file")
        total += member.size
        if total > MAX_ARCHIVE_BYTES:
            raise ImageArchiveError(f"{label}: the image archive is larger than {MAX_ARCHIVE_BYTES} bytes")
        name = member.name
        match = BLOB.match(name)
        if match is None:
            if name.lstrip("./") in ("index.json", "oci-layout", "manifest.json", "repositories"):
                documents[name.lstrip("./")] = _read_small(archive, member, label)
                continue
            raise ImageArchiveError(f"{label}: the image archive has an unexpected member {name}")
        stream = archive.extractfile(member)
        digest = hashlib.sha256()
        kept = bytearray() if member.size <= MAX_JSON_BYTES else None
        for chunk in iter(lambda: stream.read(CHUNK), b""):
            digest.update(chunk)
            if kept is not None:
                kept += chunk
        if digest.hexdigest() != match.group(1):
            raise ImageArchiveError(
                f"{label}: blob sha256:{match.group(1)} in the image archive hashes to sha256:{digest.hexdigest()}; "
                "the archive is corrupt or tampered with"
            )
        blobs["sha256:" + match.group(1)] = None if kept is None else bytes(kept)
    return blobs, documents, total


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
    blobs: dict, documents: dict, total: int, label: str, expected: str | None, architectures: tuple[str, ...]
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
        return ArchiveImage(digest, media_type or INDEX_TYPES[0], tuple(found))
    if media_type and media_type not in MANIFEST_TYPES:
        raise ImageArchiveError(f"{label}: index.json's image has the unknown media type {media_type}")
    arch = _check_manifest(blobs, top, "", label)
    if architectures and any(wanted != arch for wanted in architectures):
        raise ImageArchiveError(
            f"{label}: the image archive holds an image for {arch}, not for {', '.join(architectures)}"
        )
    return ArchiveImage(digest, media_type or MANIFEST_TYPES[0], (arch,))


def _present(blobs: dict, digest: str, what: str, label: str) -> dict:
    if digest not in blobs:
        raise ImageArchiveError(f"{label}: {what} {digest} is missing from the image archive")
    return _json(blobs[digest], f"{what} {digest}", label)


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
