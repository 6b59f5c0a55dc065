# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""TPM 2.0 wire structures in pure Python (TPM 2.0 Library, Part 2).

Only what a verifier needs: TPMT_PUBLIC, TPMS_ATTEST (quote), TPMT_SIGNATURE,
object names, KDFa and a software TPM2_MakeCredential. No TSS library needed.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import NamedTuple

try:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
    from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    # TPM credential protection is AES-CFB, which cryptography files under 'decrepit'.
    from cryptography.hazmat.decrepit.ciphers.modes import CFB
except ImportError:  # reported by the modules through missing_required_lib()
    pass

TPM_GENERATED_VALUE = 0xFF544347
TPM_ST_ATTEST_QUOTE = 0x8018

ALG_RSA = 0x0001
ALG_SHA1 = 0x0004
ALG_SHA256 = 0x000B
ALG_SHA384 = 0x000C
ALG_SHA512 = 0x000D
ALG_NULL = 0x0010
ALG_RSASSA = 0x0014
ALG_RSAPSS = 0x0016
ALG_ECDSA = 0x0018
ALG_ECC = 0x0023
ALG_AES = 0x0006
ALG_CFB = 0x0043

ECC_NIST_P256 = 0x0003
ECC_NIST_P384 = 0x0004

ATTR_FIXED_TPM = 0x00000002
ATTR_FIXED_PARENT = 0x00000010
ATTR_SENSITIVE_DATA_ORIGIN = 0x00000020
ATTR_USER_WITH_AUTH = 0x00000040
ATTR_ADMIN_WITH_POLICY = 0x00000080
ATTR_NO_DA = 0x00000400
ATTR_RESTRICTED = 0x00010000
ATTR_DECRYPT = 0x00020000
ATTR_SIGN = 0x00040000

HASHES = {ALG_SHA1: "sha1", ALG_SHA256: "sha256", ALG_SHA384: "sha384", ALG_SHA512: "sha512"}
# hashlib's constructors by TPM algorithm: faster than hashlib.new(name) on the verifier's hot path.
_HASHLIB = {ALG_SHA1: hashlib.sha1, ALG_SHA256: hashlib.sha256, ALG_SHA384: hashlib.sha384, ALG_SHA512: hashlib.sha512}
HASH_IDS = {name: alg for alg, name in HASHES.items()}
_CURVES = {ECC_NIST_P256: "SECP256R1", ECC_NIST_P384: "SECP384R1"}


@lru_cache(maxsize=None)
def _hash(alg: int):
    """The cryptography hash of a TPM hash algorithm; made once, as they are immutable and verification is hot."""
    return getattr(hashes, HASHES[alg].upper())()


@lru_cache(maxsize=None)
def _ecdsa(alg: int):
    """ECDSA with the hash of a TPM hash algorithm, made once."""
    return ec.ECDSA(_hash(alg))


def _curve(curve_id: int):
    return getattr(ec, _CURVES[curve_id])()


class StructureError(ValueError):
    """A TPM structure is truncated, has trailing bytes or an unsupported algorithm."""


_U16, _U32 = struct.Struct(">H"), struct.Struct(">I")
# TPMS_ATTEST up to qualifiedSigner's size; clockInfo and firmwareVersion; one TPMS_PCR_SELECTION's hash and size.
_ATTEST_HEAD = struct.Struct(">IHH")
_CLOCK_AND_FIRMWARE = struct.Struct(">QIIBQ")
_SELECTION_HEAD = struct.Struct(">HB")
_SIGNATURE_HEAD = struct.Struct(">HH")


class _Reader:
    def __init__(self, data: bytes, what: str):
        self.data = data
        self.pos = 0
        self.what = what

    def _unpack(self, fmt: struct.Struct) -> int:
        try:
            value = fmt.unpack_from(self.data, self.pos)[0]
        except struct.error:
            raise StructureError(f"{self.what} is truncated at byte {self.pos}") from None
        self.pos += fmt.size
        return value

    def u16(self) -> int:
        return self._unpack(_U16)

    def u32(self) -> int:
        return self._unpack(_U32)

    def tpm2b(self) -> bytes:
        size = self._unpack(_U16)
        end = self.pos + size
        if end > len(self.data):
            raise StructureError(f"{self.what} is truncated at byte {self.pos}")
        value = self.data[self.pos : end]
        self.pos = end
        return value

    def done(self) -> None:
        if self.pos != len(self.data):
            raise StructureError(f"{self.what} has {len(self.data) - self.pos} trailing bytes")


