# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The encrypted etcd snapshot file: a header, then AES-256-GCM chunks (a STREAM construction, see README.md).

Format 2 (written since the snapshot manifest was authenticated) carries in its header what the snapshot is - when
it was taken, the etcd revision, the member - and a random salt from which the file's own key is derived; the header
is the associated data of every chunk, so none of it can be changed without the key. Format 1 (no provenance, the
snapshot key itself) is still read, so that older snapshots restore.

Every refusal has its own exception type, so that a restore can say exactly what is wrong with a file: another
cluster's snapshot, a truncated one, reordered or swapped chunks, or altered bytes.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import BinaryIO, Callable

try:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
except ImportError:  # reported by the modules through missing_required_lib()
    pass

from .._crypto import derive

BACKUP_KEY_INFO = "key-etcdBackup"
FILE_KEY_INFO = "key-etcdBackupFile"
MAGIC = b"CKSNAP\r\n"
VERSION = 2
READABLE_VERSIONS = (1, 2)
_PREFIX = struct.Struct(">8sH")
# Format 1: magic, version, chunk size, plaintext size, cluster ID, file nonce prefix
_HEADER = struct.Struct(">8sHIQ32s7s")
HEADER_SIZE = _HEADER.size
# Format 2 adds: file key salt, time (Unix seconds), etcd revision, total keys, etcd hash, member name length; then
# the member name (UTF-8).
_PROVENANCE = struct.Struct(">32sQQQIH")
HEADER_V2_FIXED_SIZE = HEADER_SIZE + _PROVENANCE.size
NONCE_PREFIX_SIZE = 7
KEY_SALT_SIZE = 32
MAX_MEMBER_BYTES = 255
# Each chunk is stored as its nonce (prefix, index, final flag) followed by the ciphertext and the GCM tag.
_NONCE = struct.Struct(">7sIB")
NONCE_SIZE = _NONCE.size
TAG_SIZE = 16
DEFAULT_CHUNK_SIZE = 1 << 20
MIN_CHUNK_SIZE = 1 << 10
MAX_CHUNK_SIZE = 1 << 24
MAX_CHUNKS = 1 << 32


class SnapshotError(ValueError):
    """An encrypted snapshot is refused; the subclass says why, the message says where."""


class SnapshotFormatError(SnapshotError):
    """Not an encrypted snapshot of a version this code reads."""


class WrongClusterError(SnapshotError):
    """The snapshot belongs to another cluster."""


class TruncatedError(SnapshotError):
    """The file ends before its last chunk."""


class TrailingDataError(SnapshotError):
    """Bytes follow the final chunk."""


class ReorderedChunkError(SnapshotError):
    """A chunk of this file stands at another chunk's place."""


class ForeignChunkError(SnapshotError):
    """A chunk does not come from this file (swapped in from another snapshot)."""


class AuthenticationError(SnapshotError):
    """A chunk or the header was altered: the GCM tag does not verify."""


def backup_key(master_key: bytes, master_salt: bytes) -> bytes:
    """The etcd snapshot key (DESIGN section 2, row key-etcdBackup); format 2 encrypts with a per-file key from it."""
    return derive.derive(master_key, master_salt, BACKUP_KEY_INFO)


def file_key(snapshot_key: bytes, key_salt: bytes) -> bytes:
    """The key of one format-2 file: HKDF(snapshot key, the header's random salt, "key-etcdBackupFile")."""
    return derive.derive(snapshot_key, key_salt, FILE_KEY_INFO)


@dataclass(frozen=True)
class Provenance:
    """What a format-2 header says the snapshot is; authenticated with every chunk."""

    time: int
    revision: int
    total_keys: int
    etcd_hash: int
    member: str

    def check(self) -> None:
        if len(self.member.encode()) > MAX_MEMBER_BYTES:
            raise SnapshotFormatError(f"member name longer than {MAX_MEMBER_BYTES} bytes: {self.member[:64]!r}...")
        for name in ("time", "revision", "total_keys"):
            if not 0 <= getattr(self, name) < 1 << 64:
                raise SnapshotFormatError(f"{name} {getattr(self, name)} does not fit the header")
        if not 0 <= self.etcd_hash < 1 << 32:
            raise SnapshotFormatError(f"etcd hash {self.etcd_hash} does not fit the header")


