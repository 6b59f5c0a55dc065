# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""AMD SEV-SNP attestation reports verified to AMD's roots (issue 40, item 2): the verifier core of the ``sev-snp``
evidence variant, in one self-contained file.

Scope. This file parses an SNP attestation report (versions 2, 3 and 5 of the ATTESTATION_REPORT structure of AMD's
"SEV Secure Nested Paging Firmware ABI Specification"), verifies its ECDSA P-384 signature with the VCEK or VLEK
certificate the node supplies, verifies that certificate's chain to the ARK/ASK (or ARK/ASVK) the operator pinned for
the product (RSA-PSS with SHA-384, at a given time), checks AMD's certificate extensions against the report ("Versioned
Chip Endorsement Key (VCEK) Certificate and KDS Interface Specification": hwID = CHIP_ID, the SPL values = REPORTED_TCB,
productName = the chain's product), binds ``report_data`` to the verifier's nonce and the node's user data
(DESIGN section 3: ``SHA-512(nonce || SHA-256(user_data))``) or compares it to a given raw value, and checks the report
against an ``SevSnpPolicy`` (the policy file's ``sev-snp`` section), collecting every difference.

Not here: the evidence envelope, the variant registry and the join service's use of it (the variant door of issue 40
item 1 wires this file in; until then the join service accepts no SNP evidence); fetching anything from AMD's KDS (the
node supplies the VCEK, the operator pins the chains: nothing is fetched on the verify path); CRLs.

It imports only the standard library and ``cryptography`` so that the variant door can be redesigned around it.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import struct
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

try:
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
    from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
    from cryptography.utils import CryptographyDeprecationWarning
    from cryptography.x509.oid import NameOID, SignatureAlgorithmOID
except ImportError:  # reported by the modules through missing_required_lib()
    pass

REPORT_SIZE = 0x4A0
SIGNED_SIZE = 0x2A0  # the signature covers every byte before it
REPORT_VERSIONS = (2, 3, 5)
SIGNATURE_ALGO_ECDSA_P384_SHA384 = 1
PRODUCTS = ("Milan", "Genoa", "Turin")
SIGNERS = ("vcek", "vlek")

# Guest policy bits (ABI spec, GUEST_POLICY).
_POLICY_SMT = 1 << 16
_POLICY_RESERVED_ONE = 1 << 17
_POLICY_MIGRATE_MA = 1 << 18
_POLICY_DEBUG = 1 << 19
_POLICY_SINGLE_SOCKET = 1 << 20
_POLICY_DEFINED_BITS = 26  # bits 21-25 are defined from Genoa and Turin on; 26-63 must be zero

# PLATFORM_INFO bits by the name a policy uses.
PLATFORM_INFO_BITS = {
    "smt_enabled": 0,
    "tsme_enabled": 1,
    "ecc_enabled": 2,
    "rapl_disabled": 3,
    "ciphertext_hiding_enabled": 4,
    "alias_check_complete": 5,
}

# AMD's VCEK/VLEK certificate extensions, 1.3.6.1.4.1.3704.1.*.
_AMD_OID = "1.3.6.1.4.1.3704.1."
_OID_PRODUCT_NAME = _AMD_OID + "2"
_OID_HWID = _AMD_OID + "4"
_OID_CSP_ID = _AMD_OID + "5"
_SPL_OIDS = {
    "blSPL": _AMD_OID + "3.1",
    "teeSPL": _AMD_OID + "3.2",
    "snpSPL": _AMD_OID + "3.3",
    "spl4": _AMD_OID + "3.4",
    "spl5": _AMD_OID + "3.5",
    "spl6": _AMD_OID + "3.6",
    "spl7": _AMD_OID + "3.7",
    "ucodeSPL": _AMD_OID + "3.8",
    "fmcSPL": _AMD_OID + "3.9",
}
# Byte position of each SPL inside the 64-bit TCB_VERSION: Milan and Genoa, and Turin (which adds the FMC SPL first).
_TCB_LAYOUT = {
    "Milan": {"blSPL": 0, "teeSPL": 1, "spl4": 2, "spl5": 3, "spl6": 4, "spl7": 5, "snpSPL": 6, "ucodeSPL": 7},
    "Turin": {"fmcSPL": 0, "blSPL": 1, "teeSPL": 2, "snpSPL": 3, "spl5": 4, "spl6": 5, "spl7": 6, "ucodeSPL": 7},
}
_TCB_LAYOUT["Genoa"] = _TCB_LAYOUT["Milan"]
# The SPLs a policy's minimum_tcb names, by the policy's name.
TCB_FIELDS = {"bootloader": "blSPL", "tee": "teeSPL", "snp": "snpSPL", "microcode": "ucodeSPL", "fmc": "fmcSPL"}
_HWID_SIZE = {"Milan": 64, "Genoa": 64, "Turin": 8}