@dataclass(frozen=True)
class Public:
    """A parsed TPMT_PUBLIC."""

    raw: bytes
    type: int
    name_alg: int
    attributes: int
    auth_policy: bytes
    symmetric: tuple[int, int, int]
    scheme: tuple[int, int]
    curve: int
    key_bits: int
    exponent: int
    unique: tuple[bytes, ...]

    @cached_property
    def name(self) -> bytes:
        """TPM object name: nameAlg || H(TPMT_PUBLIC)."""
        if self.name_alg not in HASHES:
            raise StructureError(f"name algorithm 0x{self.name_alg:04x} is not supported")
        return struct.pack(">H", self.name_alg) + hashlib.new(HASHES[self.name_alg], self.raw).digest()

    def public_key(self):
        return self._key

    @cached_property
    def _key(self):
        """The cryptography public key, built once per structure."""
        if self.type == ALG_ECC:
            if self.curve not in _CURVES:
                raise StructureError(f"ECC curve 0x{self.curve:04x} is not supported")
            x, y = self.unique
            try:
                return ec.EllipticCurvePublicNumbers(
                    int.from_bytes(x, "big"), int.from_bytes(y, "big"), _curve(self.curve)
                ).public_key()
            except ValueError:
                raise StructureError("ECC public point is not on the curve") from None
        exponent = self.exponent or 65537
        try:
            return rsa.RSAPublicNumbers(exponent, int.from_bytes(self.unique[0], "big")).public_key()
        except ValueError as exc:
            raise StructureError(f"RSA public key is invalid: {exc}") from None


def _sym_def(r: _Reader) -> tuple[int, int, int]:
    alg = r.u16()
    if alg == ALG_NULL:
        return (alg, 0, 0)
    return (alg, r.u16(), r.u16())


def _scheme(r: _Reader) -> tuple[int, int]:
    alg = r.u16()
    if alg == ALG_NULL:
        return (alg, 0)
    return (alg, r.u16())


def parse_public(data: bytes) -> Public:
    r = _Reader(data, "TPMT_PUBLIC")
    key_type = r.u16()
    name_alg = r.u16()
    attributes = r.u32()
    auth_policy = r.tpm2b()
    symmetric = _sym_def(r)
    scheme = _scheme(r)
    curve = key_bits = exponent = 0
    if key_type == ALG_ECC:
        curve = r.u16()
        _scheme(r)  # kdf
        unique: tuple[bytes, ...] = (r.tpm2b(), r.tpm2b())
    elif key_type == ALG_RSA:
        key_bits = r.u16()
        exponent = r.u32()
        unique = (r.tpm2b(),)
    else:
        raise StructureError(f"key type 0x{key_type:04x} is not supported (ECC or RSA)")
    r.done()
    return Public(
        data, key_type, name_alg, attributes, auth_policy, symmetric, scheme, curve, key_bits, exponent, unique
    )


# The TCG EK Credential Profile's default EK templates (2.5, B.3.3 and B.3.4), as the TPMT_PUBLIC bytes before the
# key (type, nameAlg, objectAttributes, authPolicy, symmetric, scheme, keyBits and exponent or curve and kdf), by key
# type and size. An EK made from one of them matches it byte for byte up to its unique field; an EK certificate
# certifies a key made from the template of its key type, so any other attribute or policy is not the certified EK.
_EK_LOW_ATTRIBUTES = (
    ATTR_FIXED_TPM
    | ATTR_FIXED_PARENT
    | ATTR_SENSITIVE_DATA_ORIGIN
    | ATTR_ADMIN_WITH_POLICY
    | ATTR_RESTRICTED
    | ATTR_DECRYPT
)
_EK_HIGH_ATTRIBUTES = _EK_LOW_ATTRIBUTES | ATTR_USER_WITH_AUTH
EK_POLICY_A_SHA256 = bytes.fromhex("837197674484b3f81a90cc8d46a5d724fd52d76e06520b64f2a1da1b331469aa")
EK_POLICY_B_SHA256 = bytes.fromhex("ca3d0a99a2b93906f7a3342414efcfb3a385d44cd1fd459089d19b5071c0b7a0")
EK_POLICY_B_SHA384 = bytes.fromhex(
    "b26e7d28d11a50bc53d882bcf5fd3a1a074148bb35d3b4e4cb1c0ad9bde419cacb47ba09699646150f9fc000f3f80e12"
)


