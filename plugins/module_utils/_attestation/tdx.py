# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Intel TDX quotes (v4 and v5) verified to Intel's SGX root, and a TD's CC event log (CCEL) replayed to its RTMRs.

The verifier core of the ``tdx`` evidence variant (DESIGN section 3, issue 40 item 3), self-contained: it reads the
quote's bytes, not an evidence document, and knows nothing of the TPM variant, so the variant door can be put around it
without touching it. Layout (Intel TDX DCAP Quoting Library API, appendix A; all integers little-endian):

- header, 48 bytes: version u16 (4 or 5), attestation key type u16 (2: ECDSA-256 with P-256), TEE type u32 (0x81:
  TDX), QE SVN u16, PCE SVN u16, QE vendor ID (16), user data (20);
- v4: the TD quote body (TD 1.0, 584 bytes); v5: body type u16 (2: TD 1.0, 584 bytes; 3: TD 1.5, 648 bytes, adding
  TEE_TCB_SVN2 and MRSERVICETD), body size u32, the body;
- quote signature data length u32, then: the ECDSA signature (r || s, 64) over everything before the length, the
  attestation key (x || y, 64), certification data type u16 (6: QE report certification data), size u32, and in it the
  QE report (an SGX report body, 384), its signature by the PCK (64), QE authentication data (u16 size, data), and
  certification data of type 5: the PCK certificate chain in PEM (leaf, Platform or Processor CA, root).
- bytes after the signature data are outside every signature and ignored (go-tdx-guest's sample quote carries some).

Trust runs from the pinned root down: the PCK chain to the root at ``now`` (and the CRLs given), the QE report signed
by the PCK leaf, the QE report's report data = SHA-256(attestation key || QE authentication data) || 32 zero bytes,
then the quote signed by that attestation key. A failure there raises ``TdxError``; the policy's checks (MRTD, RTMRs
or the CCEL replay, TD attributes, XFAM, MRSEAM, SVNs, MRCONFIGID/MROWNER, the report data binding) are collected in
``TdxResult.differences`` so an operator sees all of them at once.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import hashlib
import hmac
import re
import struct
from dataclasses import dataclass, field

try:
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

    # What decoding a corrupt certificate may raise (cryptography decodes most fields only when they are first read).
    _CERTIFICATE_ERRORS: tuple = (
        ValueError,
        TypeError,
        UnsupportedAlgorithm,
        x509.InvalidVersion,
        x509.DuplicateExtension,
        x509.UnsupportedGeneralNameType,
    )
except ImportError:  # reported by the modules through missing_required_lib()
    _CERTIFICATE_ERRORS = (ValueError, TypeError)

from . import eventlog

VARIANT = "tdx"
MAX_QUOTE_BYTES = 64 * 1024
MAX_PCK_CHAIN_BYTES = 16 * 1024
MAX_CRL_BYTES = 512 * 1024

QUOTE_VERSIONS = (4, 5)
ATTESTATION_KEY_TYPE_ECDSA_P256 = 2
TEE_TYPE_TDX = 0x81
BODY_TYPE_TD10 = 2
BODY_TYPE_TD15 = 3
BODY_SIZES = {BODY_TYPE_TD10: 584, BODY_TYPE_TD15: 648}
CERTIFICATION_QE_REPORT = 6
CERTIFICATION_PCK_CHAIN = 5
HEADER_SIZE = 48
QE_REPORT_SIZE = 384
SIGNATURE_SIZE = 64
ATTESTATION_KEY_SIZE = 64
TD_ATTRIBUTES_DEBUG = 1 << 0  # TUD.DEBUG, bit 0 of TD_ATTRIBUTES: the host can read and change the TD's memory
RTMR_COUNT = 4
# CC event log record index -> RTMR (TDX: MR index 0 is MRTD, which no event extends; 1..4 are RTMR0..3).
CCEL_RTMR_OF_INDEX = {1: 0, 2: 1, 3: 2, 4: 3}
CCEL_TABLE_SIGNATURE = b"CCEL"
# Intel's TDX Quoting Enclave (the PCS QE identity "TD_QE"): its signer and product ID, and the MISCSELECT and
# ATTRIBUTES its identity fixes under their masks. The PCK certifies other enclaves' reports too; only this one's
# vouches for a TD quote's attestation key.
TD_QE_MRSIGNER = bytes.fromhex("dc9e2a7c6f948f17474e34a7fc43ed030f7c1563f1babddf6340c82e0e54a8c5")
TD_QE_ISV_PROD_ID = 2
TD_QE_MISCSELECT = (bytes(4), b"\xff" * 4)
TD_QE_ATTRIBUTES = (bytes.fromhex("11" + "00" * 15), bytes.fromhex("fb" + "ff" * 7 + "00" * 8))
CC_TYPE_TDX = 2

