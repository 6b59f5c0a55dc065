from __future__ import annotations

import base64
import json
import os

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto import seal

NONCE = bytes(range(32))


@pytest.mark.parametrize("suite", [seal.MLKEM768_X25519, seal.X25519], ids=["ML-KEM-768+X25519", "X25519"])
def test_round_trip(suite):
    key = seal.EphemeralKey.generate(suite)
    envelope = seal.seal(b"master secret", key.public_bytes(), "init", NONCE, "controller")
    assert json.loads(envelope)["suite"] == suite.name
    assert key.open(envelope, "init", NONCE, "controller") == b"master secret"


def test_default_suite_is_post_quantum_hybrid():
    assert seal.EphemeralKey.generate().suite is seal.MLKEM768_X25519


def test_private_key_survives_serialisation():
    key = seal.EphemeralKey.generate()
    envelope = seal.seal(b"x", key.public_bytes(), "join", NONCE, "js")
    assert seal.EphemeralKey.from_private_bytes(key.private_bytes()).open(envelope, "join", NONCE, "js") == b"x"


def test_relay_that_swaps_in_its_own_key_cannot_open_the_reply():
    node = seal.EphemeralKey.generate()
    relay = seal.EphemeralKey.generate()
    # The verifier seals to the key bound into the genuine node's evidence.
    envelope = seal.seal(b"join ticket", node.public_bytes(), "join", NONCE, "joinservice")
    with pytest.raises(seal.SealError, match="does not open"):
        relay.open(envelope, "join", NONCE, "joinservice")


@pytest.mark.parametrize(
    "flow,nonce,verifier",
    [
        ("join", NONCE, "controller"),
        ("init", os.urandom(32), "controller"),
        ("init", NONCE, "someone-else"),
    ],
    ids=["wrong flow", "wrong nonce", "wrong verifier"],
)
def test_wrong_info_fails(flow, nonce, verifier):
    key = seal.EphemeralKey.generate()
    envelope = seal.seal(b"secret", key.public_bytes(), "init", NONCE, "controller")
    with pytest.raises(seal.SealError, match="does not open"):
        key.open(envelope, flow, nonce, verifier)


def test_downgraded_suite_is_refused():
    key = seal.EphemeralKey.generate(seal.MLKEM768_X25519)
    doc = json.loads(seal.seal(b"secret", key.public_bytes(), "init", NONCE, "c"))
    doc["suite"] = seal.X25519.name
    with pytest.raises(seal.SealError, match="downgrade refused"):
        key.open(json.dumps(doc).encode(), "init", NONCE, "c")


def test_tampered_ciphertext_fails():
    key = seal.EphemeralKey.generate()
    doc = json.loads(seal.seal(b"secret", key.public_bytes(), "init", NONCE, "c"))
    raw = bytearray(base64.b64decode(doc["ciphertext"]))
    raw[-1] ^= 1
    doc["ciphertext"] = base64.b64encode(bytes(raw)).decode()
    with pytest.raises(seal.SealError, match="does not open"):
        key.open(json.dumps(doc).encode(), "init", NONCE, "c")


@pytest.mark.parametrize(
    "envelope,message",
    [
        (b"not json", "not JSON"),
        (b"[]", "must be an object"),
        (b'{"version": 1, "suite": "ROT13", "ciphertext": ""}', "unknown suite"),
        (b'{"version": 1, "suite": "X25519/HKDF_SHA256/AES_256_GCM", "ciphertext": "%%%"}', "not valid base64"),
    ],
)
def test_malformed_envelope_is_a_clear_error(envelope, message):
    with pytest.raises(seal.SealError, match=message):
        seal.EphemeralKey.generate(seal.X25519).open(envelope, "init", NONCE, "c")


def test_public_key_of_unknown_length_is_refused():
    with pytest.raises(seal.SealError, match="matches no supported HPKE suite"):
        seal.seal(b"x", b"\x01" * 33, "init", NONCE, "c")


def test_unknown_flow_is_refused():
    key = seal.EphemeralKey.generate(seal.X25519)
    with pytest.raises(seal.SealError, match="unknown flow"):
        seal.seal(b"x", key.public_bytes(), "reinit", NONCE, "c")
