"""Intel TDX quotes: real v4/v5/GCE quotes to Intel's root, the CCEL replay, mutations, CRLs, lab-made quotes, policy.

The real evidence is read from ../shared/cvm-evidence/tdx beside the repository (its README gives each file's facts);
lab-made quotes are built here with `cryptography` in Intel's exact layout, signed by a lab-made chain.
"""

from __future__ import annotations

import datetime
import hashlib
import random
import struct
import time
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import eventlog, tdx

REPO = Path(__file__).resolve().parents[5]
EVIDENCE = REPO.parent / "shared" / "cvm-evidence" / "tdx"
needs_evidence = pytest.mark.skipif(
    not EVIDENCE.is_dir(), reason=f"the real TDX evidence is not beside the repository ({EVIDENCE} is absent)"
)
UTC = datetime.timezone.utc
V4_TIME = datetime.datetime(2023, 7, 1, tzinfo=UTC)
V5_TIME = datetime.datetime(2026, 2, 3, tzinfo=UTC)
GCE_TIME = datetime.datetime(2025, 1, 1, tzinfo=UTC)
LAB_TIME = datetime.datetime(2026, 6, 1, tzinfo=UTC)


def _read(name: str) -> bytes:
    return (EVIDENCE / name).read_bytes()


def _raw_mode(raw: bytes) -> bytes:
    """The quote's own report data, for tests about its signatures rather than its binding."""
    return tdx.parse_quote(raw).body.report_data


def _reason(raw: bytes, now: datetime.datetime, policy: tdx.TdxPolicy | None = None, **kwargs) -> str:
    kwargs.setdefault("report_data", bytes(64))
    with pytest.raises(tdx.TdxError) as info:
        tdx.verify(raw, policy or tdx.TdxPolicy(), now=now, **kwargs)
    return info.value.reason


# --- the real quotes -----------------------------------------------------------------------------------------------


@needs_evidence
def test_the_pinned_root_is_intels_sgx_root_ca():
    pinned = x509.load_pem_x509_certificate(tdx.INTEL_SGX_ROOT_CA_PEM.encode())
    assert pinned == x509.load_pem_x509_certificate(_read("trusted_root.pem"))
    assert tdx.TdxPolicy().root_ca == pinned


@needs_evidence
def test_the_production_v4_quote_verifies_to_intels_root_with_intels_crls_at_2023_07_01():
    raw = _read("tdx_prod_quote_SPR_E4.dat")
    result = tdx.verify(
        raw,
        tdx.TdxPolicy(),
        now=V4_TIME,
        report_data=_raw_mode(raw),
        crls=(_read("pckcrl"), _read("rootcrl.der")),
    )
    assert result.ok, result.differences
    assert result.quote_version == 4
    assert result.identity["pck_subject"].endswith("CN=Intel SGX PCK Certificate")
    assert result.identity["fmspc"] == "50806f000000"
    assert set(result.measurements) >= {"MRTD", "RTMR0", "RTMR1", "RTMR2", "RTMR3", "MRSEAM", "TD_ATTRIBUTES", "XFAM"}
    quote = tdx.parse_quote(raw)
    assert quote.unsigned_trailer == len(b"\nextra bytes(only for testing purpose)\n")
    assert len(quote.certification.pck_chain) == 3


@needs_evidence
def test_the_production_v4_quote_is_refused_at_2053_07_01_when_its_chain_has_expired():
    raw = _read("tdx_prod_quote_SPR_E4.dat")
    with pytest.raises(tdx.TdxError, match="not at 2053-07-01") as info:
        tdx.verify(raw, tdx.TdxPolicy(), now=datetime.datetime(2053, 7, 1, tzinfo=UTC), report_data=_raw_mode(raw))
    assert info.value.reason == "tdx-pck-chain"


@needs_evidence
def test_the_v5_quote_verifies_at_2026_02_03_with_its_td_1_5_body():
    raw = _read("quote_v5_sample.dat")
    quote = tdx.parse_quote(raw)
    assert (quote.header.version, quote.body_type) == (5, tdx.BODY_TYPE_TD15)
    assert len(quote.body.tee_tcb_svn2) == 16 and len(quote.body.mrservicetd) == 48
    result = tdx.verify(raw, tdx.TdxPolicy(), now=V5_TIME, report_data=quote.body.report_data)
    assert result.ok, result.differences
    assert result.quote_version == 5
    assert {"TEE_TCB_SVN2", "MRSERVICETD"} <= set(result.measurements)