# Intel SGX Root CA (valid 2018-05-21 to 2049-12-31), the root of every PCK chain: pinned, never fetched.
INTEL_SGX_ROOT_CA_PEM = """-----BEGIN CERTIFICATE-----
MIICjzCCAjSgAwIBAgIUImUM1lqdNInzg7SVUr9QGzknBqwwCgYIKoZIzj0EAwIw
aDEaMBgGA1UEAwwRSW50ZWwgU0dYIFJvb3QgQ0ExGjAYBgNVBAoMEUludGVsIENv
cnBvcmF0aW9uMRQwEgYDVQQHDAtTYW50YSBDbGFyYTELMAkGA1UECAwCQ0ExCzAJ
BgNVBAYTAlVTMB4XDTE4MDUyMTEwNDUxMFoXDTQ5MTIzMTIzNTk1OVowaDEaMBgG
A1UEAwwRSW50ZWwgU0dYIFJvb3QgQ0ExGjAYBgNVBAoMEUludGVsIENvcnBvcmF0
aW9uMRQwEgYDVQQHDAtTYW50YSBDbGFyYTELMAkGA1UECAwCQ0ExCzAJBgNVBAYT
AlVTMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEC6nEwMDIYZOj/iPWsCzaEKi7
1OiOSLRFhWGjbnBVJfVnkY4u3IjkDYYL0MxO4mqsyYjlBalTVYxFP2sJBK5zlKOB
uzCBuDAfBgNVHSMEGDAWgBQiZQzWWp00ifODtJVSv1AbOScGrDBSBgNVHR8ESzBJ
MEegRaBDhkFodHRwczovL2NlcnRpZmljYXRlcy50cnVzdGVkc2VydmljZXMuaW50
ZWwuY29tL0ludGVsU0dYUm9vdENBLmRlcjAdBgNVHQ4EFgQUImUM1lqdNInzg7SV
Ur9QGzknBqwwDgYDVR0PAQH/BAQDAgEGMBIGA1UdEwEB/wQIMAYBAf8CAQEwCgYI
KoZIzj0EAwIDSQAwRgIhAOW/5QkR+S9CiSDcNoowLuPRLsWGf/Yi7GSX94BgwTwg
AiEA4J0lrHoMs+Xo5o/sX6O9QWxHRAvZUGOdRQ7cvqRXaqI=
-----END CERTIFICATE-----
"""
# Intel's SGX extension in a PCK certificate (1.2.840.113741.1.13.1) and the members read for the platform's identity.
_SGX_EXTENSION_OID = "1.2.840.113741.1.13.1"
_SGX_PPID_OID = "1.2.840.113741.1.13.1.1"
_SGX_PCEID_OID = "1.2.840.113741.1.13.1.3"
_SGX_FMSPC_OID = "1.2.840.113741.1.13.1.4"

REASONS = (
    "tdx-malformed",
    "tdx-signature",
    "tdx-qe-report",
    "tdx-pck-chain",
    "tdx-crl",
    "tdx-report-data",
    "tdx-rtmr-replay",
    "tdx-policy-invalid",
    "tdx-policy-mrtd",
    "tdx-policy-rtmr",
    "tdx-policy-debug",
    "tdx-policy-td-attributes",
    "tdx-policy-xfam",
    "tdx-policy-mrseam",
    "tdx-policy-seam-svn",
    "tdx-policy-tee-tcb-svn",
    "tdx-policy-mrconfigid",
    "tdx-policy-mrowner",
    "tdx-policy-mrownerconfig",
)

_HEADER = struct.Struct("<HHIHH16s20s")
_TD10_BODY = struct.Struct("<16s48s48s8s8s8s48s48s48s48s48s48s48s48s64s")
_TD15_EXTRA = struct.Struct("<16s48s")
_QE_REPORT = struct.Struct("<16s4s28s16s32s32s32s96sHH60s64s")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_CERTIFICATION_HEAD = struct.Struct("<HI")
_PEM_CERTIFICATE = re.compile(rb"-----BEGIN CERTIFICATE-----\r?\n[A-Za-z0-9+/=\r\n]+-----END CERTIFICATE-----")


class TdxError(ValueError):
    """A TDX quote that cannot be trusted, or a policy that cannot be read; ``reason`` is one of ``REASONS``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.reason}: {self.args[0]}"


@dataclass(frozen=True)
class QuoteHeader:
    version: int
    attestation_key_type: int
    tee_type: int
    qe_svn: int
    pce_svn: int
    qe_vendor_id: bytes
    user_data: bytes


@dataclass(frozen=True)
class TdReportBody:
    """The TD quote body: TD 1.0's fields, and for a v5 body of type 3 (TD 1.5) TEE_TCB_SVN2 and MRSERVICETD."""

    tee_tcb_svn: bytes
    mrseam: bytes
    mrsignerseam: bytes
    seam_attributes: bytes
    td_attributes: bytes
    xfam: bytes
    mrtd: bytes
    mrconfigid: bytes
    mrowner: bytes
    mrownerconfig: bytes
    rtmrs: tuple[bytes, bytes, bytes, bytes]
    report_data: bytes
    tee_tcb_svn2: bytes | None = None
    mrservicetd: bytes | None = None

    @property
    def debug(self) -> bool:
        return bool(int.from_bytes(self.td_attributes, "little") & TD_ATTRIBUTES_DEBUG)


@dataclass(frozen=True)
class QeReport:
    """The Quoting Enclave's SGX report body (384 bytes); ``raw`` is what the PCK signed."""

    cpu_svn: bytes
    misc_select: bytes
    attributes: bytes
    mr_enclave: bytes
    mr_signer: bytes
    isv_prod_id: int
    isv_svn: int
    report_data: bytes
    raw: bytes


@dataclass(frozen=True)
class CertificationData:
    """Certification data type 6: the QE report, its PCK signature, QE authentication data and the PCK chain (PEM)."""

    qe_report: QeReport
    qe_report_signature: bytes
    qe_auth_data: bytes
    pck_chain: tuple[x509.Certificate, ...]


@dataclass(frozen=True)
class Quote:
    header: QuoteHeader
    body_type: int
    body: TdReportBody
    signature: bytes
    attestation_key: bytes
    certification: CertificationData
    signed_region: bytes
    unsigned_trailer: int


@dataclass(frozen=True)
class Difference:
    """One way the quote differs from the policy: a reason code, the field, and what an operator needs to act."""

    reason: str
    field: str
    message: str

    def to_result(self) -> dict:
        return {"reason": self.reason, "field": self.field, "message": self.message}


@dataclass(frozen=True)
class TdxResult:
    """What a verified quote proves: the platform's identity, the TD's measurements by name, the bound report data,
    and what differs from the policy (empty when the quote satisfies it)."""

    identity: dict[str, str]
    measurements: dict[str, str]
    report_data: bytes
    differences: tuple[Difference, ...]
    quote_version: int
    variant: str = VARIANT

    @property
    def ok(self) -> bool:
        return not self.differences

    def raise_for_differences(self) -> None:
        """TdxError with the first difference's reason, naming every difference."""
        if self.differences:
            raise TdxError(self.differences[0].reason, "; ".join(d.message for d in self.differences))


# --- parsing -------------------------------------------------------------------------------------------------------


def _need(raw: bytes, offset: int, size: int, what: str) -> None:
    if size < 0 or len(raw) - offset < size:
        raise TdxError(
            "tdx-malformed", f"{what} is truncated: {size} bytes needed at offset {offset}, {len(raw) - offset} left"
        )


