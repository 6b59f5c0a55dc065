# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Import verified OCI archives into containerd's ``k8s.io`` namespace, where the kubelet and kubeadm find them.

One ``ctr images ls`` tells which images are present by digest; only the missing ones are verified (``oci.py``) and
imported - from a canonical archive written from the verified blobs, under a staging name whose digest is checked
before the image's names (its reference, its aliases, each also by digest) move to it - and each import is checked by
listing again: every name must name the pinned digest, and one that does not is removed. ``ctr`` runs through one seam
(``_run_command``), an argument list, never a shell.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

from ansible_collections.confidential.kubernetes.plugins.module_utils._images.oci import (
    DIGEST,
    ImageArchiveError,
    verify_archive,
    write_canonical_archive,
)

NAMESPACE = "k8s.io"
# The name an image is imported under before its own names move to it (``.invalid``: no registry serves it).
STAGING_REPOSITORY = "import.confidential-kubernetes.invalid/staging"

Runner = Callable[[list], tuple]  # argv -> (rc, stdout, stderr)


class ContainerdImageError(RuntimeError):
    """containerd cannot be asked, or an image does not import as the pinned digest."""


@dataclass(frozen=True)
class WantedImage:
    """An image the node needs: its reference (``registry.k8s.io/pause:3.10``), digest and the archive pushed, and
    the other names it must also have (a site registry's, ``registry.example.com/k8s/pause:3.10``, where kubeadm and
    containerd look for it when an image repository is set)."""

    name: str
    reference: str
    digest: str
    archive: str
    aliases: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.name} ({self.reference})"

    @property
    def names(self) -> tuple[str, ...]:
        """Every name the image gets: its reference and aliases, and each by digest (``repository@sha256:...``), the
        name containerd's CRI looks up for an image referenced by digest (the sandbox image pinned by digest)."""
        tagged = (self.reference, *self.aliases)
        return (*tagged, *(_repository(name) + "@" + self.digest for name in tagged))


def _repository(reference: str) -> str:
    """``registry:5000/path:tag`` without its tag."""
    head, sep, tail = reference.rpartition(":")
    return head if sep and "/" not in tail else reference


def wanted_images(entries: list[dict]) -> list[WantedImage]:
    images = []
    for entry in entries:
        missing = [key for key in ("name", "reference", "digest", "archive") if not entry.get(key)]
        if missing:
            raise ContainerdImageError(f"an image entry lacks {', '.join(missing)}: {entry!r}")
        if not DIGEST.match(str(entry["digest"])):
            raise ContainerdImageError(f"{entry['name']}: digest {entry['digest']!r} is not sha256:<64 hex digits>")
        aliases = entry.get("aliases") or []
        if not isinstance(aliases, list) or not all(isinstance(alias, str) and ":" in alias for alias in aliases):
            raise ContainerdImageError(f"{entry['name']}: aliases {aliases!r} is not a list of registry/path:tag")
        images.append(
            WantedImage(
                str(entry["name"]), str(entry["reference"]), str(entry["digest"]), entry["archive"], tuple(aliases)
            )
        )
    return images


class ContainerdImages:
    def __init__(self, ctr: str, address: str, run_command: Runner, namespace: str = NAMESPACE):
        self.ctr = ctr
        self.address = address
        self.namespace = namespace
        self._run_command = run_command

    def _ctr(self, *arguments: str) -> str:
        argv = [self.ctr, "--address", self.address, "--namespace", self.namespace, *arguments]
        rc, stdout, stderr = self._run_command(argv)
        if rc != 0:
            raise ContainerdImageError(f"{' '.join(argv)} failed ({rc}): {(stderr or stdout).strip()}")
        return stdout

    def present(self) -> dict[str, str]:
        """The namespace's images: {reference: digest}, in one call."""
        try:
            is_socket = stat.S_ISSOCK(os.stat(self.address).st_mode)
        except OSError:
            is_socket = False
        if not is_socket:
            raise ContainerdImageError(
                f"containerd is not running: no socket at {self.address} (start containerd before importing images)"
            )
        images = {}
        for line in self._ctr("images", "ls").splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 3 and DIGEST.match(fields[2]):
                images[fields[0]] = fields[2]
        return images

    def missing(self, wanted: list[WantedImage]) -> list[WantedImage]:
        present = self.present()
        return [image for image in wanted if any(present.get(name) != image.digest for name in image.names)]

    def import_missing(self, missing: list[WantedImage], architecture: str) -> None:
        """Verify every archive against its digest and reference first - one bad archive imports nothing - then import
        each from a canonical archive written from its verified blobs, and check that every name names the pinned
        digest."""
        architectures = (architecture,) if architecture else ()
        for image in missing:
            try:
                verify_archive(image.archive, image.label, image.digest, architectures, image.reference)
            except ImageArchiveError as exc:
                raise ContainerdImageError(f"{exc}; no image was imported") from exc
        for image in missing:
            self._import(image, architectures)

    def _import(self, image: WantedImage, architectures: tuple[str, ...]) -> None:
        """Import under a staging name first: the image's names move only once containerd names the pinned digest
        for it, so a failed import leaves them where they were; names that end up anywhere else are removed."""
        staging = f"{STAGING_REPOSITORY}:{image.digest.split(':')[1]}"
        handle, canonical = tempfile.mkstemp(
            prefix=".canonical-", suffix=".oci.tar", dir=os.path.dirname(os.path.abspath(image.archive))
        )
        os.close(handle)
        try:
            try:
                write_canonical_archive(
                    image.archive, image.label, image.digest, architectures, image.reference, canonical, staging
                )
            except ImageArchiveError as exc:
                raise ContainerdImageError(f"{exc}; {image.reference} was left as it was") from exc
            self._ctr("images", "import", canonical)
        finally:
            os.unlink(canonical)
        try:
            staged = self.present().get(staging)
            if staged != image.digest:
                raise ContainerdImageError(
                    f"{image.label}: containerd imported {staged or 'no image'} from the verified archive, not the "
                    f"pinned {image.digest}; {image.reference} was left as it was"
                )
            self._ctr("images", "tag", "--force", staging, *image.names)
        finally:
            self._remove(staging)
        present = self.present()
        wrong = [name for name in image.names if present.get(name) != image.digest]
        if wrong:
            for name in wrong:
                self._remove(name)
            raise ContainerdImageError(
                f"{image.label}: after the import containerd names "
                + ", ".join(f"{present.get(name) or 'no image'} for {name}" for name in wrong)
                + f", not the pinned {image.digest}; those names were removed"
            )

    def _remove(self, name: str) -> None:
        """Remove a name if containerd has it (the image's content stays until containerd's garbage collection)."""
        if name in self.present():
            self._ctr("images", "rm", name)
