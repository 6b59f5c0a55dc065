"""Credential wrapping: the sealed ticket under a key only credential activation yields."""

from __future__ import annotations

import hashlib
import hmac
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.confidential.kubernetes.plugins.module_utils._join import credential
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.credential import CredentialWrapError, unwrap, wrap

SECRET = bytes(range(32))
NONCE = bytes(range(32, 64))


def _rfc5869(ikm: bytes, salt: bytes, info: bytes, length: int) -> bytes:
    """HKDF-SHA256 written out from RFC 5869, independent of the code under test."""
    prk = hmac.new(salt, ikm, hashlib.sha256).digest()
    okm, block = b"", b""
    for counter in range(1, -(-length // 32) + 1):
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        okm += block
    return okm[:length]


def test_wrap_key_is_hkdf_sha256_of_the_secret_salted_with_the_nonce():
    assert credential.wrap_key(SECRET, NONCE) == _rfc5869(SECRET, NONCE, b"confidential.kubernetes/credential-wrap/v1", 32)


def test_layout_is_iv_then_aes_gcm_with_the_nonce_as_aad():
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    wrapped = wrap(b"envelope", SECRET, NONCE)
    assert len(wrapped) == 12 + len(b"envelope") + 16
    assert AESGCM(credential.wrap_key(SECRET, NONCE)).decrypt(wrapped[:12], wrapped[12:], NONCE) == b"envelope"


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=4096), st.binary(min_size=16, max_size=64))
def test_round_trip(envelope, secret):
    assert unwrap(wrap(envelope, secret, NONCE), secret, NONCE) == envelope


def test_every_wrap_uses_a_new_iv():
    assert wrap(b"x", SECRET, NONCE)[:12] != wrap(b"x", SECRET, NONCE)[:12]


@pytest.mark.parametrize("case", ["wrong secret", "wrong nonce", "flipped IV", "flipped ciphertext", "flipped tag", "truncated"])
def test_anything_but_the_genuine_secret_and_nonce_fails(case):
    wrapped = bytearray(wrap(b"sealed ticket envelope", SECRET, NONCE))
    secret, nonce = SECRET, NONCE
    if case == "wrong secret":
        secret = os.urandom(32)
    elif case == "wrong nonce":
        nonce = os.urandom(32)
    elif case == "flipped IV":
        wrapped[0] ^= 1
    elif case == "flipped ciphertext":
        wrapped[14] ^= 1
    elif case == "flipped tag":
        wrapped[-1] ^= 1
    else:
        wrapped = wrapped[:20]
    with pytest.raises(CredentialWrapError):
        unwrap(bytes(wrapped), secret, nonce)


def test_nonce_must_be_32_bytes():
    with pytest.raises(CredentialWrapError, match="32 bytes"):
        wrap(b"x", SECRET, b"short")
