# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Files: written one way, atomic and durable (file and directory fsynced), with their mode from the first byte (secret
files 0600), replaced or created exclusively; read bounded; and their SHA-256, which a caller that recorded a file's
fingerprint beside its digest need not compute again while the fingerprint holds."""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
import time
from dataclasses import dataclass

_CHUNK = 1 << 20
# A file changed less than this before its fingerprint is taken could change again within the same timestamp tick
# (a second on some filesystems) without moving its ctime, so such a fingerprint is not handed out to be trusted.
SETTLED_NS = 1_000_000_000


class FileTooLargeError(ValueError):
    """A file holds more than a reader takes; the message names the file and the limit."""

    def __init__(self, path: str, limit: int):
        super().__init__(f"{path} is larger than {limit} bytes")
        self.path = path
        self.limit = limit


def write_file_atomically(path: str, data: bytes, mode: int) -> None:
    """Atomically replace ``path`` with ``data`` and ``mode`` (directory 0700 if created): readers see the old file or
    the new one, never a partial one, and both the file and its directory entry are on disk when this returns."""
    directory = _make_directory(path)
    tmp = _write_aside(directory, data, mode)
    try:
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    _fsync_directory(directory)


def write_private_file(path: str, data: bytes) -> None:
    """Atomically write ``data`` to ``path`` with mode 0600 (directory 0700 if created)."""
    write_file_atomically(path, data, 0o600)


def create_file_exclusively(path: str, data: bytes, mode: int = 0o600) -> None:
    """Create ``path`` complete with ``data`` and ``mode`` (directory 0700 if created), or not at all: FileExistsError
    when it exists, which is never replaced. Written aside and hard-linked into place, so no reader (and no crash)
    ever sees it half written; file and directory entry are on disk when this returns."""
    directory = _make_directory(path)
    tmp = _write_aside(directory, data, mode)
    try:
        os.link(tmp, path)
    finally:
        os.unlink(tmp)
    _fsync_directory(directory)


def backup_copy(path: str) -> str:
    """A copy of ``path`` beside it with its mode, named as Ansible names a backup (``<path>.<pid>.<time>~``), created
    exclusively and durably; returns its path. No process is started (Ansible's own backup runs lsattr and chattr, and
    fails the task when a fork of theirs does)."""
    with open(path, "rb") as handle:
        data = handle.read()
        mode = stat.S_IMODE(os.fstat(handle.fileno()).st_mode)
    backup = f"{path}.{os.getpid()}.{time.strftime('%Y-%m-%d@%H:%M:%S')}~"
    create_file_exclusively(backup, data, mode)
    return backup


def read_bounded(path: str, limit: int) -> bytes:
    """The content of ``path``, at most ``limit`` bytes (FileTooLargeError naming the file when it holds more)."""
    with open(path, "rb") as handle:
        return read_bounded_from(handle, path, limit)


def read_bounded_from(handle, path: str, limit: int) -> bytes:
    """The rest of the open file ``handle`` (opened from ``path``), at most ``limit`` bytes, else FileTooLargeError.
    Reads up to the limit instead of trusting the file's size, which pseudo-files (securityfs) report as 0."""
    data = handle.read(limit + 1)
    if len(data) > limit:
        raise FileTooLargeError(path, limit)
    return data


def _make_directory(path: str) -> str:
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o700, exist_ok=True)
    return directory


def _write_aside(directory: str, data: bytes, mode: int) -> str:
    """A new temporary file in ``directory`` with ``mode`` and ``data``, fsynced; its path."""
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_sha256(path: str) -> str:
    """The hex SHA-256 of a regular file's content (OSError when it is none, or cannot be read)."""
    return file_digest(path).sha256


@dataclass(frozen=True)
class Fingerprint:
    """What the kernel says about a file's inode. Any write, truncate, chmod or chown moves its ctime, which user
    space cannot set back (unlike mtime), and a file put in its place is another inode: while a file's fingerprint
    is the one taken when it was hashed, its content is the content hashed then."""

    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, status: os.stat_result) -> Fingerprint:
        return cls(status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns)

    @classmethod
    def parse(cls, text: str) -> Fingerprint | None:
        """The fingerprint ``str()`` wrote (four decimal numbers); None for anything else."""
        fields = text.split()
        if len(fields) != 4 or not all(field.isdigit() for field in fields):
            return None
        return cls(*(int(field) for field in fields))

    def __str__(self) -> str:
        return f"{self.inode} {self.size} {self.mtime_ns} {self.ctime_ns}"


@dataclass(frozen=True)
class FileDigest:
    """A regular file's SHA-256 and mode, and the fingerprint it had when hashed - None when it changed too recently,
    or while it was read, for the fingerprint to vouch for the digest later."""

    sha256: str
    mode: int
    fingerprint: Fingerprint | None


def file_digest(path: str, recorded: FileDigest | None = None) -> FileDigest:
    """The digest of the regular file at ``path``. When ``recorded`` carries the file's current fingerprint, its sha256
    is taken without reading the file; otherwise the file is hashed. OSError when ``path`` is no readable regular file.

    Trusts the filesystem's ctime: what changes a file's content without moving it (writing to the block device,
    media corruption, setting the clock back) is found only by hashing, so callers keep the recorded fingerprint
    where only those who may change the file can write."""
    # Non-blocking, so that a FIFO put in a file's place fails the regular-file check instead of hanging the open.
    with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as handle:
        status = os.fstat(handle.fileno())
        if not stat.S_ISREG(status.st_mode):
            raise OSError(f"{path} is not a regular file")
        fingerprint = Fingerprint.of(status)
        if recorded is not None and recorded.fingerprint == fingerprint:
            return FileDigest(recorded.sha256, stat.S_IMODE(status.st_mode), fingerprint)
        settled = fingerprint.ctime_ns <= time.time_ns() - SETTLED_NS
        digest = hashlib.sha256()
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
        unchanged = Fingerprint.of(os.fstat(handle.fileno())) == fingerprint
    return FileDigest(digest.hexdigest(), stat.S_IMODE(status.st_mode), fingerprint if settled and unchanged else None)


def wait_until_settled(paths: list[str]) -> None:
    """Wait until the newest of ``paths`` (by ctime) changed at least ``SETTLED_NS`` ago, and at most that long."""
    newest = 0
    for path in paths:
        try:
            newest = max(newest, os.stat(path).st_ctime_ns)
        except OSError:
            continue
    remaining = min(newest + SETTLED_NS - time.time_ns(), SETTLED_NS)
    if remaining > 0:
        time.sleep(remaining / 1e9)