@needs_evidence
def test_the_gce_quotes_report_data_is_its_nonce_and_its_ccel_replays_to_its_rtmrs():
    raw = _read("ccel/cos-113-tdx-quote.dat")
    policy = tdx.TdxPolicy(event_log="required")
    result = tdx.verify(
        raw, policy, now=GCE_TIME, report_data=_read("ccel/nonce.dat"), event_log=_read("ccel/ccel_data.dat")
    )
    assert result.ok, result.differences
    assert result.report_data == _read("ccel/nonce.dat")
    assert tdx.parse_ccel_table(_read("ccel/ccel_table.dat")) == len(_read("ccel/ccel_data.dat"))


@needs_evidence
def test_the_gce_quote_refuses_another_report_data_and_a_missing_required_log():
    raw = _read("ccel/cos-113-tdx-quote.dat")
    result = tdx.verify(raw, tdx.TdxPolicy(event_log="required"), now=GCE_TIME, report_data=b"\x01" + bytes(63))
    assert [d.reason for d in result.differences] == ["tdx-report-data", "tdx-rtmr-replay"]
    with pytest.raises(tdx.TdxError, match="tdx-report-data: .*not bound to this nonce"):
        result.raise_for_differences()


def _flip_event_digest(log: bytes, number: int) -> tuple[bytes, eventlog.Event]:
    event = eventlog.parse_ccel(log).events[number - 1]
    digest = event.digests["sha384"]
    assert log.count(digest) == 1
    at = log.index(digest)
    return log[:at] + bytes((digest[0] ^ 0x01,)) + log[at + 1 :], event


@needs_evidence
def test_a_flipped_event_digest_is_refused_naming_the_event():
    log = _read("ccel/ccel_data.dat")
    number = next(
        e.number for e in eventlog.parse_ccel(log).events if e.description.startswith("grub_cmd: set timeout")
    )
    flipped, event = _flip_event_digest(log, number)
    result = tdx.verify(
        _read("ccel/cos-113-tdx-quote.dat"),
        tdx.TdxPolicy(),
        now=GCE_TIME,
        report_data=_read("ccel/nonce.dat"),
        event_log=flipped,
    )
    assert [(d.reason, d.field) for d in result.differences] == [("tdx-rtmr-replay", "rtmr2")]
    assert f"event {number} (EV_IPL grub_cmd: set timeout=0) digest does not match its data" in (
        result.differences[0].message
    )
    assert event.pcr == 3  # MR index 3 is RTMR2


@needs_evidence
def test_a_flipped_image_digest_is_refused_and_said_to_be_one_the_verifier_cannot_recompute():
    log = _read("ccel/ccel_data.dat")
    number = next(e.number for e in eventlog.parse_ccel(log).events if e.description.endswith("BOOTX64.EFI"))
    flipped, _event = _flip_event_digest(log, number)
    result = tdx.verify(
        _read("ccel/cos-113-tdx-quote.dat"),
        tdx.TdxPolicy(),
        now=GCE_TIME,
        report_data=_read("ccel/nonce.dat"),
        event_log=flipped,
    )
    assert [(d.reason, d.field) for d in result.differences] == [("tdx-rtmr-replay", "rtmr1")]
    assert "digest the verifier cannot recompute" in result.differences[0].message


@needs_evidence
def test_a_ccel_log_that_does_not_parse_is_a_replay_difference():
    result = tdx.verify(
        _read("ccel/cos-113-tdx-quote.dat"),
        tdx.TdxPolicy(),
        now=GCE_TIME,
        report_data=_read("ccel/nonce.dat"),
        event_log=b"\x00" * 64,
    )
    assert [d.reason for d in result.differences] == ["tdx-rtmr-replay"]
    assert "does not parse" in result.differences[0].message


# --- single-bit mutations of every signed region --------------------------------------------------------------------


