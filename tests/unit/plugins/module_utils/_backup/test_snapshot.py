# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The encrypted snapshot format: a known-answer vector rebuilt by hand, and one refusal per way a file can be bad."""

from __future__ import annotations

import hashlib
import io
import os
import struct

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ansible_collections.confidential.kubernetes.plugins.module_utils._backup import snapshot
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto import derive

MASTER_KEY = bytes(range(0x00, 0x20))
MASTER_SALT = bytes(range(0x20, 0x40))
CLUSTER = bytes.fromhex("128c164378fe8767f998fbdfe4b4d6463ec5ae1b664ea5999bc27417607ae9b6")
OTHER_CLUSTER = bytes(32)
CHUNK = snapshot.MIN_CHUNK_SIZE
RECORD = snapshot.NONCE_SIZE + CHUNK + snapshot.TAG_SIZE


def _hkdf_sha256(ikm: bytes, salt: bytes, info: bytes, length: int) -> bytes:
    import hmac

    prk = hmac.new(salt, ikm, hashlib.sha256).digest()
    okm, block, counter = b"", b"", 1
    while len(okm) < length:
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        okm += block
        counter += 1
    return okm[:length]


KEY = snapshot.backup_key(MASTER_KEY, MASTER_SALT)


def _encrypted(plaintext: bytes, key: bytes = KEY, cluster: bytes = CLUSTER, prefix: bytes | None = None) -> bytes:
    sink = io.BytesIO()
    snapshot.encrypt(key, cluster, io.BytesIO(plaintext), len(plaintext), sink, CHUNK, prefix)
    return sink.getvalue()


def _decrypted(data: bytes, key: bytes = KEY, cluster: bytes = CLUSTER) -> bytes:
    out = io.BytesIO()
    snapshot.decrypt(key, cluster, io.BytesIO(data), len(data), "snap", out.write)
    return out.getvalue()


PLAINTEXT = os.urandom(3 * CHUNK + 100)


def test_backup_key_is_the_design_derivation():
    assert KEY == _hkdf_sha256(MASTER_KEY, MASTER_SALT, b"key-etcdBackup", 32)
    assert KEY == derive.derive(MASTER_KEY, MASTER_SALT, "key-etcdBackup", 32)
    assert KEY.hex() == "b7af3ffc970e5734c56547cde458ba9ca8b555b234d16f5eff7bb8fe3111eaf2"


def test_known_answer_layout_rebuilt_by_hand():
    plaintext = b"etcd" * 300  # 1200 bytes: one full chunk and a final chunk of 176
    prefix = bytes.fromhex("a1a2a3a4a5a6a7")
    data = _encrypted(plaintext, prefix=prefix)
    header = b"CKSNAP\r\n" + struct.pack(">HIQ", 1, CHUNK, len(plaintext)) + CLUSTER + prefix
    aead = AESGCM(KEY)
    nonce0 = prefix + struct.pack(">IB", 0, 0)
    nonce1 = prefix + struct.pack(">IB", 1, 1)
    expected = (
        header
        + nonce0
        + aead.encrypt(nonce0, plaintext[:CHUNK], header)
        + nonce1
        + aead.encrypt(nonce1, plaintext[CHUNK:], header)
    )
    assert data == expected
    assert hashlib.sha256(data).hexdigest() == "77d5b670501fc82244592329a68c8ad9c89d01a4ff6953751a66ecc4d59e13f5"


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK])
def test_round_trip(size):
    plaintext = os.urandom(size)
    data = _encrypted(plaintext)
    assert len(data) == snapshot.Header(CHUNK, size, CLUSTER, b"\0" * 7).file_size
    assert _decrypted(data) == plaintext


def test_each_file_gets_a_fresh_nonce_prefix():
    assert _encrypted(PLAINTEXT)[: snapshot.HEADER_SIZE] != _encrypted(PLAINTEXT)[: snapshot.HEADER_SIZE]


def test_another_clusters_snapshot_is_refused_before_decrypting():
    other_key = snapshot.backup_key(bytes(32), bytes(32))
    data = _encrypted(PLAINTEXT, key=other_key, cluster=OTHER_CLUSTER)
    with pytest.raises(snapshot.WrongClusterError, match=f"cluster {OTHER_CLUSTER.hex()}, not of this cluster"):
        _decrypted(data)


def test_another_clusters_snapshot_claiming_this_cluster_fails_authentication():
    other_key = snapshot.backup_key(bytes(32), bytes(32))
    with pytest.raises(snapshot.AuthenticationError, match="chunk 0 of 4 fails authentication"):
        _decrypted(_encrypted(PLAINTEXT, key=other_key, cluster=CLUSTER))


@pytest.mark.parametrize("cut", [1, snapshot.NONCE_SIZE, RECORD, 2 * RECORD + 5])
def test_truncated_file_is_refused(cut):
    data = _encrypted(PLAINTEXT)
    with pytest.raises(snapshot.TruncatedError, match=f"truncated: {len(data) - cut} bytes"):
        _decrypted(data[:-cut])