class SevSnpError(Exception):
    """An SNP report, certificate, chain or policy was refused. ``reason`` is a stable code per failure family:

    ``snp-malformed`` (the report's layout), ``snp-signature`` (the report's signature), ``snp-chain`` (the VCEK/VLEK
    chain to the pinned ARK/ASK, validity), ``snp-vcek`` (AMD's extensions against the report), ``snp-product`` (product
    line or stepping), ``snp-report-data`` (the binding to nonce and user data), ``snp-policy-invalid`` (the policy
    itself), and the policy families of ``PolicyDifference``: ``snp-measurement``, ``snp-tcb``, ``snp-policy-debug``,
    ``snp-policy-migration-agent``, ``snp-policy-smt``, ``snp-policy-single-socket``, ``snp-platform-info``,
    ``snp-id-key``, ``snp-author-key``, ``snp-vmpl``, ``snp-signer``, ``snp-guest-svn``.
    """

    def __init__(self, reason: str, message: str, differences: tuple[PolicyDifference, ...] = ()):
        super().__init__(message)
        self.reason = reason
        self.differences = differences


def _malformed(message: str) -> SevSnpError:
    return SevSnpError("snp-malformed", f"SEV-SNP attestation report: {message}")


@dataclass(frozen=True)
class TcbVersion:
    """A 64-bit TCB_VERSION and its security patch levels, read with the product's layout."""

    raw: int
    product: str

    def spl(self, name: str) -> int:
        """One SPL by its KDS name (``blSPL``, ``teeSPL``, ``snpSPL``, ``ucodeSPL``, ``fmcSPL``, ``spl4``...)."""
        position = _TCB_LAYOUT[self.product].get(name)
        return 0 if position is None else (self.raw >> (8 * position)) & 0xFF

    def __str__(self) -> str:
        named = {policy: kds for policy, kds in TCB_FIELDS.items() if kds in _TCB_LAYOUT[self.product]}
        return " ".join(f"{policy}={self.spl(kds)}" for policy, kds in named.items())


@dataclass(frozen=True)
class AttestationReport:
    """An SNP ATTESTATION_REPORT, parsed (every integer little-endian). TCB fields are raw; read them with
    ``tcb(value, product)``, since their layout depends on the product line."""

    raw: bytes
    version: int
    guest_svn: int
    policy: int
    family_id: bytes
    image_id: bytes
    vmpl: int
    signature_algo: int
    current_tcb: int
    platform_info: int
    signer_info: int
    report_data: bytes
    measurement: bytes
    host_data: bytes
    id_key_digest: bytes
    author_key_digest: bytes
    report_id: bytes
    report_id_ma: bytes
    reported_tcb: int
    cpuid_family: int | None  # versions 3 and later
    cpuid_model: int | None
    cpuid_stepping: int | None
    chip_id: bytes
    committed_tcb: int
    current_version: tuple[int, int, int]  # (major, minor, build)
    committed_version: tuple[int, int, int]
    launch_tcb: int
    launch_mitigation_vector: int | None  # version 5
    current_mitigation_vector: int | None
    signature_r: int
    signature_s: int

    @property
    def signed_bytes(self) -> bytes:
        return self.raw[:SIGNED_SIZE]

    @property
    def debug(self) -> bool:
        return bool(self.policy & _POLICY_DEBUG)

    @property
    def migration_agent(self) -> bool:
        return bool(self.policy & _POLICY_MIGRATE_MA)

    @property
    def smt_allowed(self) -> bool:
        return bool(self.policy & _POLICY_SMT)

    @property
    def single_socket(self) -> bool:
        return bool(self.policy & _POLICY_SINGLE_SOCKET)

    @property
    def signing_key(self) -> str:
        """``vcek``, ``vlek`` or ``none`` (SIGNER_INFO bits 2-4)."""
        return {0: "vcek", 1: "vlek", 7: "none"}[(self.signer_info >> 2) & 7]

    @property
    def mask_chip_id(self) -> bool:
        return bool(self.signer_info & 2)

    @property
    def author_key_en(self) -> bool:
        return bool(self.signer_info & 1)

    def cpuid_product(self) -> str | None:
        """The product line the report's CPUID fields name (versions 3+), or None (version 2, or unknown)."""
        if self.cpuid_family is None:
            return None
        model_line = (self.cpuid_model or 0) >> 4
        if self.cpuid_family == 0x19:
            return {0: "Milan", 1: "Genoa"}.get(model_line)
        if self.cpuid_family == 0x1A and model_line in (0, 1):
            return "Turin"
        return None

    def tcb(self, value: int, product: str) -> TcbVersion:
        return TcbVersion(value, product)


def _u32(raw: bytes, offset: int) -> int:
    return struct.unpack_from("<I", raw, offset)[0]


def _u64(raw: bytes, offset: int) -> int:
    return struct.unpack_from("<Q", raw, offset)[0]


def _zero(raw: bytes, start: int, end: int, name: str) -> None:
    if any(raw[start:end]):
        raise _malformed(f"{name} (bytes 0x{start:03X}..0x{end - 1:03X}) must be zero, is {raw[start:end].hex()}")