def parse_quote(raw: bytes) -> Quote:
    """Parse a TDX quote v4 or v5, refusing wrong sizes, unknown versions and types with the field named."""
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise TdxError("tdx-malformed", f"TDX quote must be bytes, got {type(raw).__name__}")
    raw = bytes(raw)
    if len(raw) > MAX_QUOTE_BYTES:
        raise TdxError("tdx-malformed", f"TDX quote is larger than {MAX_QUOTE_BYTES} bytes ({len(raw)})")
    _need(raw, 0, HEADER_SIZE, "quote header")
    header = QuoteHeader(*_HEADER.unpack_from(raw, 0))
    if header.version not in QUOTE_VERSIONS:
        raise TdxError("tdx-malformed", f"quote header field 'version' is {header.version}, not 4 or 5")
    if header.attestation_key_type != ATTESTATION_KEY_TYPE_ECDSA_P256:
        raise TdxError(
            "tdx-malformed",
            f"quote header field 'attestation_key_type' is {header.attestation_key_type}, not 2 (ECDSA-256-with-P-256)",
        )
    if header.tee_type != TEE_TYPE_TDX:
        raise TdxError("tdx-malformed", f"quote header field 'tee_type' is 0x{header.tee_type:x}, not 0x81 (TDX)")
    offset = HEADER_SIZE
    if header.version == 4:
        body_type = BODY_TYPE_TD10
    else:
        _need(raw, offset, 6, "quote body descriptor")
        body_type, body_size = _CERTIFICATION_HEAD.unpack_from(raw, offset)
        if body_type not in BODY_SIZES:
            raise TdxError(
                "tdx-malformed", f"quote body descriptor field 'type' is {body_type}, not 2 or 3 (TD 1.0/1.5)"
            )
        if body_size != BODY_SIZES[body_type]:
            raise TdxError(
                "tdx-malformed",
                f"quote body descriptor field 'size' is {body_size}, a body of type {body_type} is "
                f"{BODY_SIZES[body_type]} bytes",
            )
        offset += 6
    body_size = BODY_SIZES[body_type]
    _need(raw, offset, body_size, "TD quote body")
    body = _parse_body(raw[offset : offset + body_size], body_type)
    offset += body_size
    signed_region = raw[:offset]
    _need(raw, offset, 4, "quote signature data length")
    (signature_length,) = _U32.unpack_from(raw, offset)
    offset += 4
    _need(raw, offset, signature_length, "quote signature data")
    signature_data = raw[offset : offset + signature_length]
    signature, attestation_key, certification = _parse_signature_data(signature_data)
    return Quote(
        header,
        body_type,
        body,
        signature,
        attestation_key,
        certification,
        signed_region,
        len(raw) - offset - signature_length,
    )


def _parse_body(raw: bytes, body_type: int) -> TdReportBody:
    fields = _TD10_BODY.unpack_from(raw, 0)
    extra: tuple[bytes | None, bytes | None] = (None, None)
    if body_type == BODY_TYPE_TD15:
        extra = _TD15_EXTRA.unpack_from(raw, _TD10_BODY.size)
    return TdReportBody(*fields[:10], tuple(fields[10:14]), fields[14], *extra)  # type: ignore[arg-type]


def _parse_signature_data(raw: bytes) -> tuple[bytes, bytes, CertificationData]:
    what = "quote signature data"
    _need(raw, 0, SIGNATURE_SIZE + ATTESTATION_KEY_SIZE + 6, what)
    signature = raw[:SIGNATURE_SIZE]
    attestation_key = raw[SIGNATURE_SIZE : SIGNATURE_SIZE + ATTESTATION_KEY_SIZE]
    offset = SIGNATURE_SIZE + ATTESTATION_KEY_SIZE
    cert_type, cert_size = _CERTIFICATION_HEAD.unpack_from(raw, offset)
    offset += 6
    if cert_type != CERTIFICATION_QE_REPORT:
        raise TdxError(
            "tdx-malformed",
            f"certification data field 'type' is {cert_type}, not 6 (QE report certification data)",
        )
    if cert_size != len(raw) - offset:
        raise TdxError(
            "tdx-malformed",
            f"certification data field 'size' is {cert_size}, the signature data leaves {len(raw) - offset} bytes",
        )
    return signature, attestation_key, _parse_qe_certification(raw[offset:])


def _parse_qe_certification(raw: bytes) -> CertificationData:
    what = "QE report certification data"
    _need(raw, 0, QE_REPORT_SIZE + SIGNATURE_SIZE + 2, what)
    report_raw = raw[:QE_REPORT_SIZE]
    fields = _QE_REPORT.unpack_from(report_raw, 0)
    report = QeReport(
        fields[0], fields[1], fields[3], fields[4], fields[6], fields[8], fields[9], fields[11], report_raw
    )
    offset = QE_REPORT_SIZE
    report_signature = raw[offset : offset + SIGNATURE_SIZE]
    offset += SIGNATURE_SIZE
    (auth_size,) = _U16.unpack_from(raw, offset)
    offset += 2
    _need(raw, offset, auth_size, f"{what} field 'qe_auth_data'")
    auth_data = raw[offset : offset + auth_size]
    offset += auth_size
    _need(raw, offset, 6, f"{what} PCK certification data")
    chain_type, chain_size = _CERTIFICATION_HEAD.unpack_from(raw, offset)
    offset += 6
    if chain_type != CERTIFICATION_PCK_CHAIN:
        raise TdxError(
            "tdx-malformed",
            f"PCK certification data field 'type' is {chain_type}, not 5 (PCK certificate chain)",
        )
    if chain_size != len(raw) - offset:
        raise TdxError(
            "tdx-malformed",
            f"PCK certification data field 'size' is {chain_size}, the QE certification data leaves "
            f"{len(raw) - offset} bytes",
        )
    if chain_size > MAX_PCK_CHAIN_BYTES:
        raise TdxError("tdx-malformed", f"PCK certificate chain is larger than {MAX_PCK_CHAIN_BYTES} bytes")
    return CertificationData(report, report_signature, auth_data, _parse_pck_chain(raw[offset:]))


