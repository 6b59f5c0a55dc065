"""A tiny real OCI image layout, built by the tests: one layer tar with one file, its config, manifest and index.json."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile


def _tar(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            info.mode = 0o644
            info.mtime = 0
            archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def _digest(content: bytes) -> str:
    return "sha256:" + hashlib.sha256(content).hexdigest()


def build_layout(reference: str, content: bytes = b"hello\n", architecture: str = "amd64") -> tuple[dict, str]:
    """The members of an OCI image-layout archive of one image, and the manifest digest index.json names."""
    layer = _tar({"hello.txt": content})
    config = json.dumps(
        {
            "architecture": architecture,
            "os": "linux",
            "config": {"Cmd": ["/hello"]},
            "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
        },
        sort_keys=True,
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": _digest(config),
                "size": len(config),
            },
            "layers": [
                {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": _digest(layer), "size": len(layer)}
            ],
        },
        sort_keys=True,
    ).encode()
    index = json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": _digest(manifest),
                    "size": len(manifest),
                    "annotations": {
                        "io.containerd.image.name": reference,
                        "org.opencontainers.image.ref.name": reference.rsplit(":", 1)[1],
                    },
                }
            ],
        },
        sort_keys=True,
    ).encode()
    members = {"oci-layout": b'{"imageLayoutVersion":"1.0.0"}', "index.json": index}
    for blob in (layer, config, manifest):
        members["blobs/sha256/" + _digest(blob).split(":")[1]] = blob
    return members, _digest(manifest)


def write_archive(path, members: dict[str, bytes]) -> None:
    path.write_bytes(_tar(members))


def write_entries(path, entries: list[tuple[str, bytes, bytes]], tar_format: int = tarfile.PAX_FORMAT) -> None:
    """An archive of (name, content, tar type) entries, in that order and spelled exactly so: the crafted archives."""
    with tarfile.open(path, mode="w", format=tar_format) as archive:
        for name, content, kind in entries:
            info = tarfile.TarInfo(name)
            info.type, info.size, info.mode, info.mtime = kind, len(content), 0o644, 0
            archive.addfile(info, io.BytesIO(content))


def crafted(genuine: dict, evil: dict, genuine_index_as: str, kind: bytes = tarfile.REGTYPE) -> list:
    """The finding's archive: the evil image's index.json first, then the genuine one as ``genuine_index_as`` (of tar
    type ``kind``), and the blobs of both images - every blob hashes to its name."""
    blobs = {name: blob for name, blob in {**evil, **genuine}.items() if name.startswith("blobs/")}
    return [
        ("oci-layout", genuine["oci-layout"], tarfile.REGTYPE),
        ("index.json", evil["index.json"], tarfile.REGTYPE),
        (genuine_index_as, genuine["index.json"], kind),
        *((name, blob, tarfile.REGTYPE) for name, blob in blobs.items()),
    ]
