"""The activation proof: HMAC-SHA256 under the activated credential secret over a label and the nonce."""

from __future__ import annotations

import hashlib
import hmac
import os

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._join.credential import (
    ProofError,
    activation_proof,
    proof_matches,
)

SECRET = bytes(range(32))
NONCE = bytes(range(32, 64))


def test_proof_is_hmac_sha256_of_label_and_nonce_under_the_secret():
    expected = hmac.new(SECRET, b"confidential.kubernetes/activation-proof/v1" + NONCE, hashlib.sha256).digest()
    assert activation_proof(SECRET, NONCE) == expected


@pytest.mark.parametrize("case", ["wrong secret", "wrong nonce", "flipped bit", "truncated", "empty"])
def test_only_the_genuine_secret_and_nonce_match(case):
    proof = bytearray(activation_proof(SECRET, NONCE))
    secret, nonce = SECRET, NONCE
    if case == "wrong secret":
        secret = os.urandom(32)
    elif case == "wrong nonce":
        nonce = os.urandom(32)
    elif case == "flipped bit":
        proof[7] ^= 1
    elif case == "truncated":
        proof = proof[:16]
    else:
        proof = bytearray()
    assert proof_matches(SECRET, NONCE, activation_proof(SECRET, NONCE))
    assert not proof_matches(secret, nonce, bytes(proof))


@pytest.mark.parametrize("secret, nonce, match", [(b"", NONCE, "empty"), (SECRET, b"short", "32 bytes")])
def test_unusable_inputs_are_refused(secret, nonce, match):
    with pytest.raises(ProofError, match=match):
        activation_proof(secret, nonce)