def _parse_pck_chain(pem: bytes) -> tuple[x509.Certificate, ...]:
    blocks = _PEM_CERTIFICATE.findall(pem)
    if len(blocks) not in (2, 3):
        raise TdxError(
            "tdx-malformed", f"PCK certificate chain holds {len(blocks)} PEM certificates, not 3 (leaf, CA, root)"
        )
    rest = _PEM_CERTIFICATE.sub(b"", pem).strip(b"\r\n\x00 ")
    if rest:
        raise TdxError("tdx-malformed", "PCK certificate chain holds bytes outside its PEM certificates")
    certificates = []
    for number, block in enumerate(blocks):
        try:
            certificates.append(_load_certificate(block))
        except _CERTIFICATE_ERRORS as exc:
            raise TdxError(
                "tdx-malformed", f"PCK certificate chain: certificate {number} does not parse: {exc}"
            ) from None
    return tuple(certificates)


def _load_certificate(pem: bytes) -> x509.Certificate:
    """A certificate with every field the verifier reads decoded now (cryptography decodes them when first read)."""
    certificate = x509.load_pem_x509_certificate(pem)
    _fields = (
        certificate.version,
        certificate.serial_number,
        certificate.subject.rfc4514_string(),
        certificate.issuer.rfc4514_string(),
        certificate.public_key(),
        certificate.not_valid_before_utc,
        certificate.not_valid_after_utc,
        certificate.signature_hash_algorithm,
        list(certificate.extensions),
    )
    return certificate


def parse_ccel_table(raw: bytes) -> int:
    """The ACPI CCEL table: check it names a TDX guest and return the length of its log area (LAML)."""
    if len(raw) < 56 or raw[:4] != CCEL_TABLE_SIGNATURE:
        raise TdxError("tdx-malformed", "CCEL table: not an ACPI CCEL table (signature 'CCEL', 56 bytes)")
    (length,) = _U32.unpack_from(raw, 4)
    if length != len(raw) or sum(raw) % 256:
        raise TdxError("tdx-malformed", f"CCEL table: length {length} or checksum does not match its {len(raw)} bytes")
    if raw[36] != CC_TYPE_TDX:
        raise TdxError("tdx-malformed", f"CCEL table field 'cc_type' is {raw[36]}, not 2 (TDX)")
    return struct.unpack_from("<Q", raw, 40)[0]


# --- the quote's cryptography ---------------------------------------------------------------------------------------


def _ecdsa_verify(public_key: ec.EllipticCurvePublicKey, raw_signature: bytes, message: bytes) -> bool:
    r = int.from_bytes(raw_signature[:32], "big")
    s = int.from_bytes(raw_signature[32:], "big")
    try:
        public_key.verify(encode_dss_signature(r, s), message, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return False
    return True


def _attestation_key(raw: bytes) -> ec.EllipticCurvePublicKey | None:
    try:
        return ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), b"\x04" + raw)
    except ValueError:
        return None


def load_root(pem: bytes | str) -> x509.Certificate:
    if not isinstance(pem, (bytes, str)):
        raise TdxError("tdx-policy-invalid", "TDX policy field 'root_ca' must be a PEM certificate (text)")
    try:
        return x509.load_pem_x509_certificate(pem.encode() if isinstance(pem, str) else pem)
    except ValueError as exc:
        raise TdxError("tdx-policy-invalid", f"TDX policy field 'root_ca' is not a PEM certificate: {exc}") from None


def load_crl(raw: bytes | str) -> x509.CertificateRevocationList:
    """A CRL in DER (as Intel's PCS serves ``rootcrl.der`` and the PCK CRLs) or PEM."""
    data = raw.encode() if isinstance(raw, str) else bytes(raw)
    if len(data) > MAX_CRL_BYTES:
        raise TdxError("tdx-crl", f"CRL is larger than {MAX_CRL_BYTES} bytes")
    try:
        crl = x509.load_pem_x509_crl(data) if data.lstrip().startswith(b"-----BEGIN") else x509.load_der_x509_crl(data)
        _fields = (crl.issuer.rfc4514_string(), crl.last_update_utc, crl.next_update_utc, list(crl.extensions))
        _revoked = [(entry.serial_number, entry.revocation_date_utc) for entry in crl]
    except _CERTIFICATE_ERRORS as exc:
        raise TdxError("tdx-crl", f"CRL does not parse (DER or PEM expected): {exc}") from None
    return crl


def _name(certificate: x509.Certificate) -> str:
    return certificate.subject.rfc4514_string()


def verify_pck_chain(
    chain: tuple[x509.Certificate, ...],
    root: x509.Certificate,
    now: datetime.datetime,
    crls: tuple[x509.CertificateRevocationList, ...] = (),
    *,
    require_crls: bool = False,
) -> None:
    """The PCK leaf and its CA to the pinned root at ``now``, and the CRLs given (signature, currency, revocation)."""
    leaf, ca = chain[0], chain[1]
    if len(chain) == 3 and chain[2].public_bytes(serialization.Encoding.DER) != root.public_bytes(
        serialization.Encoding.DER
    ):
        raise TdxError("tdx-pck-chain", f"PCK chain ends in '{_name(chain[2])}', not the pinned root '{_name(root)}'")
    for certificate, issuer, role in ((leaf, ca, "PCK leaf"), (ca, root, "PCK CA"), (root, root, "root")):
        try:
            certificate.verify_directly_issued_by(issuer)
        except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm) as exc:
            raise TdxError(
                "tdx-pck-chain",
                f"{role} '{_name(certificate)}' is not signed by '{_name(issuer)}': {exc or 'bad signature'}",
            ) from None
        if not certificate.not_valid_before_utc <= now <= certificate.not_valid_after_utc:
            raise TdxError(
                "tdx-pck-chain",
                f"{role} '{_name(certificate)}' is valid {certificate.not_valid_before_utc:%Y-%m-%d} to "
                f"{certificate.not_valid_after_utc:%Y-%m-%d}, not at {now:%Y-%m-%dT%H:%M:%SZ}",
            )
        is_ca = role != "PCK leaf"
        try:
            constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints).value
        except x509.ExtensionNotFound:
            constraints = None
        if is_ca and (constraints is None or not constraints.ca):
            raise TdxError("tdx-pck-chain", f"{role} '{_name(certificate)}' is not a CA certificate")
        if not is_ca and constraints is not None and constraints.ca:
            raise TdxError("tdx-pck-chain", f"PCK leaf '{_name(certificate)}' is a CA certificate")
    if not isinstance(leaf.public_key(), ec.EllipticCurvePublicKey) or leaf.public_key().curve.name != "secp256r1":
        raise TdxError("tdx-pck-chain", f"PCK leaf '{_name(leaf)}' does not hold a P-256 key")
    _check_crls((leaf, ca), (ca, root), now, crls, require_crls)


