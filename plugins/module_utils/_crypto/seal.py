# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""HPKE (RFC 9180) sealing of secrets to an attester's ephemeral key.

The attester's raw public key is the evidence's ``user_data``; its length says
which KEM it belongs to, so a sealer can never be talked into a weaker suite
than the one the attester asked for. The HPKE ``info`` binds the flow, the
verifier's nonce, the verifier's identity and the suite itself.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from dataclasses import dataclass

try:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives import hpke
    from cryptography.hazmat.primitives.asymmetric import mlkem, x25519
except ImportError as exc:  # reported by the modules through missing_required_lib()
    CRYPTOGRAPHY_IMPORT_ERROR: ImportError | None = exc
else:
    CRYPTOGRAPHY_IMPORT_ERROR = None

# The flows of the sealed hand-overs, bound into every envelope's HPKE info (the one place they are named).
INIT, JOIN, REJOIN, RECOVER = "init", "join", "rejoin", "recover"
FLOWS = (INIT, JOIN, REJOIN, RECOVER)
ENVELOPE_VERSION = 1
INFO_LABEL = b"confidential.kubernetes/seal/v1"

_MLKEM768_PUBLIC = 1184
_X25519_PUBLIC = 32
_MLKEM768_SEED = 64
_X25519_PRIVATE = 32


class SealError(ValueError):
    """Sealing or opening failed; the message names the reason."""


@dataclass(frozen=True)
class KemSuite:
    name: str
    kem: str
    public_length: int
    private_length: int

    @property
    def suite(self) -> hpke.Suite:
        return hpke.Suite(getattr(hpke.KEM, self.kem), hpke.KDF.HKDF_SHA256, hpke.AEAD.AES_256_GCM)


MLKEM768_X25519 = KemSuite(
    "MLKEM768_X25519/HKDF_SHA256/AES_256_GCM",
    "MLKEM768_X25519",
    _MLKEM768_PUBLIC + _X25519_PUBLIC,
    _MLKEM768_SEED + _X25519_PRIVATE,
)
X25519 = KemSuite("X25519/HKDF_SHA256/AES_256_GCM", "X25519", _X25519_PUBLIC, _X25519_PRIVATE)
SUITES = {s.name: s for s in (MLKEM768_X25519, X25519)}
DEFAULT_SUITE = MLKEM768_X25519


def suite_for_public_key(raw_public: bytes) -> KemSuite:
    for suite in SUITES.values():
        if len(raw_public) == suite.public_length:
            return suite
    raise SealError(f"ephemeral public key has {len(raw_public)} bytes, which matches no supported HPKE suite")


class EphemeralKey:
    """An attester's one-use key pair; ``public_bytes`` goes into the evidence."""

    def __init__(self, suite: KemSuite, private_raw: bytes):
        if len(private_raw) != suite.private_length:
            raise SealError(f"private key for {suite.name} must be {suite.private_length} bytes")
        self.suite = suite
        self._private_raw = private_raw
        if suite is MLKEM768_X25519:
            self._mlkem = mlkem.MLKEM768PrivateKey.from_seed_bytes(private_raw[:_MLKEM768_SEED])
            self._x25519 = x25519.X25519PrivateKey.from_private_bytes(private_raw[_MLKEM768_SEED:])
            self._private = hpke.MLKEM768X25519PrivateKey(self._mlkem, self._x25519)
        else:
            self._mlkem = None
            self._x25519 = x25519.X25519PrivateKey.from_private_bytes(private_raw)
            self._private = self._x25519

    @classmethod
    def generate(cls, suite: KemSuite = DEFAULT_SUITE) -> "EphemeralKey":
        if suite is MLKEM768_X25519:
            raw = (
                mlkem.MLKEM768PrivateKey.generate().private_bytes_raw()
                + x25519.X25519PrivateKey.generate().private_bytes_raw()
            )
        else:
            raw = x25519.X25519PrivateKey.generate().private_bytes_raw()
        return cls(suite, raw)

    @classmethod
    def from_private_bytes(cls, private_raw: bytes) -> "EphemeralKey":
        for suite in SUITES.values():
            if len(private_raw) == suite.private_length:
                return cls(suite, private_raw)
        raise SealError(f"ephemeral private key has {len(private_raw)} bytes, which matches no supported HPKE suite")

    def private_bytes(self) -> bytes:
        return self._private_raw

    def public_bytes(self) -> bytes:
        x_pub = self._x25519.public_key().public_bytes_raw()
        if self._mlkem is None:
            return x_pub
        return self._mlkem.public_key().public_bytes_raw() + x_pub

    def open(self, envelope: bytes, flow: str, nonce: bytes, verifier_id: str) -> bytes:
        version, suite_name, ciphertext = _parse_envelope(envelope)
        if suite_name != self.suite.name:
            raise SealError(
                f"sealed with suite {suite_name}, but this key only accepts {self.suite.name} (downgrade refused)"
            )
        try:
            return self.suite.suite.decrypt(
                ciphertext, self._private, info=binding_info(flow, nonce, verifier_id, self.suite)
            )
        except InvalidTag:
            raise SealError(
                "sealed secret does not open with this key and context (wrong key, flow, nonce or verifier)"
            ) from None