def _regions(raw: bytes) -> dict[str, tuple[range, str]]:
    """Byte ranges of the quote by what a flipped bit in them breaks, with the reason expected."""
    quote = tdx.parse_quote(raw)
    signed = len(quote.signed_region)
    signature = signed + 4
    key = signature + 64
    qe_report = key + 64 + 6
    qe_signature = qe_report + 384
    auth = qe_signature + 64 + 2
    body = 48 if quote.header.version == 4 else 54
    return {
        "header fields the parser checks (version, key type, TEE type)": (range(0, 8), "tdx-malformed"),
        "header (SVNs, QE vendor ID, user data)": (range(8, 48), "tdx-signature"),
        "v5 body descriptor (type, size)": (range(48, body), "tdx-malformed"),
        "TD quote body": (range(body, signed), "tdx-signature"),
        "quote signature": (range(signature, signature + 64), "tdx-signature"),
        "attestation key": (range(key, key + 64), "tdx-qe-report"),
        "QE report": (range(qe_report, qe_report + 384), "tdx-qe-report"),
        "QE report signature": (range(qe_signature, qe_signature + 64), "tdx-qe-report"),
        "QE authentication data": (range(auth, auth + len(quote.certification.qe_auth_data)), "tdx-qe-report"),
    }


MUTATED_QUOTES = [("tdx_prod_quote_SPR_E4.dat", V4_TIME), ("quote_v5_sample.dat", V5_TIME)]


@needs_evidence
@pytest.mark.parametrize("name, now", MUTATED_QUOTES, ids=["v4", "v5"])
def test_single_bit_mutations_of_every_signed_region_are_refused_with_the_specific_reason(name, now):
    raw = _read(name)
    tdx.verify(raw, tdx.TdxPolicy(), now=now, report_data=_raw_mode(raw))  # the golden quote verifies
    rng = random.Random(f"{name}-mutations")
    refused: dict[str, int] = {}
    for region, (offsets, reason) in _regions(raw).items():
        for offset in rng.sample(offsets, min(24, len(offsets))):
            bit = rng.randrange(8)
            mutated = raw[:offset] + bytes((raw[offset] ^ (1 << bit),)) + raw[offset + 1 :]
            with pytest.raises(tdx.TdxError) as info:
                tdx.verify(mutated, tdx.TdxPolicy(), now=now, report_data=bytes(64))
            assert info.value.reason == reason, f"{region}: byte {offset} bit {bit}: {info.value}"
            refused[region] = refused.get(region, 0) + 1
    assert set(refused) == {region for region, (offsets, _reason) in _regions(raw).items() if offsets}


@needs_evidence
def test_a_mutated_pck_chain_is_refused():
    raw = _read("tdx_prod_quote_SPR_E4.dat")
    start = raw.index(b"-----BEGIN CERTIFICATE-----")
    rng = random.Random("pck-chain")
    for offset in rng.sample(range(start + 64, start + 3600), 12):
        mutated = raw[:offset] + bytes((raw[offset] ^ 0x01,)) + raw[offset + 1 :]
        assert _reason(mutated, V4_TIME) in ("tdx-malformed", "tdx-pck-chain")


# --- malformed quotes ------------------------------------------------------------------------------------------------


def _patch(raw: bytes, offset: int, value: bytes) -> bytes:
    return raw[:offset] + value + raw[offset + len(value) :]


@needs_evidence
@pytest.mark.parametrize(
    "make, message",
    [
        (lambda q: q[:40], "quote header is truncated"),
        (lambda q: q[:600], "TD quote body is truncated"),
        (lambda q: q[:700], "quote signature data is truncated"),
        (lambda q: _patch(q, 0, struct.pack("<H", 3)), "field 'version' is 3, not 4 or 5"),
        (lambda q: _patch(q, 2, struct.pack("<H", 3)), "field 'attestation_key_type' is 3"),
        (lambda q: _patch(q, 4, struct.pack("<I", 0)), "field 'tee_type' is 0x0, not 0x81"),
        (lambda q: _patch(q, 632 + 4 + 128, struct.pack("<H", 5)), "certification data field 'type' is 5, not 6"),
        (lambda q: _patch(q, 632 + 4 + 130, struct.pack("<I", 9)), "certification data field 'size' is 9"),
        (lambda q: _patch(q, 632, struct.pack("<I", 100)), "quote signature data is truncated"),
        (lambda q: _patch(q, 632 + 4 + 134 + 448, struct.pack("<H", 60000)), "'qe_auth_data' is truncated"),
        (lambda q: _patch(q, 632 + 4 + 134 + 450 + 32, struct.pack("<H", 3)), "PCK certification data field 'type'"),
        (lambda q: q + bytes(tdx.MAX_QUOTE_BYTES), "larger than"),
        (lambda q: q.decode("latin-1"), "must be bytes"),
    ],
    ids=[
        "short header",
        "short body",
        "no signature data",
        "version 3",
        "key type 3",
        "not TDX",
        "certification type 5",
        "certification size",
        "signature data length",
        "auth data size",
        "PCK chain type",
        "too large",
        "text",
    ],
)
def test_malformed_v4_quotes_are_refused_naming_the_field(make, message):
    with pytest.raises(tdx.TdxError, match=message) as info:
        tdx.parse_quote(make(_read("tdx_prod_quote_SPR_E4.dat")))
    assert info.value.reason == "tdx-malformed"