def _ek_prefix(key_type: int, name_alg: int, attributes: int, policy: bytes, aes_bits: int, detail: bytes) -> bytes:
    return (
        struct.pack(">HHIH", key_type, name_alg, attributes, len(policy))
        + policy
        + struct.pack(">HHHH", ALG_AES, aes_bits, ALG_CFB, ALG_NULL)
        + detail
    )


_RSA2048 = struct.pack(">HI", 2048, 0)
_EK_TEMPLATES: dict[tuple[int, int], tuple[tuple[str, bytes], ...]] = {
    (ALG_RSA, 2048): (
        ("L-1", _ek_prefix(ALG_RSA, ALG_SHA256, _EK_LOW_ATTRIBUTES, EK_POLICY_A_SHA256, 128, _RSA2048)),
        ("H-1", _ek_prefix(ALG_RSA, ALG_SHA256, _EK_HIGH_ATTRIBUTES, EK_POLICY_B_SHA256, 128, _RSA2048)),
    ),
    (ALG_ECC, ECC_NIST_P256): (
        (
            "L-2",
            _ek_prefix(
                ALG_ECC,
                ALG_SHA256,
                _EK_LOW_ATTRIBUTES,
                EK_POLICY_A_SHA256,
                128,
                struct.pack(">HH", ECC_NIST_P256, ALG_NULL),
            ),
        ),
        (
            "H-2",
            _ek_prefix(
                ALG_ECC,
                ALG_SHA256,
                _EK_HIGH_ATTRIBUTES,
                EK_POLICY_B_SHA256,
                128,
                struct.pack(">HH", ECC_NIST_P256, ALG_NULL),
            ),
        ),
    ),
    (ALG_ECC, ECC_NIST_P384): (
        (
            "H-3",
            _ek_prefix(
                ALG_ECC,
                ALG_SHA384,
                _EK_HIGH_ATTRIBUTES,
                EK_POLICY_B_SHA384,
                256,
                struct.pack(">HH", ECC_NIST_P384, ALG_NULL),
            ),
        ),
    ),
}
_EK_UNIQUE_SIZES = {(ALG_RSA, 2048): (256,), (ALG_ECC, ECC_NIST_P256): (32, 32), (ALG_ECC, ECC_NIST_P384): (48, 48)}


def ek_template_problem(ek: Public) -> str | None:
    """None when the EK is a TCG default EK template (RSA 2048 L-1/H-1, ECC P-256 L-2/H-2, ECC P-384 H-3) byte for byte
    before its key, and its key has the template's size; else what differs."""
    kind = (ek.type, ek.key_bits if ek.type == ALG_RSA else ek.curve)
    templates = _EK_TEMPLATES.get(kind)
    if templates is None:
        size = f"keyBits {ek.key_bits}" if ek.type == ALG_RSA else f"curve 0x{ek.curve:04x}"
        return (
            f"its key (type 0x{ek.type:04x}, {size}) is none of the TCG default EK templates' "
            "(RSA 2048, ECC P-256, ECC P-384)"
        )
    if tuple(map(len, ek.unique)) != _EK_UNIQUE_SIZES[kind]:
        return "its public key does not have the template's size"
    for _name, prefix in templates:
        if ek.raw.startswith(prefix):
            return None
    names = "/".join(name for name, _prefix in templates)
    return (
        f"its attributes (0x{ek.attributes:08x}), authPolicy ({ek.auth_policy.hex()[:96]}) or parameters are "
        f"not the TCG default EK template {names} for its key (attributes 0x{_EK_LOW_ATTRIBUTES:08x} or "
        f"0x{_EK_HIGH_ATTRIBUTES:08x}, PolicyA or PolicyB, AES CFB, no scheme)"
    )


class PcrSelection(NamedTuple):
    """One TPMS_PCR_SELECTION: a bank, its PCR indices in the order TPM2_Quote digests them, and the same as a bitmask."""

    alg: int
    indices: tuple[int, ...]
    mask: int


class Attest(NamedTuple):
    """A parsed TPMS_ATTEST of a quote."""

    magic: int
    type: int
    qualified_signer: bytes
    extra_data: bytes
    clock: int
    reset_count: int
    restart_count: int
    safe: int
    firmware_version: int
    pcr_selection: tuple[PcrSelection, ...]
    pcr_digest: bytes