def parse_report(raw: bytes) -> AttestationReport:
    """The report's fields, or SevSnpError ``snp-malformed`` naming the field that breaks the layout."""
    if not isinstance(raw, (bytes, bytearray)):
        raise _malformed(f"expected bytes, got {type(raw).__name__}")
    raw = bytes(raw)
    if len(raw) != REPORT_SIZE:
        raise _malformed(f"size is {len(raw)} bytes, the structure is {REPORT_SIZE}")
    version = _u32(raw, 0x00)
    if version not in REPORT_VERSIONS:
        raise _malformed(f"VERSION is {version}, this verifier reads versions {', '.join(map(str, REPORT_VERSIONS))}")
    policy = _u64(raw, 0x08)
    if not policy & _POLICY_RESERVED_ONE:
        raise _malformed("POLICY bit 17 is reserved and must be 1, is 0")
    if policy >> _POLICY_DEFINED_BITS:
        raise _malformed(f"POLICY bits {_POLICY_DEFINED_BITS}-63 are reserved and must be zero, POLICY is 0x{policy:x}")
    vmpl = _u32(raw, 0x30)
    if vmpl > 3:
        raise _malformed(f"VMPL is {vmpl}, the levels are 0-3")
    signature_algo = _u32(raw, 0x34)
    if signature_algo != SIGNATURE_ALGO_ECDSA_P384_SHA384:
        raise _malformed(f"SIGNATURE_ALGO is {signature_algo}, only 1 (ECDSA P-384 with SHA-384) is accepted")
    signer_info = _u32(raw, 0x48)
    if signer_info >> 5:
        raise _malformed(f"SIGNER_INFO bits 5-31 are reserved and must be zero, SIGNER_INFO is 0x{signer_info:x}")
    if (signer_info >> 2) & 7 not in (0, 1, 7):
        raise _malformed(f"SIGNER_INFO.SIGNING_KEY is {(signer_info >> 2) & 7}, values 2-6 are reserved")
    _zero(raw, 0x4C, 0x50, "reserved field after SIGNER_INFO")
    if version >= 3:
        cpuid = (raw[0x188], raw[0x189], raw[0x18A])
        _zero(raw, 0x18B, 0x1A0, "reserved field after CPUID_STEP")
    else:
        cpuid = (None, None, None)
        _zero(raw, 0x188, 0x1A0, "reserved field after REPORTED_TCB (version 2)")
    _zero(raw, 0x1EB, 0x1EC, "reserved byte after CURRENT_MAJOR")
    _zero(raw, 0x1EF, 0x1F0, "reserved byte after COMMITTED_MAJOR")
    if version >= 5:
        mitigation = (_u64(raw, 0x1F8), _u64(raw, 0x200))
        _zero(raw, 0x208, SIGNED_SIZE, "reserved field after CURRENT_MIT_VECTOR")
    else:
        mitigation = (None, None)
        _zero(raw, 0x1F8, SIGNED_SIZE, f"reserved field after LAUNCH_TCB (version {version})")
    _zero(raw, SIGNED_SIZE + 0x90, REPORT_SIZE, "reserved part of SIGNATURE after R and S")
    return AttestationReport(
        raw=raw,
        version=version,
        guest_svn=_u32(raw, 0x04),
        policy=policy,
        family_id=raw[0x10:0x20],
        image_id=raw[0x20:0x30],
        vmpl=vmpl,
        signature_algo=signature_algo,
        current_tcb=_u64(raw, 0x38),
        platform_info=_u64(raw, 0x40),
        signer_info=signer_info,
        report_data=raw[0x50:0x90],
        measurement=raw[0x90:0xC0],
        host_data=raw[0xC0:0xE0],
        id_key_digest=raw[0xE0:0x110],
        author_key_digest=raw[0x110:0x140],
        report_id=raw[0x140:0x160],
        report_id_ma=raw[0x160:0x180],
        reported_tcb=_u64(raw, 0x180),
        cpuid_family=cpuid[0],
        cpuid_model=cpuid[1],
        cpuid_stepping=cpuid[2],
        chip_id=raw[0x1A0:0x1E0],
        committed_tcb=_u64(raw, 0x1E0),
        current_version=(raw[0x1EA], raw[0x1E9], raw[0x1E8]),
        committed_version=(raw[0x1EE], raw[0x1ED], raw[0x1EC]),
        launch_tcb=_u64(raw, 0x1F0),
        launch_mitigation_vector=mitigation[0],
        current_mitigation_vector=mitigation[1],
        # R and S are 72-byte little-endian integers at the start of SIGNATURE.
        signature_r=int.from_bytes(raw[SIGNED_SIZE : SIGNED_SIZE + 0x48], "little"),
        signature_s=int.from_bytes(raw[SIGNED_SIZE + 0x48 : SIGNED_SIZE + 0x90], "little"),
    )


# --- AMD's certificates -------------------------------------------------------------------------------------------


def _common_name(name: x509.Name) -> str:
    values = name.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(values[0].value) if values else ""


def _chain_error(message: str) -> SevSnpError:
    return SevSnpError("snp-chain", f"SEV-SNP certificate chain: {message}")