@needs_evidence
@pytest.mark.parametrize(
    "offset, value, message",
    [
        (48, struct.pack("<H", 4), "body descriptor field 'type' is 4, not 2 or 3"),
        (50, struct.pack("<I", 584), "field 'size' is 584, a body of type 3 is 648 bytes"),
    ],
    ids=["body type 4", "body size"],
)
def test_malformed_v5_body_descriptors_are_refused_naming_the_field(offset, value, message):
    with pytest.raises(tdx.TdxError, match=message):
        tdx.parse_quote(_patch(_read("quote_v5_sample.dat"), offset, value))


# --- CRLs ------------------------------------------------------------------------------------------------------


@needs_evidence
def test_intels_crls_are_checked_for_signature_and_time():
    raw = _read("tdx_prod_quote_SPR_E4.dat")
    pck_crl = x509.load_der_x509_crl(_read("pckcrl"))
    assert pck_crl.issuer.rfc4514_string().endswith("CN=Intel SGX PCK Platform CA")
    # the platform CA's CRL is current 2023-06-08 to 2023-07-08: after that it is stale, though the PCK is valid
    stale = datetime.datetime(2023, 7, 9, tzinfo=UTC)
    tdx.verify(raw, tdx.TdxPolicy(), now=stale, report_data=_raw_mode(raw))
    with pytest.raises(tdx.TdxError, match="CRL of .*Platform CA' is current 2023-06-08 to 2023-07-08") as info:
        tdx.verify(raw, tdx.TdxPolicy(), now=stale, report_data=_raw_mode(raw), crls=(_read("pckcrl"),))
    assert info.value.reason == "tdx-crl"
    # a CRL in the platform CA's name signed by another key is refused
    forged = _crl(pck_crl.issuer, ec.generate_private_key(ec.SECP256R1()), V4_TIME, revoked=())
    with pytest.raises(tdx.TdxError, match="is not signed by that CA") as info:
        tdx.verify(raw, tdx.TdxPolicy(), now=V4_TIME, report_data=_raw_mode(raw), crls=(forged,))
    assert info.value.reason == "tdx-crl"
    with pytest.raises(tdx.TdxError, match="CRL does not parse"):
        tdx.verify(raw, tdx.TdxPolicy(), now=V4_TIME, report_data=_raw_mode(raw), crls=(b"not a CRL",))


@needs_evidence
def test_a_policy_that_requires_crls_refuses_a_quote_without_them():
    raw = _read("tdx_prod_quote_SPR_E4.dat")
    policy = tdx.TdxPolicy(require_crls=True)
    with pytest.raises(tdx.TdxError, match="no CRL of .*Platform CA' was given"):
        tdx.verify(raw, policy, now=V4_TIME, report_data=_raw_mode(raw))
    policy = tdx.TdxPolicy.from_dict(
        {"require_crls": True, "crls": [_pem_crl(_read("pckcrl")), _pem_crl(_read("rootcrl.der"))]}
    )
    assert tdx.verify(raw, policy, now=V4_TIME, report_data=_raw_mode(raw)).ok


def _pem_crl(der: bytes) -> str:
    return x509.load_der_x509_crl(der).public_bytes(serialization.Encoding.PEM).decode()


# --- lab-made quotes, signed by a lab-made chain ---------------------------------------------------------------------


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(subject, key, issuer, issuer_key, *, ca: bool, serial: int) -> x509.Certificate:
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(LAB_TIME - datetime.timedelta(days=30))
        .not_valid_after(LAB_TIME + datetime.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    return builder.sign(issuer_key, hashes.SHA256())


def _crl(issuer: x509.Name, key, now: datetime.datetime, revoked: tuple[int, ...]) -> bytes:
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(issuer)
        .last_update(now - datetime.timedelta(days=1))
        .next_update(now + datetime.timedelta(days=29))
    )
    for serial in revoked:
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(now).build()
        )
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.DER)