@dataclass(frozen=True)
class Header:
    chunk_size: int
    plaintext_size: int
    cluster_id: bytes
    nonce_prefix: bytes
    # Format 2 only (None in a format-1 header).
    key_salt: bytes | None = None
    provenance: Provenance | None = None

    @property
    def version(self) -> int:
        return 1 if self.provenance is None else 2

    @property
    def size(self) -> int:
        if self.provenance is None:
            return HEADER_SIZE
        return HEADER_V2_FIXED_SIZE + len(self.provenance.member.encode())

    def pack(self) -> bytes:
        fixed = _HEADER.pack(
            MAGIC, self.version, self.chunk_size, self.plaintext_size, self.cluster_id, self.nonce_prefix
        )
        if self.provenance is None:
            return fixed
        member = self.provenance.member.encode()
        return (
            fixed
            + _PROVENANCE.pack(
                self.key_salt,
                self.provenance.time,
                self.provenance.revision,
                self.provenance.total_keys,
                self.provenance.etcd_hash,
                len(member),
            )
            + member
        )

    def aead_key(self, snapshot_key: bytes) -> bytes:
        """The key the chunks are sealed with: the file's own key (format 2) or the snapshot key (format 1)."""
        return snapshot_key if self.key_salt is None else file_key(snapshot_key, self.key_salt)

    @property
    def chunk_count(self) -> int:
        return max(1, -(-self.plaintext_size // self.chunk_size))

    @property
    def file_size(self) -> int:
        return self.size + self.chunk_count * (NONCE_SIZE + TAG_SIZE) + self.plaintext_size

    def chunk_length(self, index: int) -> int:
        """The plaintext length of chunk ``index``: full chunks, then the rest in the final one."""
        if index < self.chunk_count - 1:
            return self.chunk_size
        return self.plaintext_size - (self.chunk_count - 1) * self.chunk_size

    def nonce(self, index: int) -> bytes:
        return _NONCE.pack(self.nonce_prefix, index, 1 if index == self.chunk_count - 1 else 0)

    @classmethod
    def read(cls, source: BinaryIO, name: str) -> Header:
        """The header at the start of ``source`` (its fields are not authenticated until a chunk verifies)."""
        data = source.read(HEADER_SIZE)
        if len(data) < HEADER_SIZE:
            if MAGIC.startswith(data[: len(MAGIC)]):
                raise TruncatedError(
                    f"{name}: truncated: {len(data)} bytes, shorter than the {HEADER_SIZE}-byte header"
                )
            raise SnapshotFormatError(f"{name}: not an encrypted etcd snapshot (no {MAGIC!r} header)")
        magic, version, chunk_size, plaintext_size, cluster_id, prefix = _HEADER.unpack(data)
        if magic != MAGIC:
            raise SnapshotFormatError(f"{name}: not an encrypted etcd snapshot (no {MAGIC!r} header)")
        if version not in READABLE_VERSIONS:
            raise SnapshotFormatError(
                f"{name}: snapshot format version {version}, this collection reads "
                f"{', '.join(str(v) for v in READABLE_VERSIONS)}"
            )
        if not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE:
            raise SnapshotFormatError(f"{name}: chunk size {chunk_size} is outside {MIN_CHUNK_SIZE}..{MAX_CHUNK_SIZE}")
        salt, provenance = None, None
        if version == 2:
            fixed = source.read(_PROVENANCE.size)
            if len(fixed) < _PROVENANCE.size:
                raise TruncatedError(f"{name}: truncated in its format-2 header")
            salt, taken, revision, total_keys, etcd_hash, member_length = _PROVENANCE.unpack(fixed)
            if member_length > MAX_MEMBER_BYTES:
                raise SnapshotFormatError(f"{name}: member name of {member_length} bytes (at most {MAX_MEMBER_BYTES})")
            member = source.read(member_length)
            if len(member) < member_length:
                raise TruncatedError(f"{name}: truncated in its format-2 header")
            try:
                provenance = Provenance(taken, revision, total_keys, etcd_hash, member.decode())
            except UnicodeDecodeError:
                raise SnapshotFormatError(f"{name}: the member name is not UTF-8") from None
        header = cls(chunk_size, plaintext_size, cluster_id, prefix, salt, provenance)
        if header.chunk_count > MAX_CHUNKS:
            raise SnapshotFormatError(f"{name}: plaintext size {plaintext_size} needs more than {MAX_CHUNKS} chunks")
        return header


@dataclass(frozen=True)
class SnapshotInfo:
    """What a verified (or written) encrypted snapshot holds; nothing secret."""

    cluster_id: str
    plaintext_size: int
    ciphertext_size: int
    chunks: int
    version: int = VERSION
    provenance: Provenance | None = None


def encrypt(
    key: bytes,
    cluster_id: bytes,
    source: BinaryIO,
    plaintext_size: int,
    sink: BinaryIO,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    nonce_prefix: bytes | None = None,
    provenance: Provenance | None = None,
    key_salt: bytes | None = None,
) -> SnapshotInfo:
    """Encrypt ``plaintext_size`` bytes of ``source`` into ``sink``, one chunk in memory at a time.

    ``key`` is the snapshot key. With ``provenance`` the file is format 2 (what the collection writes): the header
    carries it and a random ``key_salt``, the chunks are sealed with the file's own key. Without it the file is
    format 1 (what the collection wrote before; tests build old snapshots with it). ``nonce_prefix`` and ``key_salt``
    are random unless a test pins them (known-answer vectors).
    """
    if len(cluster_id) != 32:
        raise SnapshotFormatError(f"cluster ID must be 32 bytes, got {len(cluster_id)}")
    if not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE:
        raise SnapshotFormatError(f"chunk size {chunk_size} is outside {MIN_CHUNK_SIZE}..{MAX_CHUNK_SIZE}")
    prefix = os.urandom(NONCE_PREFIX_SIZE) if nonce_prefix is None else nonce_prefix
    if len(prefix) != NONCE_PREFIX_SIZE:
        raise SnapshotFormatError(f"nonce prefix must be {NONCE_PREFIX_SIZE} bytes")
    salt = None
    if provenance is not None:
        provenance.check()
        salt = os.urandom(KEY_SALT_SIZE) if key_salt is None else key_salt
        if len(salt) != KEY_SALT_SIZE:
            raise SnapshotFormatError(f"key salt must be {KEY_SALT_SIZE} bytes")
    header = Header(chunk_size, plaintext_size, cluster_id, prefix, salt, provenance)
    if header.chunk_count > MAX_CHUNKS:
        raise SnapshotFormatError(f"plaintext size {plaintext_size} needs more than {MAX_CHUNKS} chunks")
    aad = header.pack()
    aead = AESGCM(header.aead_key(key))
    sink.write(aad)
    for index in range(header.chunk_count):
        length = header.chunk_length(index)
        chunk = source.read(length)
        if len(chunk) != length:
            raise SnapshotFormatError(
                f"the plaintext ended after {index * chunk_size + len(chunk)} of "
                f"{plaintext_size} bytes: it changed while being encrypted"
            )
        nonce = header.nonce(index)
        sink.write(nonce)
        sink.write(aead.encrypt(nonce, chunk, aad))
    if source.read(1):
        raise SnapshotFormatError(f"the plaintext grew beyond {plaintext_size} bytes while being encrypted")
    return SnapshotInfo(
        cluster_id.hex(), plaintext_size, header.file_size, header.chunk_count, header.version, provenance
    )


def read_header(source: BinaryIO, name: str) -> Header:
    return Header.read(source, name)


def decrypt(
    key: bytes,
    expected_cluster_id: bytes,
    source: BinaryIO,
    file_size: int,
    name: str,
    write: Callable[[bytes], object] | None = None,
    header_only: bool = False,
) -> SnapshotInfo:
    """Check and decrypt the snapshot in ``source`` (``file_size`` bytes), passing each verified chunk to ``write``.

    With ``write`` None it only verifies. The cluster ID and the file size are checked before any chunk is
    decrypted; a caller that writes plaintext must discard it when this raises. With ``header_only`` only the first
    chunk is checked, which authenticates the header (its associated data): enough to trust what the file says it is.
    """
    header = read_header(source, name)
    if header.cluster_id != expected_cluster_id:
        raise WrongClusterError(
            f"{name}: snapshot of cluster {header.cluster_id.hex()}, not of this cluster {expected_cluster_id.hex()}"
        )
    if file_size < header.file_size:
        raise TruncatedError(
            f"{name}: truncated: {file_size} bytes, the header announces {header.file_size} "
            f"({header.chunk_count} chunks)"
        )
    if file_size > header.file_size:
        raise TrailingDataError(
            f"{name}: {file_size - header.file_size} bytes follow the final chunk "
            f"(the header announces {header.file_size} bytes)"
        )
    aad = header.pack()
    aead = AESGCM(header.aead_key(key))
    for index in range(1 if header_only else header.chunk_count):
        record = source.read(NONCE_SIZE + header.chunk_length(index) + TAG_SIZE)
        if len(record) != NONCE_SIZE + header.chunk_length(index) + TAG_SIZE:
            raise TruncatedError(f"{name}: truncated in chunk {index} of {header.chunk_count}")
        nonce = header.nonce(index)
        try:
            plaintext = aead.decrypt(nonce, record[NONCE_SIZE:], aad)
        except InvalidTag:
            raise _chunk_refusal(header, index, record[:NONCE_SIZE], name) from None
        if record[:NONCE_SIZE] != nonce:
            raise AuthenticationError(f"{name}: chunk {index} of {header.chunk_count}: its stored nonce was altered")
        if write is not None:
            write(plaintext)
    return SnapshotInfo(
        header.cluster_id.hex(),
        header.plaintext_size,
        header.file_size,
        header.chunk_count,
        header.version,
        header.provenance,
    )


def _chunk_refusal(header: Header, index: int, stored_nonce: bytes, name: str) -> SnapshotError:
    """Why chunk ``index`` does not verify. The nonce stored beside a chunk is not trusted (decryption always uses the
    expected one, and a stored nonce must equal it); it only names the failure: a chunk of this file elsewhere, a
    chunk of another file, or altered bytes."""
    prefix, stored_index, dummy = _NONCE.unpack(stored_nonce)
    where = f"{name}: chunk {index} of {header.chunk_count}"
    if prefix != header.nonce_prefix:
        return ForeignChunkError(
            f"{where} does not belong to this snapshot (another file's nonce): "
            "a chunk was swapped in from another snapshot"
        )
    if stored_index != index:
        return ReorderedChunkError(f"{where} holds chunk {stored_index}: the chunks were reordered")
    return AuthenticationError(f"{where} fails authentication: the file was altered (or encrypted with another key)")


def encrypt_file(
    key: bytes,
    cluster_id: bytes,
    plaintext_path: str,
    ciphertext_path: str,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    provenance: Provenance | None = None,
) -> SnapshotInfo:
    """Encrypt a file into a new 0600 file (exclusive create; removed again on failure)."""
    fd = os.open(ciphertext_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with open(plaintext_path, "rb") as source, os.fdopen(fd, "wb") as sink:
            size = os.fstat(source.fileno()).st_size
            info = encrypt(key, cluster_id, source, size, sink, chunk_size, provenance=provenance)
            sink.flush()
            os.fsync(sink.fileno())
    except BaseException:
        os.unlink(ciphertext_path)
        raise
    return info


def verify_file(key: bytes, cluster_id: bytes, path: str, header_only: bool = False) -> SnapshotInfo:
    """Authenticate a whole file (or, with ``header_only``, its header and first chunk) without writing plaintext."""
    with open(path, "rb") as source:
        return decrypt(key, cluster_id, source, os.fstat(source.fileno()).st_size, path, header_only=header_only)


def decrypt_file(key: bytes, cluster_id: bytes, ciphertext_path: str, plaintext_path: str) -> SnapshotInfo:
    """Decrypt into a new 0600 file, which exists only once every chunk has verified."""
    fd = os.open(plaintext_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with open(ciphertext_path, "rb") as source, os.fdopen(fd, "wb") as sink:
            info = decrypt(key, cluster_id, source, os.fstat(source.fileno()).st_size, ciphertext_path, sink.write)
            sink.flush()
            os.fsync(sink.fileno())
    except BaseException:
        os.unlink(plaintext_path)
        raise
    return info