def _check_signed_by(cert: x509.Certificate, issuer: x509.Certificate, what: str) -> None:
    """RSA-PSS with SHA-384 (MGF1 SHA-384, salt 48), the only signature AMD's ARK and ASK make."""
    if cert.signature_algorithm_oid != SignatureAlgorithmOID.RSASSA_PSS:
        raise _chain_error(f"{what} is signed with {cert.signature_algorithm_oid.dotted_string}, expected RSASSA-PSS")
    if not isinstance(cert.signature_hash_algorithm, hashes.SHA384):
        raise _chain_error(f"{what} is signed with a hash other than SHA-384")
    key = issuer.public_key()
    if not isinstance(key, rsa.RSAPublicKey) or key.key_size < 2048:
        raise _chain_error(f"the key that signs {what} is not an RSA key of at least 2048 bits")
    if cert.issuer != issuer.subject:
        raise _chain_error(f"{what} names issuer {cert.issuer.rfc4514_string()}, not {issuer.subject.rfc4514_string()}")
    try:
        key.verify(
            cert.signature,
            cert.tbs_certificate_bytes,
            padding.PSS(mgf=padding.MGF1(hashes.SHA384()), salt_length=48),
            hashes.SHA384(),
        )
    except InvalidSignature:
        raise _chain_error(f"{what}'s signature does not verify with {_common_name(issuer.subject)}") from None


def _check_valid_at(cert: x509.Certificate, now: datetime.datetime, what: str) -> None:
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise _chain_error(
            f"{what} is valid {cert.not_valid_before_utc.isoformat()} to {cert.not_valid_after_utc.isoformat()}, "
            f"not at {now.isoformat()}"
        )


@dataclass(frozen=True)
class AmdChain:
    """The pinned ARK and ASK (or ASVK, for VLEKs) of one product, as KDS serves ``/v{c,l}ek/v1/<product>/cert_chain``:
    the ARK self-signed, the ASK signed by it, both RSA-PSS with SHA-384."""

    product: str
    signer: str  # "vcek" or "vlek": which endorsement keys the ASK (ASVK) signs
    ask: x509.Certificate
    ark: x509.Certificate

    @classmethod
    def from_pem(cls, pem: bytes) -> AmdChain:
        """The chain from KDS's PEM (ASK first, then ARK); SevSnpError ``snp-chain`` naming what is wrong."""
        try:
            certs = x509.load_pem_x509_certificates(pem)
        except ValueError as exc:
            raise _chain_error(f"the ARK/ASK PEM does not parse: {exc}") from None
        if len(certs) != 2:
            raise _chain_error(f"the ARK/ASK PEM holds {len(certs)} certificates, expected 2 (ASK, then ARK)")
        return cls.from_certificates(certs[0], certs[1])

    @classmethod
    def from_certificates(cls, ask: x509.Certificate, ark: x509.Certificate) -> AmdChain:
        ark_name = _common_name(ark.subject)
        if not ark_name.startswith("ARK-") or ark_name[4:] not in PRODUCTS:
            raise _chain_error(f"the root's common name is {ark_name!r}, expected ARK-<{'|'.join(PRODUCTS)}>")
        product = ark_name[4:]
        ask_name = _common_name(ask.subject)
        signer = {f"SEV-{product}": "vcek", f"SEV-VLEK-{product}": "vlek"}.get(ask_name)
        if signer is None:
            raise _chain_error(f"the ASK's common name is {ask_name!r}, expected SEV-{product} or SEV-VLEK-{product}")
        _check_signed_by(ark, ark, f"ARK-{product} (self-signed)")
        _check_signed_by(ask, ark, ask_name)
        return cls(product=product, signer=signer, ask=ask, ark=ark)

    def check_valid_at(self, now: datetime.datetime) -> None:
        _check_valid_at(self.ark, now, f"ARK-{self.product}")
        _check_valid_at(self.ask, now, _common_name(self.ask.subject))


def _vcek_error(message: str) -> SevSnpError:
    return SevSnpError("snp-vcek", f"SEV-SNP endorsement key certificate: {message}")


def _der_integer(value: bytes, name: str) -> int:
    """A small non-negative DER INTEGER (tag 2, short length), as KDS encodes each SPL."""
    if len(value) < 3 or value[0] != 0x02 or value[1] != len(value) - 2 or value[1] > 2:
        raise _vcek_error(f"extension {name} is not a DER INTEGER of at most 2 bytes: {value.hex()}")
    number = int.from_bytes(value[2:], "big", signed=True)
    if not 0 <= number <= 255:
        raise _vcek_error(f"extension {name} is {number}, an SPL is 0-255")
    return number


def _der_ia5(value: bytes, name: str) -> str:
    if len(value) < 2 or value[0] != 0x16 or value[1] != len(value) - 2 or value[1] >= 0x80:
        raise _vcek_error(f"extension {name} is not a DER IA5String: {value.hex()}")
    try:
        return value[2:].decode("ascii")
    except UnicodeDecodeError:
        raise _vcek_error(f"extension {name} is not ASCII") from None


