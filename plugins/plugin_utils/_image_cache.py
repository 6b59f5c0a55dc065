# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's verified cache of container images, as OCI image-layout archives, beside the binaries' cache.

An image's archive comes from a local directory or a mirror (``images/<repository>/<tag>.oci.tar`` under either), is
streamed into a temporary file in the cache, verified (``module_utils/_images/oci.py``) against the digest the
versions table pins or the lock file records, and renamed to ``<cache>/images/<digest hex>/<file name>``. An image
with neither gets its digest recorded in the lock file on this first verified fetch. A cached archive is trusted
while it has the fingerprint recorded beside it when it was verified (the binaries' ``.verified`` records), and
verified again otherwise.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import urllib.error
from dataclasses import dataclass

from ansible.module_utils.urls import ConnectionError as UrlsConnectionError
from ansible.module_utils.urls import open_url

from ansible_collections.confidential.kubernetes.plugins.module_utils._files import file_digest
from ansible_collections.confidential.kubernetes.plugins.module_utils._images import (
    Image,
    ImageLockError,
    expected_digest,
    read_lock,
    write_lock,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._images.oci import (
    MAX_ARCHIVE_BYTES,
    ImageArchiveError,
    verify_archive,
)
from ansible_collections.confidential.kubernetes.plugins.plugin_utils._artifacts import (
    CHUNK,
    VERIFIED_SUFFIX,
    Progress,
    read_record,
    write_record,
)

LOCK_FILE = "images.lock.yml"


class ImageCacheError(RuntimeError):
    """An image cannot be fetched, or is not the pinned or locked image."""


@dataclass(frozen=True)
class CachedImage:
    image: Image
    digest: str
    path: str


def cache_path(cache_dir: str, image: Image, digest: str) -> str:
    # Content-addressed by the manifest digest: a changed pin never hits a stale archive.
    return os.path.join(cache_dir, "images", digest.split(":", 1)[1], image.filename)


def fetch_images(
    images: list[Image],
    cache_dir: str,
    lock_file: str,
    architectures: tuple[str, ...],
    mirror_url: str | None = None,
    source_dir: str | None = None,
    timeout: float = 60.0,
    progress: Progress = lambda line: None,
) -> tuple[list[CachedImage], list[str], list[str]]:
    """Every image verified in the cache: (cached images, labels fetched, references newly locked).

    Every image is verified before the lock file records any digest, so a failed run locks nothing.
    """
    try:
        locked = read_lock(lock_file)
    except ImageLockError as exc:
        raise ImageCacheError(str(exc)) from exc
    cached: list[CachedImage] = []
    fetched: list[str] = []
    newly_locked: dict[str, str] = {}
    for image in images:
        try:
            # An image fetched earlier in this run under another name (the same reference) is not fetched again.
            expected = expected_digest(image, {**locked, **newly_locked})
        except ImageLockError as exc:
            raise ImageCacheError(str(exc)) from exc
        label = f"{image.name} ({image.reference})"
        if expected is not None:
            path = cache_path(cache_dir, image, expected)
            if os.path.exists(path) and _cached_archive_verifies(path, label, expected, architectures, image):
                cached.append(CachedImage(image, expected, path))
                continue
        tmp = _fetch_to_temporary(image, label, cache_dir, mirror_url, source_dir, timeout, progress)
        try:
            try:
                found = verify_archive(tmp, label, expected, architectures, image.reference)
            except ImageArchiveError as exc:
                pinned_by = (
                    "pinned by the versions table"
                    if image.digest
                    else (f"locked in {lock_file}" if expected else "a first fetch: nothing was locked")
                )
                raise ImageCacheError(
                    f"{exc} ({pinned_by}); from {_origin(image, mirror_url, source_dir)}, it was not cached and "
                    "nothing was installed"
                ) from exc
            path = cache_path(cache_dir, image, found.digest)
            os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        write_record(path + VERIFIED_SUFFIX, file_digest(path))
        if expected is None:
            newly_locked[image.reference] = found.digest
        cached.append(CachedImage(image, found.digest, path))
        fetched.append(label)
    if newly_locked:
        try:
            write_lock(lock_file, {**locked, **newly_locked})
        except OSError as exc:
            raise ImageCacheError(f"cannot write the image lock file {lock_file}: {exc}") from exc
    return cached, fetched, sorted(newly_locked)


def cached_images(images: list[Image], cache_dir: str, lock_file: str) -> tuple[list[CachedImage], list[str]]:
    """Check mode: the images already in the cache under their pinned or locked digest (not verified again), and the
    labels of those a run would fetch."""
    try:
        locked = read_lock(lock_file)
        expected = [expected_digest(image, locked) for image in images]
    except ImageLockError as exc:
        raise ImageCacheError(str(exc)) from exc
    cached, missing = [], []
    for image, digest in zip(images, expected):
        if digest is not None and os.path.exists(cache_path(cache_dir, image, digest)):
            cached.append(CachedImage(image, digest, cache_path(cache_dir, image, digest)))
        else:
            missing.append(f"{image.name} ({image.reference})")
    return cached, missing


def _cached_archive_verifies(path: str, label: str, digest: str, architectures: tuple[str, ...], image: Image) -> bool:
    """Trusted while its recorded fingerprint holds; otherwise verified whole again (and a bad one removed)."""
    record = path + VERIFIED_SUFFIX
    recorded = read_record(record)
    try:
        found = file_digest(path, recorded)
        if recorded is not None and found.sha256 == recorded.sha256:
            return True
        verify_archive(path, label, digest, architectures, image.reference)
    except (OSError, ImageArchiveError):
        for stale in (path, record):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)
        return False
    write_record(record, found)
    return True


def _origin(image: Image, mirror_url: str | None, source_dir: str | None) -> str:
    if source_dir:
        return os.path.join(source_dir, image.archive_path)
    return f"{mirror_url.rstrip('/')}/{image.archive_path}"


def _fetch_to_temporary(
    image: Image,
    label: str,
    cache_dir: str,
    mirror_url: str | None,
    source_dir: str | None,
    timeout: float,
    progress: Progress,
) -> str:
    if not source_dir and not mirror_url:
        raise ImageCacheError(
            f"{label} is not in the image cache and there is no source to fetch it from: set a local directory "
            "(source_dir; role: kubernetes_images_dir) or a mirror (mirror_url; role: kubernetes_images_mirror_url) "
            f"serving {image.archive_path}, an OCI image-layout archive. Pulling from a registry is not supported."
        )
    origin = _origin(image, mirror_url, source_dir)
    directory = os.path.join(cache_dir, "images")
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{image.filename}.", dir=directory)
    progress(f"{label}: {'copying' if source_dir else 'downloading'} {origin}")
    try:
        with os.fdopen(fd, "wb") as sink:
            if source_dir:
                with open(origin, "rb") as source:
                    _copy_bounded(source, sink, label)
            else:
                with open_url(origin, timeout=timeout) as response:
                    _copy_bounded(response, sink, label)
    except (urllib.error.URLError, UrlsConnectionError, OSError, ValueError) as exc:
        os.unlink(tmp)
        raise ImageCacheError(f"cannot fetch {label} from {origin}: {exc}") from exc
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def _copy_bounded(source, sink, label: str) -> None:
    done = 0
    for chunk in iter(lambda: source.read(CHUNK), b""):
        done += len(chunk)
        if done > MAX_ARCHIVE_BYTES:
            raise ImageCacheError(f"{label}: the image archive is larger than {MAX_ARCHIVE_BYTES} bytes")
        sink.write(chunk)