class LabChain:
    """A root, a PCK CA and a PCK leaf made here: the shape of Intel's chain without Intel's keys."""

    def __init__(self) -> None:
        self.root_key = ec.generate_private_key(ec.SECP256R1())
        self.ca_key = ec.generate_private_key(ec.SECP256R1())
        self.pck_key = ec.generate_private_key(ec.SECP256R1())
        self.root = _certificate(
            _name("Lab SGX Root CA"), self.root_key, _name("Lab SGX Root CA"), self.root_key, ca=True, serial=1
        )
        self.ca = _certificate(
            _name("Lab SGX PCK Platform CA"), self.ca_key, self.root.subject, self.root_key, ca=True, serial=2
        )
        self.pck = _certificate(
            _name("Lab SGX PCK Certificate"), self.pck_key, self.ca.subject, self.ca_key, ca=False, serial=0x5CC
        )

    @property
    def policy(self) -> tdx.TdxPolicy:
        return tdx.TdxPolicy(root_ca=self.root)

    def pem(self) -> bytes:
        return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in (self.pck, self.ca, self.root)) + b"\x00"


def _raw_signature(key: ec.EllipticCurvePrivateKey, message: bytes) -> bytes:
    r, s = decode_dss_signature(key.sign(message, ec.ECDSA(hashes.SHA256())))
    return r.to_bytes(32, "big") + s.to_bytes(32, "big")


def lab_quote(
    chain: LabChain,
    *,
    report_data: bytes = bytes(64),
    td_attributes: bytes = bytes(8),
    mrtd: bytes = b"\x11" * 48,
    version: int = 4,
    qe_mrsigner: bytes = tdx.TD_QE_MRSIGNER,
    qe_isv_prod_id: int = tdx.TD_QE_ISV_PROD_ID,
) -> bytes:
    """A TDX quote in Intel's layout (v4, or v5 with a TD 1.0 body), its QE report signed by the lab PCK."""
    header = struct.pack("<HHIHH16s20s", version, 2, 0x81, 7, 13, b"\x93\x9a\x72\x33" + bytes(12), bytes(20))
    rtmrs = [bytes((0x20 + i,)) * 48 for i in range(4)]
    body = struct.pack(
        "<16s48s48s8s8s8s48s48s48s48s48s48s48s48s64s",
        bytes((3, 1)) + bytes(14),
        b"\x5e" * 48,
        bytes(48),
        bytes(8),
        td_attributes,
        bytes.fromhex("e71a060000000000"),
        mrtd,
        bytes(48),
        bytes(48),
        bytes(48),
        *rtmrs,
        report_data,
    )
    signed = header + (struct.pack("<HI", 2, len(body)) if version == 5 else b"") + body
    attestation_key = ec.generate_private_key(ec.SECP256R1())
    numbers = attestation_key.public_key().public_numbers()
    key_raw = numbers.x.to_bytes(32, "big") + numbers.y.to_bytes(32, "big")
    auth_data = bytes(range(32))
    qe_report = bytearray(384)
    qe_report[48:64] = bytes.fromhex("15000000000000000700000000000000")  # ATTRIBUTES as Intel's QE has them
    qe_report[128:160] = qe_mrsigner
    qe_report[256:260] = struct.pack("<HH", qe_isv_prod_id, 4)
    qe_report[320:384] = hashlib.sha256(key_raw + auth_data).digest() + bytes(32)
    qe_report = bytes(qe_report)
    chain_pem = chain.pem()
    inner = (
        qe_report
        + _raw_signature(chain.pck_key, qe_report)
        + struct.pack("<H", len(auth_data))
        + auth_data
        + struct.pack("<HI", 5, len(chain_pem))
        + chain_pem
    )
    signature_data = _raw_signature(attestation_key, signed) + key_raw + struct.pack("<HI", 6, len(inner)) + inner
    return signed + struct.pack("<I", len(signature_data)) + signature_data


@pytest.fixture(scope="module")
def chain() -> LabChain:
    return LabChain()