@dataclass(frozen=True)
class EndorsementKey:
    """A VCEK or VLEK certificate and AMD's extensions on it."""

    certificate: x509.Certificate
    signer: str  # "vcek" (has hwID) or "vlek" (has cspID)
    product_name: str  # e.g. "Milan-B0"
    hwid: bytes | None
    csp_id: str | None
    spls: Mapping[str, int]

    @property
    def product(self) -> str:
        return self.product_name.split("-", 1)[0]

    @property
    def stepping(self) -> int | None:
        """The stepping number the product name's ``-B<n>`` suffix gives, or None when it has none."""
        dummy, dummy, suffix = self.product_name.partition("-")
        return int(suffix[1:]) if len(suffix) >= 2 and suffix[0] == "B" and suffix[1:].isdigit() else None

    def tcb(self) -> TcbVersion:
        """The TCB_VERSION the certificate is for, composed from its SPL extensions."""
        layout = _TCB_LAYOUT[self.product]
        return TcbVersion(
            sum(self.spls.get(name, 0) << (8 * position) for name, position in layout.items()), self.product
        )

    @classmethod
    def from_der(cls, der: bytes) -> EndorsementKey:
        try:
            with warnings.catch_warnings():
                # AMD's KDS issues VCEKs with serial number 0, which cryptography warns about (RFC 5280 wants > 0).
                warnings.simplefilter("ignore", CryptographyDeprecationWarning)
                cert = x509.load_der_x509_certificate(der)
        except ValueError as exc:
            raise _vcek_error(f"the certificate does not parse as DER X.509: {exc}") from None
        return cls.from_certificate(cert)

    @classmethod
    def from_certificate(cls, cert: x509.Certificate) -> EndorsementKey:
        amd = {}
        for extension in cert.extensions:
            oid = extension.oid.dotted_string
            if oid.startswith(_AMD_OID):
                amd[oid] = extension.value.value  # UnrecognizedExtension: the DER value
        if _OID_PRODUCT_NAME not in amd:
            raise _vcek_error("the productName extension (1.3.6.1.4.1.3704.1.2) is missing")
        product_name = _der_ia5(amd[_OID_PRODUCT_NAME], "productName")
        product = product_name.split("-", 1)[0]
        if product not in PRODUCTS:
            raise _vcek_error(f"productName is {product_name!r}, not a product this verifier knows ({PRODUCTS})")
        required = ["blSPL", "teeSPL", "snpSPL", "ucodeSPL"] + (["fmcSPL"] if product == "Turin" else [])
        spls = {}
        for name, oid in _SPL_OIDS.items():
            if oid in amd:
                spls[name] = _der_integer(amd[oid], name)
            elif name in required:
                raise _vcek_error(f"the {name} extension ({oid}) is missing")
        hwid = amd.get(_OID_HWID)
        csp_id = _der_ia5(amd[_OID_CSP_ID], "cspID") if _OID_CSP_ID in amd else None
        if hwid is not None and csp_id is not None:
            raise _vcek_error("the certificate has both hwID (a VCEK) and cspID (a VLEK)")
        if hwid is None and csp_id is None:
            raise _vcek_error("the certificate has neither hwID (a VCEK) nor cspID (a VLEK)")
        if hwid is not None and len(hwid) != _HWID_SIZE[product]:
            raise _vcek_error(f"hwID is {len(hwid)} bytes, a {product} hwID is {_HWID_SIZE[product]}")
        key = cert.public_key()
        if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP384R1):
            raise _vcek_error("the certified key is not an ECDSA P-384 key")
        return cls(
            certificate=cert,
            signer="vcek" if hwid is not None else "vlek",
            product_name=product_name,
            hwid=hwid,
            csp_id=csp_id,
            spls=spls,
        )


# --- the policy ---------------------------------------------------------------------------------------------------


def _policy_error(message: str) -> SevSnpError:
    return SevSnpError("snp-policy-invalid", f"sev-snp policy: {message}")