def test_truncated_header_is_refused():
    with pytest.raises(snapshot.TruncatedError, match="shorter than the 61-byte header"):
        _decrypted(_encrypted(PLAINTEXT)[:30])


def test_truncated_with_forged_smaller_header_fails_authentication():
    data = bytearray(_encrypted(PLAINTEXT)[: snapshot.HEADER_SIZE + 2 * RECORD])
    struct.pack_into(">Q", data, 14, 2 * CHUNK)  # plaintext size: claim the file had two chunks
    with pytest.raises(snapshot.AuthenticationError, match="chunk 0 of 2"):
        _decrypted(bytes(data))


def test_trailing_bytes_are_refused():
    with pytest.raises(snapshot.TrailingDataError, match="3 bytes follow the final chunk"):
        _decrypted(_encrypted(PLAINTEXT) + b"abc")


def _records(data: bytes) -> tuple[bytes, list[bytes]]:
    body = data[snapshot.HEADER_SIZE :]
    return data[: snapshot.HEADER_SIZE], [body[i : i + RECORD] for i in range(0, len(body), RECORD)]


def test_reordered_chunks_are_refused():
    header, records = _records(_encrypted(PLAINTEXT))
    records[1], records[2] = records[2], records[1]
    with pytest.raises(snapshot.ReorderedChunkError, match="chunk 1 of 4 holds chunk 2: the chunks were reordered"):
        _decrypted(header + b"".join(records))


def test_chunk_swapped_in_from_another_snapshot_of_the_same_cluster_is_refused():
    header, records = _records(_encrypted(PLAINTEXT))
    dummy, other = _records(_encrypted(PLAINTEXT))
    records[2] = other[2]
    with pytest.raises(snapshot.ForeignChunkError, match="chunk 2 of 4 does not belong to this snapshot"):
        _decrypted(header + b"".join(records))


def test_altered_stored_nonce_is_refused_although_the_chunk_verifies():
    header, records = _records(_encrypted(PLAINTEXT))
    forged = bytearray(records[1])
    forged[snapshot.NONCE_SIZE - 1] = 1  # the final flag, on a chunk that is not the last
    records[1] = bytes(forged)
    with pytest.raises(snapshot.AuthenticationError, match="chunk 1 of 4: its stored nonce was altered"):
        _decrypted(header + b"".join(records))


def test_every_single_byte_flip_is_refused():
    """Flip one bit at every position of a small file: each is refused, none decrypts."""
    data = _encrypted(os.urandom(CHUNK + 10))
    for position in range(len(data)):
        altered = bytearray(data)
        altered[position] ^= 0x01
        with pytest.raises(snapshot.SnapshotError):
            _decrypted(bytes(altered))


@pytest.mark.parametrize(
    "offset, error, message",
    [
        (0, snapshot.SnapshotFormatError, "not an encrypted etcd snapshot"),
        (9, snapshot.SnapshotFormatError, "format version 0, this collection reads 1"),
        (30, snapshot.WrongClusterError, "not of this cluster"),
        (
            snapshot.HEADER_SIZE + snapshot.NONCE_SIZE + 7,
            snapshot.AuthenticationError,
            "chunk 0 of 4 fails authentication",
        ),
        (snapshot.HEADER_SIZE + 3 * RECORD + 20, snapshot.AuthenticationError, "chunk 3 of 4 fails authentication"),
    ],
)
def test_flipped_byte_names_what_it_broke(offset, error, message):
    altered = bytearray(_encrypted(PLAINTEXT))
    altered[offset] ^= 0x01
    with pytest.raises(error, match=message):
        _decrypted(bytes(altered))


def test_flipped_plaintext_size_fails_authentication():
    altered = bytearray(_encrypted(PLAINTEXT))
    altered[21] ^= 0x01  # low byte of the plaintext size: still within the file, so only the tag can tell
    altered += b"\0"
    with pytest.raises(snapshot.AuthenticationError):
        _decrypted(bytes(altered))


def test_decrypt_file_leaves_no_plaintext_when_refused(tmp_path):
    source = tmp_path / "snap.db"
    source.write_bytes(PLAINTEXT)
    encrypted = tmp_path / "snap.cksnap"
    info = snapshot.encrypt_file(KEY, CLUSTER, str(source), str(encrypted), CHUNK)
    assert (encrypted.stat().st_mode & 0o777) == 0o600
    assert info.ciphertext_size == encrypted.stat().st_size and info.chunks == 4
    assert snapshot.verify_file(KEY, CLUSTER, str(encrypted)).plaintext_size == len(PLAINTEXT)
    restored = tmp_path / "restored.db"
    snapshot.decrypt_file(KEY, CLUSTER, str(encrypted), str(restored))
    assert restored.read_bytes() == PLAINTEXT and (restored.stat().st_mode & 0o777) == 0o600
    altered = bytearray(encrypted.read_bytes())
    altered[-1] ^= 0x80
    encrypted.write_bytes(bytes(altered))
    with pytest.raises(snapshot.AuthenticationError, match="chunk 3 of 4"):
        snapshot.decrypt_file(KEY, CLUSTER, str(encrypted), str(tmp_path / "again.db"))
    assert not (tmp_path / "again.db").exists()


