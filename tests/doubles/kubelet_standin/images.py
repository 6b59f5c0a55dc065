"""Container images the stand-in can "run": those naming a local binary of the tagged version."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from . import StandinError, bin_dir, binary_version

# The components kubeadm runs as static pods; kube-proxy, pause and coredns have no local binary.
COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd")


class ImageError(StandinError):
    """An image that is not present: unknown component, no local binary or another version."""


@dataclass(frozen=True)
class Image:
    reference: str
    component: str
    tag: str
    binary: Path
    version: str

    @property
    def image_id(self) -> str:
        """A stable id: the binary's path, size and version (the stand-in has no image layers to hash)."""
        size = self.binary.stat().st_size
        return "sha256:" + hashlib.sha256(f"{self.binary}:{size}:{self.version}".encode()).hexdigest()


def split_reference(reference: str) -> tuple[str, str]:
    """(component, tag) of [registry/]path/component:tag; digests are refused."""
    if "@" in reference:
        raise ImageError(f"image {reference!r}: digest references are not supported, use a tag")
    name, colon, tag = reference.rpartition(":")
    if not colon or "/" in tag or not name:
        raise ImageError(f"image {reference!r} has no tag")
    return name.rsplit("/", 1)[-1], tag


def resolve(reference: str, directory: Path | None = None) -> Image:
    """The local binary for an image, after checking that its version is the image's tag.

    kube-* binaries must match the tag exactly; etcd only in major.minor, because the nodes
    have Debian's etcd 3.4.23 where kubeadm 1.20 asks for etcd:3.4.13-0.
    """
    component, tag = split_reference(reference)
    if component not in COMPONENTS:
        raise ImageError(f"image {reference!r}: no local binary for {component!r} "
                         f"(the stand-in runs only {', '.join(COMPONENTS)})")
    binary = (directory or bin_dir()) / component
    if not binary.exists():
        raise ImageError(f"image {reference!r}: {binary} does not exist")
    version = binary_version(binary)
    if component == "etcd":
        matches = version.split(".")[:2] == tag.split("-")[0].split(".")[:2]
    else:
        matches = "v" + version == tag
    if not matches:
        raise ImageError(f"image {reference!r}: {binary} is version {version}")
    return Image(reference, component, tag, binary, version)