def _hex_list(value: object, name: str, size: int) -> tuple[bytes, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise _policy_error(f"{name} must be a hex string or a non-empty list of them")
    result = []
    for item in items:
        try:
            digest = bytes.fromhex(item) if isinstance(item, str) else b""
        except ValueError:
            digest = b""
        if len(digest) != size:
            raise _policy_error(f"{name}: {item!r} is not {size} bytes of hex ({2 * size} hex digits)")
        result.append(digest)
    return tuple(result)


def _bool(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise _policy_error(f"{name} must be true or false, is {value!r}")
    return value


def _int(value: object, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _policy_error(f"{name} must be an integer {low}-{high}, is {value!r}")
    return value


@dataclass(frozen=True)
class SevSnpPolicy:
    """What an SNP report must show: the ``sev-snp`` section of the measurement policy (``from_dict`` reads it)."""

    product: str
    measurements: tuple[bytes, ...]
    stepping: int | None = None
    minimum_tcb: Mapping[str, int] = field(default_factory=dict)
    debug: bool = False
    migration_agent: bool = False
    smt: bool = True
    single_socket: bool | None = None
    platform_info: Mapping[str, bool] = field(default_factory=dict)
    id_key_digests: tuple[bytes, ...] = ()
    author_key_digests: tuple[bytes, ...] = ()
    vmpl: int | None = 0
    minimum_guest_svn: int = 0
    signers: tuple[str, ...] = ("vcek",)
    # Accepting a report whose guest policy allows debugging (the host can read and change the guest's memory) is for
    # tests of the verifier only; from_dict refuses ``debug: true`` without ``allow_debug_for_tests: true``.
    allow_debug_for_tests: bool = False

    KEYS = (  # the keys of the policy file's sev-snp section
        "product",
        "stepping",
        "measurements",
        "minimum_tcb",
        "guest_policy",
        "platform_info",
        "id_key_digests",
        "author_key_digests",
        "vmpl",
        "minimum_guest_svn",
        "signers",
        "allow_debug_for_tests",
    )

    @classmethod
    def from_dict(cls, section: Mapping[str, object]) -> SevSnpPolicy:
        """The policy from the policy file's ``sev-snp`` section; SevSnpError ``snp-policy-invalid`` naming the key."""
        if not isinstance(section, Mapping):
            raise _policy_error(f"the section must be a mapping, is {type(section).__name__}")
        unknown = sorted(set(section) - set(cls.KEYS))
        if unknown:
            raise _policy_error(f"unknown keys {unknown}; the keys are {list(cls.KEYS)}")
        product = section.get("product")
        if product not in PRODUCTS:
            raise _policy_error(f"product must be one of {list(PRODUCTS)}, is {product!r}")
        if "measurements" not in section:
            raise _policy_error("measurements (the allowed launch digests, 48 bytes hex each) is required")
        measurements = _hex_list(section["measurements"], "measurements", 48)
        stepping = section.get("stepping")
        if stepping is not None:
            stepping = _int(stepping, "stepping", 0, 15)
        minimum_tcb = section.get("minimum_tcb", {})
        if not isinstance(minimum_tcb, Mapping):
            raise _policy_error("minimum_tcb must be a mapping of bootloader, tee, snp, microcode (and fmc on Turin)")
        for name in minimum_tcb:
            if name not in TCB_FIELDS or (name == "fmc" and product != "Turin"):
                raise _policy_error(f"minimum_tcb.{name} is not an SPL of {product}")
        minimum_tcb = {name: _int(value, f"minimum_tcb.{name}", 0, 255) for name, value in minimum_tcb.items()}
        guest_policy = section.get("guest_policy", {})
        if not isinstance(guest_policy, Mapping) or set(guest_policy) - {
            "debug",
            "migration_agent",
            "smt",
            "single_socket",
        }:
            raise _policy_error("guest_policy must be a mapping of debug, migration_agent, smt, single_socket")
        allow_debug = _bool(section.get("allow_debug_for_tests", False), "allow_debug_for_tests")
        debug = _bool(guest_policy.get("debug", False), "guest_policy.debug")
        if debug and not allow_debug:
            raise _policy_error(
                "guest_policy.debug: true lets the host read and change the guest's memory; it is accepted only "
                "with allow_debug_for_tests: true, for tests of the verifier"
            )
        single_socket = guest_policy.get("single_socket")
        platform_info = section.get("platform_info", {})
        if not isinstance(platform_info, Mapping):
            raise _policy_error(f"platform_info must be a mapping of {list(PLATFORM_INFO_BITS)} to true/false")
        for name in platform_info:
            if name not in PLATFORM_INFO_BITS:
                raise _policy_error(f"platform_info.{name} is not one of {list(PLATFORM_INFO_BITS)}")
        signers = section.get("signers", ["vcek"])
        if isinstance(signers, str):
            signers = [signers]
        if not isinstance(signers, (list, tuple)) or not signers or set(signers) - set(SIGNERS):
            raise _policy_error(f"signers must be a non-empty list of {list(SIGNERS)}, is {signers!r}")
        vmpl = section.get("vmpl", 0)
        return cls(
            product=product,
            measurements=measurements,
            stepping=stepping,
            minimum_tcb=minimum_tcb,
            debug=debug,
            migration_agent=_bool(guest_policy.get("migration_agent", False), "guest_policy.migration_agent"),
            smt=_bool(guest_policy.get("smt", True), "guest_policy.smt"),
            single_socket=None if single_socket is None else _bool(single_socket, "guest_policy.single_socket"),
            platform_info={name: _bool(value, f"platform_info.{name}") for name, value in platform_info.items()},
            id_key_digests=_hex_list(section["id_key_digests"], "id_key_digests", 48)
            if "id_key_digests" in section
            else (),
            author_key_digests=_hex_list(section["author_key_digests"], "author_key_digests", 48)
            if "author_key_digests" in section
            else (),
            vmpl=None if vmpl is None else _int(vmpl, "vmpl", 0, 3),
            minimum_guest_svn=_int(section.get("minimum_guest_svn", 0), "minimum_guest_svn", 0, 0xFFFFFFFF),
            signers=tuple(signers),
            allow_debug_for_tests=allow_debug,
        )


# --- verification -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyDifference:
    """One way a report differs from its policy."""

    reason: str
    field: str
    expected: str
    actual: str

    def __str__(self) -> str:
        return f"{self.field}: expected {self.expected}, got {self.actual}"


@dataclass(frozen=True)
class SevSnpResult:
    """A report whose signature, chain and binding verified, and every way it differs from the policy."""

    identity: bytes  # CHIP_ID
    measurements: Mapping[str, bytes]
    report_data: bytes
    differences: tuple[PolicyDifference, ...]
    report: AttestationReport
    endorsement_key: EndorsementKey

    @property
    def accepted(self) -> bool:
        return not self.differences

    def require_accepted(self) -> SevSnpResult:
        """This result, or SevSnpError with the first difference's reason and every difference in its message."""
        if self.differences:
            listed = "; ".join(str(difference) for difference in self.differences)
            raise SevSnpError(
                self.differences[0].reason, f"SEV-SNP report differs from the policy: {listed}", self.differences
            )
        return self


def bound_report_data(nonce: bytes, user_data: bytes) -> bytes:
    """DESIGN section 3: ``SHA-512(nonce || SHA-256(user_data))``, the 64 bytes a node's report must carry."""
    return hashlib.sha512(nonce + hashlib.sha256(user_data).digest()).digest()


def _check_signature(report: AttestationReport, key: EndorsementKey) -> None:
    public_key = cast(ec.EllipticCurvePublicKey, key.certificate.public_key())  # EndorsementKey refuses any other
    try:
        public_key.verify(
            encode_dss_signature(report.signature_r, report.signature_s),
            report.signed_bytes,
            ec.ECDSA(hashes.SHA384()),
        )
    except (InvalidSignature, ValueError):
        raise SevSnpError(
            "snp-signature",
            f"SEV-SNP report: the signature over bytes 0x000..0x29F does not verify with the {key.signer.upper()} "
            f"({key.product_name})",
        ) from None


def _check_endorsement_key(report: AttestationReport, key: EndorsementKey, chain: AmdChain) -> None:
    """AMD's extensions against the report and the chain (snp-vcek, snp-chain)."""
    if key.product != chain.product:
        raise _chain_error(f"the {key.signer.upper()} is for {key.product_name}, the pinned chain for {chain.product}")
    if key.signer != chain.signer:
        raise _chain_error(f"a {key.signer.upper()} cannot chain to the {chain.signer.upper()} chain's ASK")
    if report.signing_key != key.signer:
        raise _vcek_error(
            f"the report says it is signed by the {report.signing_key.upper()}, the certificate is a "
            f"{key.signer.upper()}"
        )
    if key.hwid is not None:
        if report.mask_chip_id:
            raise _vcek_error("the report masks its CHIP_ID (MASK_CHIP_ID), so the VCEK's hwID cannot be checked")
        # A Turin hwID is the CHIP_ID's first 8 bytes; the identity stays the whole (signed) CHIP_ID.
        if not hmac.compare_digest(report.chip_id[: len(key.hwid)], key.hwid):
            raise _vcek_error(f"hwID {key.hwid.hex()} is not the report's CHIP_ID {report.chip_id.hex()}")
    reported = report.tcb(report.reported_tcb, chain.product)
    certified = key.tcb()
    if reported.raw != certified.raw:
        differing = [
            f"{name} {certified.spl(name)} (report {reported.spl(name)})"
            for name in _TCB_LAYOUT[chain.product]
            if certified.spl(name) != reported.spl(name)
        ]
        raise _vcek_error(f"the certificate's TCB differs from the report's REPORTED_TCB: {', '.join(differing)}")


def _policy_differences(report: AttestationReport, key: EndorsementKey, policy: SevSnpPolicy) -> list:
    found: list[PolicyDifference] = []

    def differ(reason: str, name: str, expected: object, actual: object) -> None:
        found.append(PolicyDifference(reason, name, str(expected), str(actual)))

    product = key.product
    if product != policy.product:
        differ("snp-product", "product", policy.product, key.product_name)
    if report.cpuid_family is not None and report.cpuid_product() != product:
        family = f"family 0x{report.cpuid_family:02x} model 0x{report.cpuid_model:02x}"
        differ("snp-product", "cpuid", f"a {product} CPU", family)
    if policy.stepping is not None:
        if key.stepping != policy.stepping:
            differ("snp-product", "stepping", policy.stepping, f"{key.stepping} ({key.product_name})")
        if report.cpuid_stepping is not None and report.cpuid_stepping != policy.stepping:
            differ("snp-product", "cpuid_stepping", policy.stepping, report.cpuid_stepping)
    if not any(hmac.compare_digest(report.measurement, allowed) for allowed in policy.measurements):
        allowed = " or ".join(digest.hex() for digest in policy.measurements)
        differ("snp-measurement", "measurement", allowed, report.measurement.hex())
    for tcb_name, value in (
        ("reported_tcb", report.reported_tcb),
        ("current_tcb", report.current_tcb),
        ("committed_tcb", report.committed_tcb),
    ):
        tcb = report.tcb(value, product)
        for name, minimum in policy.minimum_tcb.items():
            if tcb.spl(TCB_FIELDS[name]) < minimum:
                differ("snp-tcb", f"{tcb_name}.{name}", f">= {minimum}", tcb.spl(TCB_FIELDS[name]))
    if report.debug and not (policy.debug and policy.allow_debug_for_tests):
        differ("snp-policy-debug", "guest_policy.debug", "false (the host could read the guest's memory)", "true")
    if report.migration_agent and not policy.migration_agent:
        differ("snp-policy-migration-agent", "guest_policy.migration_agent", "false", "true")
    if report.smt_allowed and not policy.smt:
        differ("snp-policy-smt", "guest_policy.smt", "false", "true")
    if policy.single_socket is not None and report.single_socket != policy.single_socket:
        differ("snp-policy-single-socket", "guest_policy.single_socket", policy.single_socket, report.single_socket)
    for name, wanted in policy.platform_info.items():
        actual = bool(report.platform_info >> PLATFORM_INFO_BITS[name] & 1)
        if actual != wanted:
            differ("snp-platform-info", f"platform_info.{name}", wanted, actual)
    if policy.id_key_digests and not any(
        hmac.compare_digest(report.id_key_digest, digest) for digest in policy.id_key_digests
    ):
        expected = " or ".join(digest.hex() for digest in policy.id_key_digests)
        differ("snp-id-key", "id_key_digest", expected, report.id_key_digest.hex())
    if policy.author_key_digests and not (
        report.author_key_en
        and any(hmac.compare_digest(report.author_key_digest, digest) for digest in policy.author_key_digests)
    ):
        expected = " or ".join(digest.hex() for digest in policy.author_key_digests)
        actual = report.author_key_digest.hex() if report.author_key_en else "no author key (AUTHOR_KEY_EN 0)"
        differ("snp-author-key", "author_key_digest", expected, actual)
    if policy.vmpl is not None and report.vmpl != policy.vmpl:
        differ("snp-vmpl", "vmpl", policy.vmpl, report.vmpl)
    if report.guest_svn < policy.minimum_guest_svn:
        differ("snp-guest-svn", "guest_svn", f">= {policy.minimum_guest_svn}", report.guest_svn)
    if key.signer not in policy.signers:
        differ("snp-signer", "signer", " or ".join(policy.signers), key.signer)
    return found


def verify_report(
    report: bytes,
    endorsement_key: bytes,
    chain: AmdChain,
    policy: SevSnpPolicy,
    now: datetime.datetime,
    *,
    nonce: bytes | None = None,
    user_data: bytes | None = None,
    report_data: bytes | None = None,
) -> SevSnpResult:
    """Verify one report to AMD's roots and check it against the policy.

    ``endorsement_key`` is the VCEK or VLEK certificate (DER) the node supplied; ``chain`` the ARK/ASK pinned for the
    policy's product; ``now`` the time the certificates must be valid at. The report data is bound either to
    ``nonce`` and ``user_data`` (``SHA-512(nonce || SHA-256(user_data))``) or, raw, to the 64 bytes ``report_data``.

    Raises SevSnpError for what makes the report unreadable or untrusted (malformed, signature, chain, extensions,
    report data); returns the result with every policy difference collected (``require_accepted`` refuses on any).
    """
    if (report_data is None) == (nonce is None or user_data is None):
        raise SevSnpError("snp-report-data", "give either nonce and user_data, or report_data, to bind the report to")
    if report_data is not None and len(report_data) != 64:
        raise SevSnpError("snp-report-data", f"the expected report_data is {len(report_data)} bytes, it is 64")
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    parsed = parse_report(report)
    key = EndorsementKey.from_der(endorsement_key)
    _check_signature(parsed, key)
    chain.check_valid_at(now)
    _check_signed_by(key.certificate, chain.ask, f"the {key.signer.upper()} ({key.product_name})")
    _check_valid_at(key.certificate, now, f"the {key.signer.upper()}")
    _check_endorsement_key(parsed, key, chain)
    expected = report_data if report_data is not None else bound_report_data(nonce, user_data)  # type: ignore[arg-type]
    if not hmac.compare_digest(parsed.report_data, expected):
        raise SevSnpError(
            "snp-report-data",
            "SEV-SNP report: REPORT_DATA is not "
            + ("the expected value" if report_data is not None else "SHA-512(nonce || SHA-256(user_data))")
            + f" (report has {parsed.report_data.hex()})",
        )
    return SevSnpResult(
        identity=parsed.chip_id,
        measurements={
            "measurement": parsed.measurement,
            "host_data": parsed.host_data,
            "family_id": parsed.family_id,
            "image_id": parsed.image_id,
            "id_key_digest": parsed.id_key_digest,
            "author_key_digest": parsed.author_key_digest,
        },
        report_data=parsed.report_data,
        differences=tuple(_policy_differences(parsed, key, policy)),
        report=parsed,
        endorsement_key=key,
    )