def test_encrypt_file_refuses_to_overwrite(tmp_path):
    (tmp_path / "snap.db").write_bytes(b"x")
    (tmp_path / "out").write_bytes(b"keep")
    with pytest.raises(FileExistsError):
        snapshot.encrypt_file(KEY, CLUSTER, str(tmp_path / "snap.db"), str(tmp_path / "out"), CHUNK)
    assert (tmp_path / "out").read_bytes() == b"keep"


PROVENANCE = snapshot.Provenance(time=1795683600, revision=40213, total_keys=812, etcd_hash=0xDEADBEEF, member="cp-0")


def _encrypted_v2(plaintext: bytes, key: bytes = KEY, salt: bytes | None = None, prefix: bytes | None = None) -> bytes:
    sink = io.BytesIO()
    snapshot.encrypt(
        key, CLUSTER, io.BytesIO(plaintext), len(plaintext), sink, CHUNK, prefix, provenance=PROVENANCE, key_salt=salt
    )
    return sink.getvalue()


def test_format2_known_answer_layout_rebuilt_by_hand():
    plaintext = b"etcd" * 300
    prefix, salt = bytes.fromhex("a1a2a3a4a5a6a7"), bytes(range(0x80, 0xA0))
    data = _encrypted_v2(plaintext, salt=salt, prefix=prefix)
    header = (
        b"CKSNAP\r\n"
        + struct.pack(">HIQ", 2, CHUNK, len(plaintext))
        + CLUSTER
        + prefix
        + salt
        + struct.pack(">QQQIH", 1795683600, 40213, 812, 0xDEADBEEF, 4)
        + b"cp-0"
    )
    file_key = _hkdf_sha256(KEY, salt, b"key-etcdBackupFile", 32)
    assert file_key == snapshot.file_key(KEY, salt) and file_key != KEY
    aead = AESGCM(file_key)
    nonce0, nonce1 = prefix + struct.pack(">IB", 0, 0), prefix + struct.pack(">IB", 1, 1)
    expected = (
        header
        + nonce0
        + aead.encrypt(nonce0, plaintext[:CHUNK], header)
        + nonce1
        + aead.encrypt(nonce1, plaintext[CHUNK:], header)
    )
    assert data == expected
    info = snapshot.decrypt(KEY, CLUSTER, io.BytesIO(data), len(data), "snap")
    assert info.version == 2 and info.provenance == PROVENANCE


def test_each_format2_file_has_its_own_key():
    first, second = _encrypted_v2(PLAINTEXT), _encrypted_v2(PLAINTEXT)
    salt = slice(snapshot.HEADER_SIZE, snapshot.HEADER_SIZE + snapshot.KEY_SALT_SIZE)
    assert first[salt] != second[salt]
    assert _decrypted(first) == _decrypted(second) == PLAINTEXT


@pytest.mark.parametrize(
    "offset, what",
    [
        (snapshot.HEADER_SIZE + 3, "key salt"),
        (snapshot.HEADER_SIZE + 32 + 7, "time"),
        (snapshot.HEADER_SIZE + 32 + 15, "revision"),
        (snapshot.HEADER_SIZE + 32 + 23, "total keys"),
        (snapshot.HEADER_SIZE + 32 + 27, "etcd hash"),
        (snapshot.HEADER_V2_FIXED_SIZE + 3, "member"),
    ],
)
def test_format2_header_fields_are_authenticated(offset, what):
    altered = bytearray(_encrypted_v2(PLAINTEXT))
    altered[offset] ^= 0x01
    with pytest.raises(snapshot.AuthenticationError, match="chunk 0 of 4 fails authentication"):
        snapshot.decrypt(KEY, CLUSTER, io.BytesIO(bytes(altered)), len(altered), "snap", header_only=True)


def test_every_single_bit_flip_of_a_format2_file_is_refused():
    data = _encrypted_v2(os.urandom(CHUNK + 10))
    for position in range(len(data)):
        altered = bytearray(data)
        altered[position] ^= 0x01
        with pytest.raises(snapshot.SnapshotError):
            _decrypted(bytes(altered))


def test_a_format1_file_still_decrypts_with_the_snapshot_key():
    data = _encrypted(PLAINTEXT)
    assert data[8:10] == b"\0\1" and _decrypted(data) == PLAINTEXT
    info = snapshot.decrypt(KEY, CLUSTER, io.BytesIO(data), len(data), "snap")
    assert info.version == 1 and info.provenance is None