def _check_crls(
    subjects: tuple[x509.Certificate, ...],
    issuers: tuple[x509.Certificate, ...],
    now: datetime.datetime,
    crls: tuple[x509.CertificateRevocationList, ...],
    require_crls: bool,
) -> None:
    for certificate, issuer in zip(subjects, issuers):
        covering = [crl for crl in crls if crl.issuer == issuer.subject]
        if require_crls and not covering:
            raise TdxError("tdx-crl", f"no CRL of '{_name(issuer)}' was given and the policy requires one")
        for crl in covering:
            if not crl.is_signature_valid(issuer.public_key()):  # type: ignore[arg-type]
                raise TdxError("tdx-crl", f"CRL of '{_name(issuer)}' is not signed by that CA")
            next_update = crl.next_update_utc
            if crl.last_update_utc > now or next_update is None or next_update < now:
                raise TdxError(
                    "tdx-crl",
                    f"CRL of '{_name(issuer)}' is current {crl.last_update_utc:%Y-%m-%d} to "
                    f"{next_update:%Y-%m-%d}, not at {now:%Y-%m-%dT%H:%M:%SZ}"
                    if next_update
                    else f"CRL of '{_name(issuer)}' has no next update",
                )
            if crl.get_revoked_certificate_by_serial_number(certificate.serial_number) is not None:
                raise TdxError(
                    "tdx-crl",
                    f"'{_name(certificate)}' (serial {certificate.serial_number:x}) is revoked by the CRL of "
                    f"'{_name(issuer)}'",
                )


def verify_signatures(
    quote: Quote,
    policy: TdxPolicy,
    now: datetime.datetime,
    crls: tuple[x509.CertificateRevocationList, ...] = (),
) -> None:
    """Everything the quote's trust rests on, from the pinned root down; TdxError at the first failure."""
    certification = quote.certification
    verify_pck_chain(certification.pck_chain, policy.root_ca, now, policy.crls + crls, require_crls=policy.require_crls)
    pck_key = certification.pck_chain[0].public_key()
    if not isinstance(pck_key, ec.EllipticCurvePublicKey):  # verify_pck_chain checked it
        raise TdxError("tdx-pck-chain", "the PCK leaf's key is not an EC key")
    if not _ecdsa_verify(pck_key, certification.qe_report_signature, certification.qe_report.raw):
        raise TdxError("tdx-qe-report", "the QE report's signature does not verify with the PCK leaf's key")
    check_qe_identity(certification.qe_report, policy)
    binding = hashlib.sha256(quote.attestation_key + certification.qe_auth_data).digest() + bytes(32)
    if not hmac.compare_digest(certification.qe_report.report_data, binding):
        raise TdxError(
            "tdx-qe-report",
            "the QE report's report data is not SHA-256(attestation key || QE authentication data) || 32 zero bytes: "
            "the attestation key is not the one the Quoting Enclave vouched for",
        )
    attestation_key = _attestation_key(quote.attestation_key)
    if attestation_key is None:
        raise TdxError("tdx-signature", "the quote's attestation key is not a P-256 point")
    if not _ecdsa_verify(attestation_key, quote.signature, quote.signed_region):
        raise TdxError("tdx-signature", "the quote's signature over header and TD quote body does not verify")


def _masked(value: bytes, mask: bytes) -> bytes:
    return bytes(a & b for a, b in zip(value, mask))


def check_qe_identity(report: QeReport, policy: TdxPolicy) -> None:
    """The QE report is the TDX Quoting Enclave's: signer, product ID, masked MISCSELECT/ATTRIBUTES, minimum SVN."""
    problems = []
    if report.mr_signer != policy.qe_mrsigner:
        problems.append(f"MRSIGNER {report.mr_signer.hex()} is not {policy.qe_mrsigner.hex()}")
    if report.isv_prod_id != TD_QE_ISV_PROD_ID:
        problems.append(f"ISVPRODID {report.isv_prod_id} is not {TD_QE_ISV_PROD_ID} (TD_QE)")
    for name, value, (expected, mask) in (
        ("MISCSELECT", report.misc_select, TD_QE_MISCSELECT),
        ("ATTRIBUTES", report.attributes, TD_QE_ATTRIBUTES),
    ):
        if _masked(value, mask) != _masked(expected, mask):
            problems.append(f"{name} {value.hex()} does not match {expected.hex()} under mask {mask.hex()}")
    if policy.minimum_qe_isv_svn is not None and report.isv_svn < policy.minimum_qe_isv_svn:
        problems.append(f"ISVSVN {report.isv_svn} is below the policy's {policy.minimum_qe_isv_svn}")
    if problems:
        raise TdxError("tdx-qe-report", "the QE report is not Intel's TDX Quoting Enclave's: " + "; ".join(problems))


# --- the policy ----------------------------------------------------------------------------------------------------


def _hex_values(value: object, field_name: str, size: int) -> tuple[bytes, ...]:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise TdxError("tdx-policy-invalid", f"TDX policy field '{field_name}' is an empty list")
    out = []
    for item in items:
        try:
            raw = bytes.fromhex(item) if isinstance(item, str) else None
        except ValueError:
            raw = None
        if raw is None or len(raw) != size:
            raise TdxError(
                "tdx-policy-invalid", f"TDX policy field '{field_name}' must be {size} bytes in hex (or a list of them)"
            )
        out.append(raw)
    return tuple(out)