@lru_cache(maxsize=64)
def _pcr_selection(alg: int, bitmap: bytes) -> PcrSelection:
    """A selection made once per bank and bitmap: a quote's selection is the same from call to call."""
    mask = int.from_bytes(bitmap, "little")
    return PcrSelection(alg, tuple(i for i in range(len(bitmap) * 8) if mask >> i & 1), mask)


def _check_end(what: str, data: bytes, pos: int) -> None:
    """A structure parsed up to ``pos`` must end exactly there: a length field pointing past the end is truncation."""
    if pos > len(data):
        raise StructureError(f"{what} is truncated at byte {len(data)}")
    if pos < len(data):
        raise StructureError(f"{what} has {len(data) - pos} trailing bytes")


def parse_attest(data: bytes) -> Attest:
    """One pass over a TPMS_ATTEST: fixed-size runs of fields unpacked at once; unpack_from raising struct.error
    is the truncation check (a TPM2B size pointing past the end makes the next unpack fail, or _check_end)."""
    pos = 0
    try:
        magic, attest_type, size = _ATTEST_HEAD.unpack_from(data)
        pos = _ATTEST_HEAD.size + size
        signer = data[_ATTEST_HEAD.size : pos]
        (size,) = _U16.unpack_from(data, pos)
        extra = data[pos + 2 : pos + 2 + size]
        pos += 2 + size
        clock, reset_count, restart_count, safe, firmware = _CLOCK_AND_FIRMWARE.unpack_from(data, pos)
        pos += _CLOCK_AND_FIRMWARE.size
        if attest_type != TPM_ST_ATTEST_QUOTE:
            return Attest(magic, attest_type, signer, extra, clock, reset_count, restart_count, safe, firmware, (), b"")
        (count,) = _U32.unpack_from(data, pos)
        if count > 16:
            raise StructureError(f"PCR selection lists {count} banks")
        pos += 4
        banks = []
        for _bank in range(count):
            alg, size = _SELECTION_HEAD.unpack_from(data, pos)
            pos += _SELECTION_HEAD.size + size
            banks.append(_pcr_selection(alg, data[pos - size : pos]))
        (size,) = _U16.unpack_from(data, pos)
        digest = data[pos + 2 : pos + 2 + size]
        pos += 2 + size
    except struct.error:
        raise StructureError(f"TPMS_ATTEST is truncated at byte {pos}") from None
    _check_end("TPMS_ATTEST", data, pos)
    return Attest(
        magic, attest_type, signer, extra, clock, reset_count, restart_count, safe, firmware, tuple(banks), digest
    )


class Signature(NamedTuple):
    alg: int
    hash_alg: int
    der_or_raw: bytes


def parse_signature(data: bytes) -> Signature:
    pos = 0
    try:
        alg, hash_alg = _SIGNATURE_HEAD.unpack_from(data)
        if alg == ALG_ECDSA:
            (size,) = _U16.unpack_from(data, 4)
            pos = 6 + size
            sig_r = data[6:pos]
            (size,) = _U16.unpack_from(data, pos)
            sig_s = data[pos + 2 : pos + 2 + size]
            pos += 2 + size
            value = encode_dss_signature(int.from_bytes(sig_r, "big"), int.from_bytes(sig_s, "big"))
        elif alg in (ALG_RSASSA, ALG_RSAPSS):
            (size,) = _U16.unpack_from(data, 4)
            pos = 6 + size
            value = data[6:pos]
        else:
            raise StructureError(f"signature algorithm 0x{alg:04x} is not supported")
    except struct.error:
        raise StructureError(f"TPMT_SIGNATURE is truncated at byte {pos}") from None
    _check_end("TPMT_SIGNATURE", data, pos)
    return Signature(alg, hash_alg, value)


def verify_signature(public: Public, signature: Signature, message: bytes) -> bool:
    """True when ``signature`` by ``public`` over ``message`` is valid."""
    if signature.hash_alg not in HASHES:
        return False
    key = public.public_key()
    try:
        if signature.alg == ALG_ECDSA:
            key.verify(signature.der_or_raw, message, _ecdsa(signature.hash_alg))
        elif signature.alg == ALG_RSASSA:
            key.verify(signature.der_or_raw, message, padding.PKCS1v15(), _hash(signature.hash_alg))
        else:
            algorithm = _hash(signature.hash_alg)
            key.verify(signature.der_or_raw, message, padding.PSS(padding.MGF1(algorithm), padding.PSS.AUTO), algorithm)
    except InvalidSignature:
        return False
    return True