def test_a_lab_made_quote_verifies_to_its_lab_root_and_binds_nonce_and_user_data(chain):
    nonce, user_data = bytes(range(32)), b"ephemeral public key"
    for version in (4, 5):
        raw = lab_quote(chain, report_data=tdx.expected_report_data(nonce, user_data), version=version)
        result = tdx.verify(raw, chain.policy, now=LAB_TIME, nonce=nonce, user_data=user_data)
        assert result.ok, result.differences
        assert result.identity == {
            "pck_sha256": chain.pck.fingerprint(hashes.SHA256()).hex(),
            "pck_subject": "CN=Lab SGX PCK Certificate",
        }
        other = tdx.verify(raw, chain.policy, now=LAB_TIME, nonce=bytes(32), user_data=user_data)
        assert [d.reason for d in other.differences] == ["tdx-report-data"]


def test_the_report_data_is_sha512_of_nonce_and_sha256_of_user_data():
    nonce, user_data = b"\x01" * 32, b"key"
    assert (
        tdx.expected_report_data(nonce, user_data)
        == hashlib.sha512(nonce + hashlib.sha256(user_data).digest()).digest()
    )


def test_a_lab_quote_is_refused_by_intels_pinned_root(chain):
    assert _reason(lab_quote(chain), LAB_TIME) == "tdx-pck-chain"


def test_the_debug_attribute_is_refused(chain):
    raw = lab_quote(chain, td_attributes=struct.pack("<Q", tdx.TD_ATTRIBUTES_DEBUG))
    result = tdx.verify(raw, chain.policy, now=LAB_TIME, report_data=bytes(64))
    assert [d.reason for d in result.differences] == ["tdx-policy-debug"]
    with pytest.raises(tdx.TdxError, match="tdx-policy-debug: .*DEBUG bit set"):
        result.raise_for_differences()


def test_a_revoked_pck_is_refused_and_an_unrevoked_one_passes(chain):
    raw = lab_quote(chain)
    revoking = _crl(chain.ca.subject, chain.ca_key, LAB_TIME, revoked=(chain.pck.serial_number,))
    with pytest.raises(
        tdx.TdxError, match="serial 5cc\\) is revoked by the CRL of 'CN=Lab SGX PCK Platform CA'"
    ) as info:
        tdx.verify(raw, chain.policy, now=LAB_TIME, report_data=bytes(64), crls=(revoking,))
    assert info.value.reason == "tdx-crl"
    revoked_ca = _crl(chain.root.subject, chain.root_key, LAB_TIME, revoked=(chain.ca.serial_number,))
    assert _reason(raw, LAB_TIME, chain.policy, crls=(revoked_ca,)) == "tdx-crl"
    clean = _crl(chain.ca.subject, chain.ca_key, LAB_TIME, revoked=(0x999,))
    assert tdx.verify(raw, chain.policy, now=LAB_TIME, report_data=bytes(64), crls=(clean,)).ok


def test_a_qe_report_of_another_enclave_is_refused(chain):
    other_signer = lab_quote(chain, qe_mrsigner=b"\x42" * 32)
    with pytest.raises(tdx.TdxError, match="not Intel's TDX Quoting Enclave's: MRSIGNER 4242") as info:
        tdx.verify(other_signer, chain.policy, now=LAB_TIME, report_data=bytes(64))
    assert info.value.reason == "tdx-qe-report"
    assert _reason(lab_quote(chain, qe_isv_prod_id=1), LAB_TIME, chain.policy) == "tdx-qe-report"
    lab_qe = tdx.TdxPolicy(root_ca=chain.root, qe_mrsigner=b"\x42" * 32)
    assert tdx.verify(other_signer, lab_qe, now=LAB_TIME, report_data=bytes(64)).ok


@needs_evidence
def test_a_minimum_qe_svn_above_the_quotes_is_refused():
    raw = _read("tdx_prod_quote_SPR_E4.dat")  # its QE's ISVSVN is 4
    assert tdx.verify(raw, tdx.TdxPolicy(minimum_qe_isv_svn=4), now=V4_TIME, report_data=_raw_mode(raw)).ok
    with pytest.raises(tdx.TdxError, match="ISVSVN 4 is below the policy's 5"):
        tdx.verify(raw, tdx.TdxPolicy.from_dict({"minimum_qe_isv_svn": 5}), now=V4_TIME, report_data=_raw_mode(raw))