def _one_hex(value: object, field_name: str, size: int) -> bytes:
    if isinstance(value, list):
        raise TdxError("tdx-policy-invalid", f"TDX policy field '{field_name}' takes one value, not a list")
    return _hex_values(value, field_name, size)[0]


_POLICY_FIELDS = (
    "root_ca",
    "mrtd",
    "rtmrs",
    "event_log",
    "td_attributes",
    "xfam",
    "mrseam",
    "minimum_seam_svn",
    "minimum_tee_tcb_svn",
    "mrconfigid",
    "mrowner",
    "mrownerconfig",
    "crls",
    "require_crls",
    "qe_mrsigner",
    "minimum_qe_isv_svn",
)


@dataclass(frozen=True)
class TdxPolicy:
    """What a TD must be. Lists are the allowed values; None means "not checked". The debug bit is always refused.

    ``event_log``: ``required`` (the CCEL log must come and replay to RTMR0-3), ``optional`` (replayed when it comes),
    ``ignored``. ``minimum_tee_tcb_svn`` is compared byte by byte (each TEE_TCB_SVN component); ``minimum_seam_svn``
    with TEE_TCB_SVN byte 0, the TDX module's SVN within its major version (byte 1). ``qe_mrsigner`` (Intel's TD_QE
    signer by default) and ``minimum_qe_isv_svn`` pin the Quoting Enclave; ``crls`` add to those ``verify`` is given,
    and ``require_crls`` refuses a chain any of whose CAs has no CRL."""

    root_ca: x509.Certificate = field(default_factory=lambda: load_root(INTEL_SGX_ROOT_CA_PEM))
    mrtd: tuple[bytes, ...] | None = None
    rtmrs: dict[int, tuple[bytes, ...]] = field(default_factory=dict)
    event_log: str = "optional"
    td_attributes: bytes | None = None
    xfam: bytes | None = None
    mrseam: tuple[bytes, ...] | None = None
    minimum_seam_svn: int | None = None
    minimum_tee_tcb_svn: bytes | None = None
    mrconfigid: bytes | None = None
    mrowner: bytes | None = None
    mrownerconfig: bytes | None = None
    crls: tuple[x509.CertificateRevocationList, ...] = ()
    require_crls: bool = False
    qe_mrsigner: bytes = TD_QE_MRSIGNER
    minimum_qe_isv_svn: int | None = None

    @classmethod
    def from_dict(cls, document: dict) -> TdxPolicy:
        """The policy's ``tdx`` section: hex strings for measurements, PEM for the root, PEM or base64 DER for CRLs."""
        if not isinstance(document, dict):
            raise TdxError("tdx-policy-invalid", f"TDX policy must be a mapping, got {type(document).__name__}")
        unknown = sorted(str(name) for name in set(document) - set(_POLICY_FIELDS))
        if unknown:
            raise TdxError(
                "tdx-policy-invalid",
                f"TDX policy has unknown field(s) {', '.join(unknown)} (known: {', '.join(_POLICY_FIELDS)})",
            )
        values: dict[str, object] = {}
        if "root_ca" in document:
            values["root_ca"] = load_root(document["root_ca"])
        for name in ("mrtd", "mrseam"):
            if name in document:
                values[name] = _hex_values(document[name], name, 48)
        rtmrs = document.get("rtmrs", {})
        if not isinstance(rtmrs, dict):
            raise TdxError("tdx-policy-invalid", "TDX policy field 'rtmrs' must map an RTMR index (0-3) to values")
        parsed_rtmrs = {}
        for index, allowed in rtmrs.items():
            if str(index) not in ("0", "1", "2", "3"):
                raise TdxError("tdx-policy-invalid", f"TDX policy field 'rtmrs' names RTMR {index!r}, not 0-3")
            parsed_rtmrs[int(index)] = _hex_values(allowed, f"rtmrs.{index}", 48)
        values["rtmrs"] = parsed_rtmrs
        if "event_log" in document:
            if document["event_log"] not in ("required", "optional", "ignored"):
                raise TdxError(
                    "tdx-policy-invalid", "TDX policy field 'event_log' must be 'required', 'optional' or 'ignored'"
                )
            values["event_log"] = document["event_log"]
        for name, size in (("td_attributes", 8), ("xfam", 8), ("minimum_tee_tcb_svn", 16)):
            if name in document:
                values[name] = _one_hex(document[name], name, size)
        for name in ("mrconfigid", "mrowner", "mrownerconfig"):
            if name in document:
                values[name] = _one_hex(document[name], name, 48)
        for name, top in (("minimum_seam_svn", 255), ("minimum_qe_isv_svn", 65535)):
            if name in document:
                svn = document[name]
                if isinstance(svn, bool) or not isinstance(svn, int) or not 0 <= svn <= top:
                    raise TdxError("tdx-policy-invalid", f"TDX policy field '{name}' must be an integer 0-{top}")
                values[name] = svn
        if "qe_mrsigner" in document:
            values["qe_mrsigner"] = _one_hex(document["qe_mrsigner"], "qe_mrsigner", 32)
        if "crls" in document:
            crls = document["crls"]
            if not isinstance(crls, list):
                raise TdxError("tdx-policy-invalid", "TDX policy field 'crls' must be a list of PEM or base64 DER CRLs")
            values["crls"] = tuple(load_crl(_crl_bytes(crl)) for crl in crls)
        if "require_crls" in document:
            if not isinstance(document["require_crls"], bool):
                raise TdxError("tdx-policy-invalid", "TDX policy field 'require_crls' must be true or false")
            values["require_crls"] = document["require_crls"]
        return cls(**values)  # type: ignore[arg-type]


def _crl_bytes(crl: object) -> bytes:
    if not isinstance(crl, str):
        raise TdxError("tdx-policy-invalid", "TDX policy field 'crls' holds a value that is not a string")
    if crl.lstrip().startswith("-----BEGIN"):
        return crl.encode()
    try:
        return base64.b64decode(crl, validate=True)
    except binascii.Error:
        raise TdxError(
            "tdx-policy-invalid", "TDX policy field 'crls' holds a value that is neither PEM nor base64"
        ) from None