def kdfa(hash_alg: int, key: bytes, label: bytes, context_u: bytes, context_v: bytes, bits: int) -> bytes:
    """KDFa of TPM 2.0 Part 1, 11.4.10.2 (SP800-108 counter mode with HMAC)."""
    name = HASHES[hash_alg]
    out = b""
    counter = 0
    while len(out) * 8 < bits:
        counter += 1
        out += hmac.new(
            key, struct.pack(">I", counter) + label + b"\x00" + context_u + context_v + struct.pack(">I", bits), name
        ).digest()
    return out[: (bits + 7) // 8]


@dataclass(frozen=True)
class Credential:
    """TPM2_MakeCredential output: TPM2B_ID_OBJECT and TPM2B_ENCRYPTED_SECRET contents."""

    blob: bytes
    encrypted_seed: bytes


def make_credential(ek: Public, object_name: bytes, secret: bytes) -> Credential:
    """Software TPM2_MakeCredential (TPM 2.0 Part 1, 24) for an RSA or ECC storage key."""
    if len(secret) > 64:
        raise ValueError("credential secret must be at most 64 bytes")
    if ek.name_alg not in HASHES:
        raise StructureError(f"EK name algorithm 0x{ek.name_alg:04x} is not supported")
    sym_alg, sym_bits, sym_mode = ek.symmetric
    if (sym_alg, sym_mode) != (ALG_AES, ALG_CFB) or sym_bits not in (128, 192, 256):
        raise StructureError("EK must use AES-128, AES-192 or AES-256 in CFB mode as its symmetric algorithm")
    digest_size = hashlib.new(HASHES[ek.name_alg]).digest_size
    if ek.type == ALG_RSA:
        seed = os.urandom(digest_size)
        algorithm = _hash(ek.name_alg)
        try:
            encrypted_seed = ek.public_key().encrypt(
                seed, padding.OAEP(padding.MGF1(algorithm), algorithm, b"IDENTITY\x00")
            )
        except ValueError as exc:  # a modulus too small for OAEP with this hash
            raise StructureError(f"EK RSA key cannot protect a credential seed: {exc}") from None
    else:
        curve = _curve(ek.curve)
        ephemeral = ec.generate_private_key(curve)
        z = ephemeral.exchange(ec.ECDH(), ek.public_key())
        numbers = ephemeral.public_key().public_numbers()
        size = (curve.key_size + 7) // 8
        x, y = numbers.x.to_bytes(size, "big"), numbers.y.to_bytes(size, "big")
        seed = _kdfe(ek.name_alg, z, b"IDENTITY", x, ek.unique[0], digest_size * 8)
        encrypted_seed = struct.pack(">H", len(x)) + x + struct.pack(">H", len(y)) + y
    sym_key = kdfa(ek.name_alg, seed, b"STORAGE", object_name, b"", sym_bits)
    encryptor = Cipher(algorithms.AES(sym_key), CFB(b"\x00" * 16)).encryptor()
    enc_identity = encryptor.update(struct.pack(">H", len(secret)) + secret) + encryptor.finalize()
    hmac_key = kdfa(ek.name_alg, seed, b"INTEGRITY", b"", b"", digest_size * 8)
    integrity = hmac.new(hmac_key, enc_identity + object_name, HASHES[ek.name_alg]).digest()
    return Credential(struct.pack(">H", len(integrity)) + integrity + enc_identity, encrypted_seed)


def _kdfe(hash_alg: int, z: bytes, label: bytes, party_u: bytes, party_v: bytes, bits: int) -> bytes:
    """KDFe of TPM 2.0 Part 1, 11.4.10.3 (SP800-56A concatenation KDF)."""
    name = HASHES[hash_alg]
    out = b""
    counter = 0
    while len(out) * 8 < bits:
        counter += 1
        out += hashlib.new(name, struct.pack(">I", counter) + z + label + b"\x00" + party_u + party_v).digest()
    return out[: (bits + 7) // 8]


@lru_cache(maxsize=256)
def pcr_digest(hash_alg: int, values: tuple[bytes, ...]) -> bytes:
    """The digest TPM2_Quote signs over the selected PCR values; the same values come join after join."""
    return _HASHLIB[hash_alg](b"".join(values)).digest()


def extend(hash_name: str, current: bytes, digest: bytes) -> bytes:
    return hashlib.new(hash_name, current + digest).digest()
