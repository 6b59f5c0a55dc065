# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Container images pinned like the binaries: references, the lock file of digests recorded on first fetch, and where
an image's OCI archive lives in a source directory or a mirror.

A versions table row names each image by tag and, where upstream publishes one we can cite, by digest
(``registry/path:tag@sha256:...``). An image without a pinned digest gets one on its first verified fetch: the
controller records the digest its archive's index.json names in the lock file, and every later fetch and every node
must match it. ``oci.py`` verifies the archives; ``containerd.py`` imports them on the node.
"""

from __future__ import annotations

from dataclasses import dataclass

try:
    import yaml
except ImportError:  # the controller reads and writes the lock file; nodes never do
    pass

from ansible_collections.confidential.kubernetes.plugins.module_utils._files import write_file_atomically
from ansible_collections.confidential.kubernetes.plugins.module_utils._images.oci import DIGEST
from ansible_collections.confidential.kubernetes.plugins.module_utils._versions import IMAGE_REF

# registry/path:tag with an optional @sha256:digest, as the versions table writes them.
REFERENCE = IMAGE_REF
LOCK_KEY = "images"
LOCK_HEADER = (
    "# Digests of the container images this controller fetched first, by reference (confidential.kubernetes\n"
    "# container_images). Every later fetch and every node must match them; delete a line only to trust a new image.\n"
)
MAX_LOCK_BYTES = 1 << 20


class ImageLockError(ValueError):
    """An image does not match its pinned or locked digest, or the lock file is unreadable."""


@dataclass(frozen=True)
class Image:
    """One image of a row: its name in the row (``kube-apiserver``), reference by tag, and pinned digest if any."""

    name: str
    repository: str
    tag: str
    digest: str | None

    @property
    def reference(self) -> str:
        return f"{self.repository}:{self.tag}"

    @property
    def archive_path(self) -> str:
        """Where a source directory or mirror holds the image's OCI archive: ``images/<repository>/<tag>.oci.tar``."""
        return f"images/{self.repository}/{self.tag}.oci.tar"

    @property
    def filename(self) -> str:
        return f"{self.repository.replace('/', '_')}_{self.tag}.oci.tar"


def parse_image(name: str, value: str) -> Image:
    match = REFERENCE.match(str(value))
    if match is None:
        raise ValueError(f"image {name} is not registry/path:tag[@sha256:<digest>] ({value!r})")
    return Image(name, match.group("repository"), match.group("tag"), match.group("digest"))


def row_images(images: dict, names: tuple[str, ...]) -> list[Image]:
    """The images ``names`` of a row's ``images`` mapping, in that order, each with its pinned digest or None."""
    return [parse_image(name, images[name]) for name in names]


def read_lock(path: str) -> dict[str, str]:
    """The lock file's digests by reference; empty when there is no lock file yet."""
    try:
        with open(path, "rb") as handle:
            content = handle.read(MAX_LOCK_BYTES + 1)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ImageLockError(f"cannot read the image lock file {path}: {exc}") from exc
    if len(content) > MAX_LOCK_BYTES:
        raise ImageLockError(f"the image lock file {path} is larger than {MAX_LOCK_BYTES} bytes")
    try:
        document = yaml.safe_load(content) or {}
    except yaml.YAMLError as exc:
        raise ImageLockError(f"the image lock file {path} is not YAML: {exc}") from exc
    locked = document.get(LOCK_KEY) if isinstance(document, dict) else None
    if not isinstance(locked, dict) or not all(DIGEST.match(str(d)) for d in locked.values()):
        raise ImageLockError(f"the image lock file {path} is not a mapping {LOCK_KEY}: {{reference: sha256:<hex>}}")
    return {str(reference): str(digest) for reference, digest in locked.items()}


def write_lock(path: str, locked: dict[str, str]) -> None:
    """Replace the lock file whole (a concurrent reader sees the old one or the new one)."""
    body = yaml.safe_dump({LOCK_KEY: dict(sorted(locked.items()))}, default_flow_style=False, sort_keys=True)
    write_file_atomically(path, (LOCK_HEADER + body).encode("utf-8"), 0o644)


def expected_digest(image: Image, locked: dict[str, str]) -> str | None:
    """The digest the image must have: the table's, else the lock's; a table digest the lock contradicts fails."""
    recorded = locked.get(image.reference)
    if image.digest and recorded and image.digest != recorded:
        raise ImageLockError(
            f"{image.name} ({image.reference}): the versions table pins {image.digest} but the lock file records "
            f"{recorded}; nothing was installed"
        )
    return image.digest or recorded
