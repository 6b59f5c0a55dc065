# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Import verified OCI archives into containerd's ``k8s.io`` namespace, where the kubelet and kubeadm find them.

One ``ctr images ls`` tells which images are present by digest; only the missing ones are verified (``oci.py``) and
imported, named by the row's reference and tagged with their aliases, and each import is checked by listing again:
every name must name the pinned digest. ``ctr`` runs through one seam (``_run_command``), an argument list, never a shell.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass

from ansible_collections.confidential.kubernetes.plugins.module_utils._images.oci import (
    DIGEST,
    ImageArchiveError,
    verify_archive,
)

NAMESPACE = "k8s.io"

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
        return [
            image
            for image in wanted
            if any(present.get(name) != image.digest for name in (image.reference, *image.aliases))
        ]

    def import_missing(self, missing: list[WantedImage], architecture: str) -> None:
        """Verify every archive against its digest first - one bad archive imports nothing - then import each under
        its reference and check that the reference names the pinned digest."""
        for image in missing:
            try:
                verify_archive(image.archive, image.label, image.digest, (architecture,) if architecture else ())
            except ImageArchiveError as exc:
                raise ContainerdImageError(f"{exc}; no image was imported") from exc
        for image in missing:
            repository = image.reference.rsplit(":", 1)[0]
            self._ctr("images", "import", "--base-name", repository, image.archive)
            if image.aliases:
                self._ctr("images", "tag", "--force", image.reference, *image.aliases)
            present = self.present()
            for name in (image.reference, *image.aliases):
                found = present.get(name)
                if found != image.digest:
                    raise ContainerdImageError(
                        f"{image.label}: after the import containerd names {found or 'no image'} for {name}, "
                        f"not the pinned {image.digest} (the archive's index.json names another image?)"
                    )