def test_a_chain_whose_leaf_is_not_signed_by_its_ca_is_refused(chain):
    other = LabChain()
    mixed = LabChain.__new__(LabChain)
    mixed.__dict__.update(chain.__dict__, pck=other.pck, pck_key=other.pck_key)
    with pytest.raises(tdx.TdxError, match="PCK leaf 'CN=Lab SGX PCK Certificate' is not signed by") as info:
        tdx.verify(lab_quote(mixed), chain.policy, now=LAB_TIME, report_data=bytes(64))
    assert info.value.reason == "tdx-pck-chain"


# --- the policy -----------------------------------------------------------------------------------------------------


@needs_evidence
def test_a_policy_of_the_quotes_own_values_passes_and_every_difference_is_collected():
    raw = _read("ccel/cos-113-tdx-quote.dat")
    m = tdx.parse_quote(raw).body
    own = {
        "mrtd": [m.mrtd.hex()],
        "rtmrs": {str(i): m.rtmrs[i].hex() for i in range(4)},
        "event_log": "required",
        "td_attributes": m.td_attributes.hex(),
        "xfam": m.xfam.hex(),
        "mrseam": m.mrseam.hex(),
        "minimum_seam_svn": m.tee_tcb_svn[0],
        "minimum_tee_tcb_svn": m.tee_tcb_svn.hex(),
        "mrconfigid": m.mrconfigid.hex(),
        "mrowner": m.mrowner.hex(),
        "mrownerconfig": m.mrownerconfig.hex(),
    }
    kwargs = {"now": GCE_TIME, "report_data": _read("ccel/nonce.dat"), "event_log": _read("ccel/ccel_data.dat")}
    assert tdx.verify(raw, tdx.TdxPolicy.from_dict(own), **kwargs).ok
    wrong = dict(
        own,
        mrtd=["aa" * 48, "bb" * 48],
        rtmrs={"1": "cc" * 48},
        td_attributes="00" * 8,
        xfam="ff" * 8,
        mrseam="dd" * 48,
        minimum_seam_svn=m.tee_tcb_svn[0] + 1,
        minimum_tee_tcb_svn="ff" * 16,
        mrconfigid="01" * 48,
        mrowner="02" * 48,
        mrownerconfig="03" * 48,
    )
    result = tdx.verify(raw, tdx.TdxPolicy.from_dict(wrong), **kwargs)
    assert [d.reason for d in result.differences] == [
        "tdx-policy-mrtd",
        "tdx-policy-rtmr",
        "tdx-policy-td-attributes",
        "tdx-policy-xfam",
        "tdx-policy-mrconfigid",
        "tdx-policy-mrowner",
        "tdx-policy-mrownerconfig",
        "tdx-policy-mrseam",
        "tdx-policy-seam-svn",
        "tdx-policy-tee-tcb-svn",
    ]
    with pytest.raises(tdx.TdxError) as info:
        result.raise_for_differences()
    assert info.value.reason == "tdx-policy-mrtd" and "TEE_TCB_SVN" in str(info.value)


@pytest.mark.parametrize(
    "document, message",
    [
        ({"mrtdd": "00"}, "unknown field"),
        ({1: "00", "x": "00"}, r"unknown field\(s\) 1, x"),
        ({"root_ca": 5}, "'root_ca' must be a PEM certificate"),
        ({"mrtd": "zz"}, "'mrtd' must be 48 bytes in hex"),
        ({"mrtd": []}, "'mrtd' is an empty list"),
        ({"xfam": "00" * 4}, "'xfam' must be 8 bytes"),
        ({"xfam": ["00" * 8]}, "'xfam' takes one value"),
        ({"rtmrs": {"4": "00" * 48}}, "names RTMR '4'"),
        ({"rtmrs": ["00"]}, "'rtmrs' must map"),
        ({"event_log": "yes"}, "'event_log' must be"),
        ({"minimum_seam_svn": 256}, "'minimum_seam_svn' must be an integer 0-255"),
        ({"minimum_qe_isv_svn": -1}, "'minimum_qe_isv_svn' must be an integer"),
        ({"qe_mrsigner": "00" * 48}, "'qe_mrsigner' must be 32 bytes"),
        ({"minimum_seam_svn": True}, "'minimum_seam_svn' must be an integer"),
        ({"root_ca": "not PEM"}, "'root_ca' is not a PEM certificate"),
        ({"crls": "x"}, "'crls' must be a list"),
        ({"crls": ["%%"]}, "neither PEM nor base64"),
        ({"require_crls": "yes"}, "'require_crls' must be true or false"),
        ([], "must be a mapping"),
    ],
    ids=lambda value: str(value)[:30],
)
def test_a_bad_policy_is_refused_naming_the_field(document, message):
    with pytest.raises(tdx.TdxError, match=message) as info:
        tdx.TdxPolicy.from_dict(document)
    assert info.value.reason == "tdx-policy-invalid"