# --- verification --------------------------------------------------------------------------------------------------


def expected_report_data(nonce: bytes, user_data: bytes) -> bytes:
    """The binding of DESIGN section 3: SHA-512(nonce || SHA-256(user_data))."""
    return hashlib.sha512(nonce + hashlib.sha256(user_data).digest()).digest()


def measurements(body: TdReportBody) -> dict[str, str]:
    named = {
        "MRTD": body.mrtd,
        **{f"RTMR{i}": value for i, value in enumerate(body.rtmrs)},
        "MRSEAM": body.mrseam,
        "MRSIGNERSEAM": body.mrsignerseam,
        "SEAM_ATTRIBUTES": body.seam_attributes,
        "TD_ATTRIBUTES": body.td_attributes,
        "XFAM": body.xfam,
        "TEE_TCB_SVN": body.tee_tcb_svn,
        "MRCONFIGID": body.mrconfigid,
        "MROWNER": body.mrowner,
        "MROWNERCONFIG": body.mrownerconfig,
    }
    if body.tee_tcb_svn2 is not None:
        named["TEE_TCB_SVN2"] = body.tee_tcb_svn2
    if body.mrservicetd is not None:
        named["MRSERVICETD"] = body.mrservicetd
    return {name: value.hex() for name, value in named.items()}


def _der_sequence(data: bytes) -> list[tuple[str, bytes]]:
    """The (OID, value bytes) pairs of a DER SEQUENCE OF SEQUENCE { OID, ANY }: Intel's SGX extension's shape."""
    pairs = []
    tag, body, _rest = _der_item(data)
    if tag != 0x30:
        raise ValueError("not a SEQUENCE")
    while body:
        tag, member, body = _der_item(body)
        if tag != 0x30:
            raise ValueError("member is not a SEQUENCE")
        oid_tag, oid, value = _der_item(member)
        if oid_tag != 0x06:
            raise ValueError("member does not start with an OID")
        pairs.append((_oid_text(oid), value))
    return pairs


def _der_item(data: bytes) -> tuple[int, bytes, bytes]:
    if len(data) < 2:
        raise ValueError("truncated")
    tag, length, offset = data[0], data[1], 2
    if length & 0x80:
        count = length & 0x7F
        if not 1 <= count <= 3 or len(data) < 2 + count:
            raise ValueError("bad length")
        length, offset = int.from_bytes(data[2 : 2 + count], "big"), 2 + count
    if len(data) < offset + length:
        raise ValueError("truncated")
    return tag, data[offset : offset + length], data[offset + length :]


