# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Files: written one way, atomic, with their mode from the first byte (secret files 0600); and their SHA-256."""

from __future__ import annotations

import hashlib
import os
import tempfile

_CHUNK = 1 << 20


def write_file_atomically(path: str, data: bytes, mode: int) -> None:
    """Atomically write ``data`` to ``path`` with ``mode`` (directory 0700 if created); no partial file is ever seen."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_private_file(path: str, data: bytes) -> None:
    """Atomically write ``data`` to ``path`` with mode 0600 (directory 0700 if created)."""
    write_file_atomically(path, data, 0o600)


def file_sha256(path: str) -> str:
    """The hex SHA-256 of a file's content (OSError when it cannot be read)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()