def test_report_data_modes_are_exclusive_and_sized(chain):
    raw = lab_quote(chain)
    with pytest.raises(ValueError, match="not both"):
        tdx.verify(raw, chain.policy, now=LAB_TIME, nonce=bytes(32), user_data=b"", report_data=bytes(64))
    with pytest.raises(ValueError, match="64 bytes"):
        tdx.verify(raw, chain.policy, now=LAB_TIME, report_data=bytes(32))
    with pytest.raises(ValueError, match="are needed"):
        tdx.verify(raw, chain.policy, now=LAB_TIME)


@needs_evidence
def test_a_ccel_table_of_another_cc_type_is_refused():
    table = bytearray(_read("ccel/ccel_table.dat"))
    table[36] = 1
    table[9] = (table[9] + 1) % 256  # keep the checksum
    with pytest.raises(tdx.TdxError, match="'cc_type' is 1, not 2"):
        tdx.parse_ccel_table(bytes(table))


@needs_evidence
def test_time_one_verification():
    raw = _read("ccel/cos-113-tdx-quote.dat")
    kwargs = {"now": GCE_TIME, "report_data": _read("ccel/nonce.dat"), "event_log": _read("ccel/ccel_data.dat")}
    start = time.perf_counter()
    result = tdx.verify(raw, tdx.TdxPolicy(event_log="required"), **kwargs)
    elapsed = time.perf_counter() - start
    assert result.ok
    print(f"one TDX verification (GCE quote, PCK chain, QE report, CCEL replay of 43 events): {elapsed * 1000:.1f} ms")


# --- the documentation ----------------------------------------------------------------------------------------------

DOC = REPO / "docs" / "cvm.md"


def _doc_section() -> str:
    text = DOC.read_text()
    start = text.index("## Intel TDX")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_the_docs_list_every_policy_field():
    section = _doc_section()
    for name in tdx._POLICY_FIELDS:
        assert f"`{name}`" in section, f"docs/cvm.md's Intel TDX section does not explain '{name}'"
    for reason in tdx.REASONS:
        assert reason in section, f"docs/cvm.md's Intel TDX section does not name {reason}"


@needs_evidence
def test_the_docs_example_policy_is_read_and_passes_the_gce_quote_it_was_made_from():
    block = _doc_section().split("```yaml\n", 1)[1].split("```", 1)[0]
    document = yaml.safe_load(block)["tdx"]
    assert set(document) | {"root_ca"} == set(tdx._POLICY_FIELDS)
    result = tdx.verify(
        _read("ccel/cos-113-tdx-quote.dat"),
        tdx.TdxPolicy.from_dict(document),
        now=GCE_TIME,
        report_data=_read("ccel/nonce.dat"),
        event_log=_read("ccel/ccel_data.dat"),
    )
    assert result.ok, result.differences


@needs_evidence
@pytest.mark.parametrize("name, now", MUTATED_QUOTES, ids=["v4", "v5"])
def test_every_truncation_and_random_corruption_is_a_tdx_error_never_another_exception(name, now):
    raw = _read(name)
    end = len(raw) - tdx.parse_quote(raw).unsigned_trailer
    for length in sorted({*range(0, end, 5), *range(end - 64, end)}):
        with pytest.raises(tdx.TdxError):
            tdx.parse_quote(raw[:length])
    rng = random.Random(f"{name}-corruption")
    for _case in range(200):
        corrupted = bytearray(raw)
        for _flip in range(rng.randrange(1, 4)):
            corrupted[rng.randrange(len(corrupted))] ^= 1 << rng.randrange(8)
        try:
            tdx.verify(bytes(corrupted), tdx.TdxPolicy(), now=now, report_data=bytes(64))
        except tdx.TdxError:
            pass