def _public_key_object(suite: KemSuite, raw_public: bytes):
    if suite is MLKEM768_X25519:
        return hpke.MLKEM768X25519PublicKey(
            mlkem.MLKEM768PublicKey.from_public_bytes(raw_public[:_MLKEM768_PUBLIC]),
            x25519.X25519PublicKey.from_public_bytes(raw_public[_MLKEM768_PUBLIC:]),
        )
    return x25519.X25519PublicKey.from_public_bytes(raw_public)


def binding_info(flow: str, nonce: bytes, verifier_id: str, suite: KemSuite) -> bytes:
    """HPKE info: length-prefixed label, flow, nonce, verifier identity and suite."""
    if flow not in FLOWS:
        raise SealError(f"unknown flow {flow!r}; expected one of {', '.join(FLOWS)}")
    if len(nonce) != 32:
        raise SealError(f"nonce must be 32 bytes, got {len(nonce)}")
    parts = (INFO_LABEL, flow.encode(), nonce, verifier_id.encode(), suite.name.encode())
    return b"".join(struct.pack(">H", len(p)) + p for p in parts)


def check_public_key(raw_public: bytes):
    """The suite and key object of an attester's public key; SealError for one that no supported suite can seal to."""
    suite = suite_for_public_key(raw_public)
    try:
        return suite, _public_key_object(suite, raw_public)
    except ValueError as exc:
        raise SealError(f"ephemeral public key is not a valid {suite.name} key: {exc}") from None


def seal(plaintext: bytes, recipient_public: bytes, flow: str, nonce: bytes, verifier_id: str) -> bytes:
    """Encrypt to the attester's key; returns a JSON envelope (bytes)."""
    suite, public_key = check_public_key(recipient_public)
    ciphertext = suite.suite.encrypt(plaintext, public_key, info=binding_info(flow, nonce, verifier_id, suite))
    return json.dumps(
        {
            "version": ENVELOPE_VERSION,
            "suite": suite.name,
            "ciphertext": base64.b64encode(ciphertext).decode(),
        },
        sort_keys=True,
    ).encode()


def _parse_envelope(envelope: bytes) -> tuple[int, str, bytes]:
    try:
        doc = json.loads(envelope)
    except (ValueError, UnicodeDecodeError):
        raise SealError("sealed envelope is not JSON") from None
    if not isinstance(doc, dict) or doc.get("version") != ENVELOPE_VERSION:
        raise SealError(f"sealed envelope must be an object with version {ENVELOPE_VERSION}")
    suite_name, ciphertext = doc.get("suite"), doc.get("ciphertext")
    if suite_name not in SUITES:
        raise SealError(f"sealed envelope names unknown suite {suite_name!r}")
    if not isinstance(ciphertext, str):
        raise SealError("sealed envelope has no ciphertext string")
    try:
        return ENVELOPE_VERSION, suite_name, base64.b64decode(ciphertext, validate=True)
    except (binascii.Error, ValueError):
        raise SealError("sealed envelope ciphertext is not valid base64") from None