def _oid_text(raw: bytes) -> str:
    parts, value = [], 0
    for byte in raw:
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            parts.append(value)
            value = 0
    first = min(parts[0] // 40, 2)
    return ".".join(map(str, [first, parts[0] - 40 * first, *parts[1:]]))


def identity(quote: Quote) -> dict[str, str]:
    """Who vouches for the TD: the PCK leaf's fingerprint and, from Intel's SGX extension, PPID, PCE ID and FMSPC."""
    leaf = quote.certification.pck_chain[0]
    found = {"pck_sha256": leaf.fingerprint(hashes.SHA256()).hex(), "pck_subject": _name(leaf)}
    try:
        extension = leaf.extensions.get_extension_for_oid(x509.ObjectIdentifier(_SGX_EXTENSION_OID)).value
        members = dict(_der_sequence(extension.value))  # type: ignore[attr-defined]
        for oid, name in ((_SGX_PPID_OID, "ppid"), (_SGX_PCEID_OID, "pce_id"), (_SGX_FMSPC_OID, "fmspc")):
            if oid in members:
                tag, value, _rest = _der_item(members[oid])
                if tag == 0x04:
                    found[name] = value.hex()
    except (x509.ExtensionNotFound, ValueError, IndexError):
        pass  # a lab-made PCK has no SGX extension: the fingerprint names it
    return found


def verify(
    raw_quote: bytes,
    policy: TdxPolicy,
    *,
    now: datetime.datetime,
    nonce: bytes | None = None,
    user_data: bytes | None = None,
    report_data: bytes | None = None,
    event_log: bytes | None = None,
    crls: tuple[bytes, ...] = (),
) -> TdxResult:
    """Verify a TDX quote to the policy's root and check it against the policy.

    The report data is checked against SHA-512(nonce || SHA-256(user_data)) when ``nonce`` and ``user_data`` are
    given, or against ``report_data`` (raw mode, 64 bytes); one of the two is required. ``event_log`` is the CCEL
    area (the ACPI table's log, 0xFF padding allowed). ``crls`` (DER or PEM) add to the policy's. Trust failures raise
    TdxError; policy differences are collected in the result."""
    if now.tzinfo is None:
        raise ValueError("now must be an aware datetime")
    quote = parse_quote(raw_quote)
    verify_signatures(quote, policy, now, tuple(load_crl(crl) for crl in crls))
    body = quote.body
    differences: list[Difference] = []
    differences.extend(_check_report_data(body, nonce, user_data, report_data))
    differences.extend(_check_policy(body, policy))
    if event_log is not None and policy.event_log != "ignored":
        differences.extend(replay_ccel(event_log, body.rtmrs))
    elif event_log is None and policy.event_log == "required":
        differences.append(
            Difference("tdx-rtmr-replay", "event_log", "the policy requires the CCEL event log and none was given")
        )
    return TdxResult(identity(quote), measurements(body), body.report_data, tuple(differences), quote.header.version)


def _check_report_data(
    body: TdReportBody, nonce: bytes | None, user_data: bytes | None, raw: bytes | None
) -> list[Difference]:
    if raw is not None:
        if nonce is not None or user_data is not None:
            raise ValueError("give either nonce and user_data, or report_data (raw mode), not both")
        if len(raw) != 64:
            raise ValueError(f"report_data must be 64 bytes, got {len(raw)}")
        wanted, how = raw, "the given report data"
    else:
        if nonce is None or user_data is None:
            raise ValueError("nonce and user_data (or report_data) are needed to check the quote's binding")
        wanted, how = expected_report_data(nonce, user_data), "SHA-512(nonce || SHA-256(user_data))"
    if hmac.compare_digest(body.report_data, wanted):
        return []
    return [
        Difference(
            "tdx-report-data",
            "report_data",
            f"the quote's report data is not {how}: it is not bound to this nonce and key",
        )
    ]


def _check_policy(body: TdReportBody, policy: TdxPolicy) -> list[Difference]:
    found: list[Difference] = []

    def allowed(reason: str, name: str, value: bytes, values: tuple[bytes, ...] | None) -> None:
        if values is not None and value not in values:
            found.append(Difference(reason, name, f"{name.upper()} {value.hex()} is not among the policy's values"))

    if body.debug:
        found.append(
            Difference(
                "tdx-policy-debug",
                "td_attributes",
                f"TD_ATTRIBUTES {body.td_attributes.hex()} has the DEBUG bit set: the host can read the TD's memory",
            )
        )
    allowed("tdx-policy-mrtd", "mrtd", body.mrtd, policy.mrtd)
    for index, values in sorted(policy.rtmrs.items()):
        if body.rtmrs[index] not in values:
            found.append(
                Difference(
                    "tdx-policy-rtmr",
                    f"rtmr{index}",
                    f"RTMR{index} {body.rtmrs[index].hex()} is not among the policy's",
                )
            )
    for reason, name, value, wanted in (
        ("tdx-policy-td-attributes", "td_attributes", body.td_attributes, policy.td_attributes),
        ("tdx-policy-xfam", "xfam", body.xfam, policy.xfam),
        ("tdx-policy-mrconfigid", "mrconfigid", body.mrconfigid, policy.mrconfigid),
        ("tdx-policy-mrowner", "mrowner", body.mrowner, policy.mrowner),
        ("tdx-policy-mrownerconfig", "mrownerconfig", body.mrownerconfig, policy.mrownerconfig),
    ):
        if wanted is not None and value != wanted:
            found.append(Difference(reason, name, f"{name.upper()} is {value.hex()}, the policy wants {wanted.hex()}"))
    allowed("tdx-policy-mrseam", "mrseam", body.mrseam, policy.mrseam)
    if policy.minimum_seam_svn is not None and body.tee_tcb_svn[0] < policy.minimum_seam_svn:
        found.append(
            Difference(
                "tdx-policy-seam-svn",
                "minimum_seam_svn",
                f"the TDX module's SVN (TEE_TCB_SVN byte 0) is {body.tee_tcb_svn[0]} (major version "
                f"{body.tee_tcb_svn[1]}), below the policy's {policy.minimum_seam_svn}",
            )
        )
    if policy.minimum_tee_tcb_svn is not None:
        low = [i for i in range(16) if body.tee_tcb_svn[i] < policy.minimum_tee_tcb_svn[i]]
        if low:
            found.append(
                Difference(
                    "tdx-policy-tee-tcb-svn",
                    "minimum_tee_tcb_svn",
                    f"TEE_TCB_SVN {body.tee_tcb_svn.hex()} is below the policy's {policy.minimum_tee_tcb_svn.hex()} "
                    f"in component(s) {', '.join(map(str, low))}",
                )
            )
    return found


# Event types whose digest is the SHA-384 of the event's data (EV_IPL: GRUB measures its strings without the NUL the
# log keeps): on a failed replay, the ones that contradict their data are the events to name.
_DATA_DIGEST_EVENTS = (
    eventlog.EV_SEPARATOR,
    eventlog.EV_EFI_ACTION,
    eventlog.EV_EFI_VARIABLE_DRIVER_CONFIG,
    eventlog.EV_EFI_VARIABLE_AUTHORITY,
    eventlog.EV_IPL,
    0x80000006,  # EV_EFI_GPT_EVENT
)


def replay_ccel(raw: bytes, rtmrs: tuple[bytes, ...]) -> list[Difference]:
    """Replay the CCEL log (sha384) to RTMR0-3 and compare with the quote's; on a mismatch, name the events."""
    try:
        log = eventlog.parse_ccel(raw)
    except eventlog.EventLogError as exc:
        return [Difference("tdx-rtmr-replay", "event_log", f"the CCEL event log does not parse: {exc}")]
    if "sha384" not in log.banks:
        return [Difference("tdx-rtmr-replay", "event_log", f"the CCEL event log has no sha384 bank ({log.banks})")]
    replayed = [bytes(48)] * RTMR_COUNT
    for event in log.events:
        if not event.measured:
            continue
        if event.pcr not in CCEL_RTMR_OF_INDEX:
            return [
                Difference(
                    "tdx-rtmr-replay",
                    "event_log",
                    f"CCEL event {event.number} ({event.type_name}) extends MR index {event.pcr}, not an RTMR (1-4)",
                )
            ]
        index = CCEL_RTMR_OF_INDEX[event.pcr]
        replayed[index] = hashlib.sha384(replayed[index] + event.digests["sha384"]).digest()
    found = []
    for index in range(RTMR_COUNT):
        if hmac.compare_digest(replayed[index], rtmrs[index]):
            continue
        suspects = [
            f"event {e.number} ({e.type_name} {e.description}".rstrip() + ") digest does not match its data"
            for e in log.events
            if e.measured and CCEL_RTMR_OF_INDEX.get(e.pcr) == index and not _digest_matches_data(e)
        ]
        named = (
            "; ".join(suspects)
            if suspects
            else "no event's digest contradicts its data: an event whose digest the verifier cannot recompute "
            "(an image, a firmware blob, a boot variable) differs, or events are missing"
        )
        found.append(
            Difference(
                "tdx-rtmr-replay",
                f"rtmr{index}",
                f"the CCEL log replays RTMR{index} to {replayed[index].hex()}, the quote has {rtmrs[index].hex()}: "
                f"{named}",
            )
        )
    return found


def _digest_matches_data(event: eventlog.Event) -> bool:
    if event.type not in _DATA_DIGEST_EVENTS:
        return True
    digest = event.digests["sha384"]
    if hashlib.sha384(event.data).digest() == digest:
        return True
    return event.type == eventlog.EV_IPL and hashlib.sha384(event.data.rstrip(b"\x00")).digest() == digest
