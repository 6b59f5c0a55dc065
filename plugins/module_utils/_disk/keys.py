# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Disk keys: decoding and checking them, and the short-lived 0600 files cryptsetup reads them from."""

from __future__ import annotations

import base64
import binascii
import os
import stat
import tempfile
from contextlib import contextmanager
from typing import Iterator

from . import StateDiskError

DISK_KEY_LENGTH = 32
# tmpfs first: a key file must never reach a disk.
PRIVATE_TMP_DIRS = ("/dev/shm", "/run")


def decode_disk_key(value: str) -> bytes:
    """The raw disk key from the base64 text of the ``disk_key`` option."""
    try:
        key = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise StateDiskError("disk_key is not valid base64: pass the raw 32-byte disk key, base64-encoded") from None
    if len(key) != DISK_KEY_LENGTH:
        raise StateDiskError(
            f"disk_key decodes to {len(key)} bytes; the disk key is exactly {DISK_KEY_LENGTH} raw bytes, base64-encoded"
        )
    return key


def read_disk_key_file(path: str) -> bytes:
    """The raw disk key from a 0600 file that holds exactly its 32 bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise StateDiskError(f"cannot read disk_key_file {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise StateDiskError(f"disk_key_file {path} is not a regular file")
        if info.st_mode & 0o077:
            raise StateDiskError(
                f"disk_key_file {path} has mode {stat.S_IMODE(info.st_mode):04o}; "
                f"a disk key must be readable by its owner only: chmod 0600 {path}"
            )
        try:
            key = os.read(fd, DISK_KEY_LENGTH + 1)
        except OSError as exc:
            raise StateDiskError(f"cannot read disk_key_file {path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(key) != DISK_KEY_LENGTH:
        raise StateDiskError(
            f"disk_key_file {path} holds {len(key)}{'+' if len(key) > DISK_KEY_LENGTH else ''} bytes; "
            f"it must hold exactly the raw {DISK_KEY_LENGTH}-byte disk key (not hex, not base64)"
        )
    return key


def read_private_file(path: str) -> bytes | None:
    """The contents of a key file this package wrote, or None when there is none."""
    try:
        with open(path, "rb") as handle:
            return handle.read(DISK_KEY_LENGTH + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateDiskError(f"cannot read the initial key file {path}: {exc.strerror}") from None


def wipe_file(path: str) -> bool:
    """Overwrite a key file with zeros, then remove it. True when there was one."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return False
    try:
        size = os.fstat(fd).st_size
        os.write(fd, bytes(size))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.unlink(path)
    return True


def _private_tmp_root() -> str:
    for candidate in PRIVATE_TMP_DIRS:
        if os.path.isdir(candidate) and os.access(candidate, os.W_OK | os.X_OK):
            return candidate
    raise StateDiskError(
        f"none of {', '.join(PRIVATE_TMP_DIRS)} is a writable directory; "
        "a temporary disk key file must live on tmpfs, so run the module as root"
    )


@contextmanager
def private_key_file(secret: bytes) -> Iterator[str]:
    """A 0600 file holding ``secret`` in a fresh 0700 directory on tmpfs, zeroed and removed afterwards."""
    directory = tempfile.mkdtemp(prefix="ck-disk-key-", dir=_private_tmp_root())
    path = os.path.join(directory, "key")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, secret)
        finally:
            os.close(fd)
        yield path
    finally:
        wipe_file(path)
        os.rmdir(directory)
