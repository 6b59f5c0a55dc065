"""Malformed evidence documents: each is refused with a message naming the problem, never a crash.

The mutations start from one real swtpm quote (made once per module) so that every
case is valid up to the one thing it breaks.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import struct

import pytest
from cryptography import x509
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import issuer, tpm2
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.eventlog import MAX_EVENT_LOG_BYTES
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.evidence import (
    MAX_DOCUMENT_BYTES,
    EvidenceError,
    parse_evidence,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import (
    MeasurementPolicy,
    PcrRule,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.verifier import (
    VerificationError,
    Verifier,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.seal import EphemeralKey

POLICY_PCRS = (0, 4, 8, 9, 15)
BASE64_FIELDS = ("ak_public", "quote", "signature", "user_data", "ek_public", "ek_certificate")
FIELD_LIMITS = {
    "ak_public": 1024,
    "quote": 1024,
    "signature": 1024,
    "user_data": 4096,
    "ek_public": 1024,
    "ek_certificate": 8192,
}
REQUIRED_FIELDS = ("version", "variant", "ak_public", "quote", "signature", "pcrs", "user_data")


class Golden:
    """One genuine quote, its nonce, a policy it satisfies and a verifier for that policy."""

    def __init__(self, swtpm):
        self.nonce = os.urandom(32)
        with issuer.Tpm(swtpm.tcti) as tpm:
            self.evidence = issuer.issue_evidence(tpm, self.nonce, EphemeralKey.generate().public_bytes())
        values = self.evidence.pcrs["sha256"]
        self.policy = MeasurementPolicy("sha256", {i: PcrRule(i, (values[i],)) for i in POLICY_PCRS}, "pcrs-only")
        self.verifier = Verifier(self.policy)
        self.ca_certificates = x509.load_pem_x509_certificates(swtpm.ca_pem)

    def document(self) -> dict:
        return copy.deepcopy(self.evidence.to_document())

    def json(self) -> str:
        return self.evidence.to_json()


@pytest.fixture(scope="module")
def golden(manufactured_tpms):
    # The swtpm fixture is per test; a module-wide golden keeps 200+ cases and the fuzzing fast.
    manufactured = manufactured_tpms["lab"]
    swtpm_instance = type(manufactured).__init__.__globals__[
        "SwtpmInstance"
    ]  # conftest modules are not importable by name
    instance = swtpm_instance(manufactured)
    try:
        yield Golden(instance)
    finally:
        instance.stop()


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _with(doc: dict, **fields) -> dict:
    doc.update(fields)
    return doc


def _without(doc: dict, name: str) -> dict:
    del doc[name]
    return doc


def _with_pcrs(doc: dict, pcrs) -> dict:
    doc["pcrs"] = pcrs
    return doc


def _with_pcr(doc: dict, bank: str, index: str, value) -> dict:
    doc["pcrs"].setdefault(bank, {})[index] = value
    return doc


def _replace_raw(doc: dict, name: str, change) -> dict:
    doc[name] = _b64(change(base64.b64decode(doc[name])))
    return doc


def _assert_refused(golden, document, message: str) -> None:
    """parse_evidence raises EvidenceError naming the problem; Verifier.verify says 'malformed' with the same words."""
    with pytest.raises(EvidenceError) as parse_error:
        parse_evidence(copy.deepcopy(document))
    assert message in str(parse_error.value)
    with pytest.raises(VerificationError) as verify_error:
        golden.verifier.verify(copy.deepcopy(document), golden.nonce)
    assert verify_error.value.reason == "malformed"
    assert message in str(verify_error.value)


def test_golden_document_verifies_as_text_bytes_and_object(golden):
    for document in (golden.json(), golden.json().encode(), golden.document()):
        assert golden.verifier.verify(document, golden.nonce).to_result()["verified"] is True


# Whole-document shape: (case, document from the golden JSON text, message).
DOCUMENT_CASES = [
    ("truncated JSON", lambda g: g.json()[: len(g.json()) // 2], "not valid JSON"),
    ("truncated JSON bytes", lambda g: g.json().encode()[:-1], "not valid JSON"),
    ("empty text", lambda g: "", "not valid JSON"),
    ("trailing garbage", lambda g: g.json() + "}", "not valid JSON"),
    ("single quotes", lambda g: g.json().replace('"', "'"), "not valid JSON"),
    ("deeply nested", lambda g: "[" * 30000 + "]" * 30000, "more than 32 objects and arrays"),
    ("not UTF-8", lambda g: g.json().encode()[:-2] + b"\xff}", "not UTF-8"),
    (
        "oversized bytes",
        lambda g: g.json().encode() + b" " * (MAX_DOCUMENT_BYTES + 1 - len(g.json())),
        f"larger than {MAX_DOCUMENT_BYTES} bytes",
    ),
    (
        "oversized text",
        lambda g: g.json() + " " * (MAX_DOCUMENT_BYTES + 1 - len(g.json())),
        f"larger than {MAX_DOCUMENT_BYTES} bytes",
    ),
    ("oversized junk", lambda g: b"\x00" * (10 * MAX_DOCUMENT_BYTES), f"larger than {MAX_DOCUMENT_BYTES} bytes"),
    ("JSON list", lambda g: "[" + g.json() + "]", "must be a JSON object, got list"),
    ("JSON int", lambda g: "1", "must be a JSON object, got int"),
    ("JSON null", lambda g: "null", "must be a JSON object, got NoneType"),
    ("JSON string", lambda g: json.dumps(g.json()), "must be a JSON object, got str"),
    ("object list", lambda g: [g.document()], "must be a JSON object, got list"),
    ("object int", lambda g: 1, "must be a JSON object, got int"),
    ("object None", lambda g: None, "must be a JSON object, got NoneType"),
    ("object float", lambda g: 1.0, "must be a JSON object, got float"),
]


@pytest.mark.parametrize("make,message", [c[1:] for c in DOCUMENT_CASES], ids=[c[0] for c in DOCUMENT_CASES])
def test_malformed_document_is_refused(golden, make, message):
    _assert_refused(golden, make(golden), message)


def test_document_of_exactly_the_size_limit_is_accepted(golden):
    text = golden.json() + " " * (MAX_DOCUMENT_BYTES - len(golden.json()))
    assert len(text.encode()) == MAX_DOCUMENT_BYTES
    assert golden.verifier.verify(text.encode(), golden.nonce).to_result()["verified"] is True
    assert golden.verifier.verify(text, golden.nonce).to_result()["verified"] is True


def test_text_document_over_the_byte_limit_in_utf8_is_refused(golden):
    doc = golden.document()
    doc["event_log"] = "\u20ac" * (MAX_DOCUMENT_BYTES // 2)  # 3 UTF-8 bytes per character
    text = json.dumps(doc, ensure_ascii=False)
    assert len(text) < MAX_DOCUMENT_BYTES < len(text.encode())
    _assert_refused(golden, text, f"larger than {MAX_DOCUMENT_BYTES} bytes")


# Found by a review (issue 14): each raised from parse_evidence instead of a refusal.
def _long_text_with_a_lone_surrogate(golden) -> str:
    text = golden.json()
    padded = text[:-1] + ", " + '"pad": "' + "x" * (MAX_DOCUMENT_BYTES // 4) + '"}'
    assert len(padded) > MAX_DOCUMENT_BYTES // 4
    return padded.replace('"pad": "x', '"pad": "\ud800', 1)


LONE_SURROGATE_CASES = [
    (
        "text over 16,384 characters",
        _long_text_with_a_lone_surrogate,
        "not valid Unicode text (a lone surrogate at character",
    ),
    ("short text", lambda g: g.json()[:-1] + ', "\udfff": 1}', "not valid Unicode text (a lone surrogate at character"),
    (
        "in a value of an object",
        lambda g: _with(g.document(), variant="tpm\ud800"),
        "holds text that is not valid Unicode",
    ),
    ("in a key of an object", lambda g: _with(g.document(), **{"\udc80": "x"}), "holds text that is not valid Unicode"),
]


@pytest.mark.parametrize(
    "make,message", [c[1:] for c in LONE_SURROGATE_CASES], ids=[c[0] for c in LONE_SURROGATE_CASES]
)
def test_lone_surrogate_is_refused(golden, make, message):
    _assert_refused(golden, make(golden), message)


def test_unknown_keys_of_mixed_types_are_named_as_text(golden):
    # A dict from YAML may have integer, null or date keys beside strings; they cannot be sorted together.
    doc = golden.document()
    doc.update({1: "x", None: "y", "extra": "z", 2.5: "w"})
    _assert_refused(golden, doc, "unknown field(s): 1, 2.5, None, extra")


@pytest.mark.parametrize("name", REQUIRED_FIELDS)
def test_missing_required_field_is_named(golden, name):
    _assert_refused(golden, _without(golden.document(), name), f"lacks field(s): {name}")


def test_all_missing_fields_are_named(golden):
    _assert_refused(golden, {"version": 1}, "lacks field(s): variant, ak_public, quote, signature, pcrs, user_data")


@pytest.mark.parametrize("name", ["extra", "Version", "nonce"])
def test_unknown_field_is_named(golden, name):
    _assert_refused(golden, _with(golden.document(), **{name: "x"}), f"unknown field(s): {name}")


@pytest.mark.parametrize("version", [2, 0, -1, "1", True, None, 1.5, [1], {"major": 1}], ids=repr)
def test_unsupported_version_is_refused(golden, version):
    _assert_refused(
        golden,
        _with(golden.document(), version=version),
        f"evidence version {version!r} is not supported (expected 1, an integer)",
    )


@pytest.mark.parametrize("variant", ["sgx", "TPM", "", None, 1, ["tpm"]], ids=repr)
def test_unknown_variant_is_refused(golden, variant):
    _assert_refused(
        golden,
        _with(golden.document(), variant=variant),
        f"evidence variant {variant!r} is not supported (known: tpm, sev-snp, tdx)",
    )


@pytest.mark.parametrize(
    "variant, message",
    [
        ("sev-snp", "lacks field(s): report, certificate"),
        ("tdx", "has unknown field(s): ak_public, ek_certificate, ek_public, pcrs, signature"),
    ],
)
def test_a_tpm_body_under_another_variants_name_is_refused_naming_the_fields(golden, variant, message):
    _assert_refused(golden, _with(golden.document(), variant=variant), message)


BAD_BASE64 = [
    ("not base64", "!!!!", "is not valid base64"),
    ("missing padding", "QUJ", "is not valid base64"),
    ("padding inside", "QU=J", "is not valid base64"),
    ("padding only", "====", "is not valid base64"),
    ("one character", "Q", "is not valid base64"),
    ("embedded newline", "QUJD\nRA==", "is not valid base64"),
    ("URL-safe alphabet", "-_-_", "is not valid base64"),
    ("non-ASCII", "QUJD\u00e9", "is not valid base64"),
    ("empty", "", "is empty"),
    ("integer", 123, "must be a base64 string, got int"),
    ("list", ["QUJD"], "must be a base64 string, got list"),
    ("object", {"b64": "QUJD"}, "must be a base64 string, got dict"),
    ("boolean", True, "must be a base64 string, got bool"),
]


@pytest.mark.parametrize("name", BASE64_FIELDS)
@pytest.mark.parametrize("value,message", [c[1:] for c in BAD_BASE64], ids=[c[0] for c in BAD_BASE64])
def test_bad_base64_field_is_named(golden, name, value, message):
    _assert_refused(golden, _with(golden.document(), **{name: value}), f"evidence field {name!r} {message}")


@pytest.mark.parametrize("name", ["ak_public", "quote", "signature", "user_data"])
def test_null_required_base64_field_is_named(golden, name):
    _assert_refused(
        golden,
        _with(golden.document(), **{name: None}),
        f"evidence field {name!r} must be a base64 string, got NoneType",
    )


@pytest.mark.parametrize("name", BASE64_FIELDS)
def test_oversized_base64_field_is_named(golden, name):
    doc = _with(golden.document(), **{name: _b64(b"\x01" * (FIELD_LIMITS[name] + 64))})
    _assert_refused(golden, doc, f"evidence field {name!r} is larger than {FIELD_LIMITS[name]} bytes")


@pytest.mark.parametrize("name", ["ek_public", "ek_certificate"])
def test_null_optional_field_counts_as_absent(golden, name):
    assert getattr(parse_evidence(_with(golden.document(), **{name: None})), name) is None


PCR_CASES = [
    ("pcrs a list", lambda d: _with_pcrs(d, [d["pcrs"]["sha256"]]), "'pcrs' must be a non-empty object"),
    ("pcrs a string", lambda d: _with_pcrs(d, "sha256"), "'pcrs' must be a non-empty object"),
    ("pcrs null", lambda d: _with_pcrs(d, None), "'pcrs' must be a non-empty object"),
    ("pcrs empty", lambda d: _with_pcrs(d, {}), "'pcrs' must be a non-empty object"),
    (
        "unknown bank",
        lambda d: _with_pcrs(d, {"sha3_256": d["pcrs"]["sha256"]}),
        "PCR bank 'sha3_256' is not one of sha1, sha256, sha384, sha512",
    ),
    ("upper-case bank", lambda d: _with_pcrs(d, {"SHA256": d["pcrs"]["sha256"]}), "PCR bank 'SHA256' is not one of"),
    (
        "second bank unknown",
        lambda d: _with_pcrs(d, {"sha256": d["pcrs"]["sha256"], "md5": {}}),
        "PCR bank 'md5' is not one of",
    ),
    (
        "bank a list",
        lambda d: _with_pcrs(d, {"sha256": list(d["pcrs"]["sha256"].values())}),
        "PCR bank 'sha256' must be an object of index -> value",
    ),
    ("bank null", lambda d: _with_pcrs(d, {"sha256": None}), "PCR bank 'sha256' must be an object of index -> value"),
    (
        "index 24",
        lambda d: _with_pcr(d, "sha256", "24", d["pcrs"]["sha256"]["0"]),
        "PCR index '24' in bank 'sha256' is not 0..23",
    ),
    (
        "index -1",
        lambda d: _with_pcr(d, "sha256", "-1", d["pcrs"]["sha256"]["0"]),
        "PCR index '-1' in bank 'sha256' is not 0..23",
    ),
    (
        "index x",
        lambda d: _with_pcr(d, "sha256", "x", d["pcrs"]["sha256"]["0"]),
        "PCR index 'x' in bank 'sha256' is not 0..23",
    ),
    (
        "index empty",
        lambda d: _with_pcr(d, "sha256", "", d["pcrs"]["sha256"]["0"]),
        "PCR index '' in bank 'sha256' is not 0..23",
    ),
    (
        "index 1.0",
        lambda d: _with_pcr(d, "sha256", "1.0", d["pcrs"]["sha256"]["0"]),
        "PCR index '1.0' in bank 'sha256' is not 0..23",
    ),
    (
        "index with space",
        lambda d: _with_pcr(d, "sha256", " 1", d["pcrs"]["sha256"]["0"]),
        "PCR index ' 1' in bank 'sha256' is not 0..23",
    ),
    (
        "value 31 bytes",
        lambda d: _with_pcr(d, "sha256", "0", _b64(bytes(31))),
        "PCR sha256:0 has 31 bytes, expected 32",
    ),
    (
        "value 33 bytes",
        lambda d: _with_pcr(d, "sha256", "7", _b64(bytes(33))),
        "PCR sha256:7 has 33 bytes, expected 32",
    ),
    (
        "sha1 value in sha256 bank",
        lambda d: _with_pcr(d, "sha256", "15", _b64(bytes(20))),
        "PCR sha256:15 has 20 bytes, expected 32",
    ),
    (
        "sha1 bank value 21 bytes",
        lambda d: _with_pcr(d, "sha1", "0", _b64(bytes(21))),
        "PCR sha1:0 has 21 bytes, expected 20",
    ),
    (
        "sha256 value in sha1 bank",
        lambda d: _with_pcr(d, "sha1", "0", _b64(bytes(32))),
        "evidence field 'pcrs.sha1.0' is larger than 20 bytes",
    ),
    (
        "sha256 value in sha384 bank",
        lambda d: _with_pcr(d, "sha384", "0", _b64(bytes(32))),
        "PCR sha384:0 has 32 bytes, expected 48",
    ),
    (
        "value far too long",
        lambda d: _with_pcr(d, "sha256", "0", _b64(bytes(4096))),
        "evidence field 'pcrs.sha256.0' is larger than 32 bytes",
    ),
    (
        "value bad base64",
        lambda d: _with_pcr(d, "sha256", "3", "not base64!"),
        "evidence field 'pcrs.sha256.3' is not valid base64",
    ),
    ("value empty", lambda d: _with_pcr(d, "sha256", "3", ""), "evidence field 'pcrs.sha256.3' is empty"),
    (
        "value an integer",
        lambda d: _with_pcr(d, "sha256", "3", 0),
        "evidence field 'pcrs.sha256.3' must be a base64 string, got int",
    ),
    (
        "value null",
        lambda d: _with_pcr(d, "sha256", "3", None),
        "evidence field 'pcrs.sha256.3' must be a base64 string, got NoneType",
    ),
]


@pytest.mark.parametrize("mutate,message", [c[1:] for c in PCR_CASES], ids=[c[0] for c in PCR_CASES])
def test_bad_pcrs_are_named(golden, mutate, message):
    _assert_refused(golden, mutate(golden.document()), message)


def test_a_pcr_value_known_in_one_bank_is_still_checked_in_another(golden):
    """Decoded PCR values are remembered per bank: a 20-byte value seen in a sha1 bank stays wrong in a sha256 bank."""
    value = _b64(b"\x07" * 20)
    parse_evidence(_with_pcr(golden.document(), "sha1", "0", value))
    _assert_refused(
        golden, _with_pcr(golden.document(), "sha256", "0", value), "PCR sha256:0 has 20 bytes, expected 32"
    )
    assert parse_evidence(_with_pcr(golden.document(), "sha1", "0", value)).pcrs["sha1"] == {0: b"\x07" * 20}


def test_the_bank_decoded_last_serves_only_the_same_text(golden):
    """The last bank decoded is reused for a bank of the same text only: one value changed is decoded (or refused) anew."""
    assert parse_evidence(golden.document()).pcrs["sha256"] == golden.evidence.pcrs["sha256"]
    assert (
        parse_evidence(_with_pcr(golden.document(), "sha256", "3", _b64(b"\x05" * 32))).pcrs["sha256"][3]
        == b"\x05" * 32
    )
    parse_evidence(golden.document())
    _assert_refused(
        golden,
        _with_pcr(golden.document(), "sha256", "3", _b64(b"\x05" * 31)),
        "PCR sha256:3 has 31 bytes, expected 32",
    )


def test_changing_a_document_or_its_evidence_after_parsing_changes_no_later_parse(golden):
    document = golden.document()
    parse_evidence(_with_pcr(golden.document(), "sha256", "3", _b64(b"\x05" * 32)))
    for dummy in range(2):  # the bank decoded anew, then the same bank again
        parse_evidence(document).pcrs["sha256"][4] = b"\x06" * 32
        assert parse_evidence(document).pcrs["sha256"] == golden.evidence.pcrs["sha256"]
    document["pcrs"]["sha256"]["3"] = _b64(b"\x06" * 32)  # the caller's object, changed in place
    assert parse_evidence(document).pcrs["sha256"][3] == b"\x06" * 32


@pytest.mark.parametrize("index", ["\u00b2", "9" * 5000], ids=["superscript two", "5000 digits"])
def test_pcr_index_that_int_cannot_read_is_refused(golden, index):
    doc = _with_pcr(golden.document(), "sha256", index, golden.document()["pcrs"]["sha256"]["2"])
    _assert_refused(golden, doc, "in bank 'sha256' is not 0..23")


EVENT_LOG_CASES = [
    (
        "the old JSON list",
        [{"pcr": 0, "digest": "00" * 32}],
        "evidence field 'event_log' must be a base64 string, got list",
    ),
    ("an object", {"0": "AA=="}, "evidence field 'event_log' must be a base64 string, got dict"),
    ("null", None, "evidence field 'event_log' must be a base64 string, got NoneType"),
    ("not base64", "event log!", "evidence field 'event_log' is not valid base64"),
    ("empty", "", "evidence field 'event_log' is empty"),
    (
        "over the limit",
        _b64(bytes(MAX_EVENT_LOG_BYTES + 1)),
        f"evidence field 'event_log' is larger than {MAX_EVENT_LOG_BYTES} bytes",
    ),
]


@pytest.mark.parametrize("event_log,message", [c[1:] for c in EVENT_LOG_CASES], ids=[c[0] for c in EVENT_LOG_CASES])
def test_bad_event_log_is_named(golden, event_log, message):
    _assert_refused(golden, _with(golden.document(), event_log=event_log), message)


def test_event_log_of_the_limit_is_carried_as_bytes_and_back(golden):
    raw = bytes(range(256)) * (MAX_EVENT_LOG_BYTES // 256)
    evidence = parse_evidence(_with(golden.document(), event_log=_b64(raw)))
    assert evidence.event_log == raw
    assert evidence.to_document()["event_log"] == _b64(raw)
    assert "event_log" not in golden.evidence.to_document()


def _pcr_selection_offset(quote: bytes) -> int:
    """Where the TPML_PCR_SELECTION of the golden quote starts (one bank, 3-byte bitmap, SHA-256 digest)."""
    return len(quote) - (2 + 32) - (4 + 2 + 1 + 3)


# Valid base64 around broken TPM structures: (case, field, change to the raw bytes, words of the message).
STRUCTURE_CASES = [
    ("quote cut in half", "quote", lambda raw: raw[: len(raw) // 2], "TPMS_ATTEST is truncated"),
    ("quote one byte short", "quote", lambda raw: raw[:-1], "TPMS_ATTEST is truncated"),
    ("quote magic only", "quote", lambda raw: raw[:4], "TPMS_ATTEST is truncated"),
    ("quote with a trailing byte", "quote", lambda raw: raw + b"\x00", "TPMS_ATTEST has 1 trailing bytes"),
    (
        "quote selecting 17 banks",
        "quote",
        lambda raw: raw[: _pcr_selection_offset(raw)] + struct.pack(">I", 17) + raw[_pcr_selection_offset(raw) + 4 :],
        "PCR selection lists 17 banks",
    ),
    ("quote digest size overrun", "quote", lambda raw: raw[:-34] + b"\xff\xff" + raw[-32:], "TPMS_ATTEST is truncated"),
    ("ak_public with trailing bytes", "ak_public", lambda raw: raw + b"\x00\x00", "TPMT_PUBLIC has 2 trailing bytes"),
    ("ak_public cut", "ak_public", lambda raw: raw[:-10], "TPMT_PUBLIC is truncated"),
    ("ak_public two bytes", "ak_public", lambda raw: raw[:2], "TPMT_PUBLIC is truncated"),
    (
        "ak_public of a keyed-hash object",
        "ak_public",
        lambda raw: b"\x00\x08" + raw[2:],
        "key type 0x0008 is not supported (ECC or RSA)",
    ),
    (
        "signature with unknown alg",
        "signature",
        lambda raw: b"\x00\x99" + raw[2:],
        "signature algorithm 0x0099 is not supported",
    ),
    (
        "signature with HMAC alg",
        "signature",
        lambda raw: b"\x00\x05" + raw[2:],
        "signature algorithm 0x0005 is not supported",
    ),
    ("signature cut", "signature", lambda raw: raw[:-5], "TPMT_SIGNATURE is truncated"),
    ("signature header only", "signature", lambda raw: raw[:4], "TPMT_SIGNATURE is truncated"),
    ("signature with a trailing byte", "signature", lambda raw: raw + b"\x00", "TPMT_SIGNATURE has 1 trailing bytes"),
]


@pytest.mark.parametrize("name,change,message", [c[1:] for c in STRUCTURE_CASES], ids=[c[0] for c in STRUCTURE_CASES])
def test_broken_tpm_structure_is_malformed(golden, name, change, message):
    doc = _replace_raw(golden.document(), name, change)
    parse_evidence(copy.deepcopy(doc))  # the JSON layer is fine: only the TPM structure is broken
    with pytest.raises(VerificationError) as err:
        golden.verifier.verify(doc, golden.nonce)
    assert err.value.reason == "malformed"
    assert f"evidence field {name!r}" in str(err.value) and message in str(err.value)


# An AK public area that parses but whose key cannot be built; 'ak_public' is not signed, so anyone can send these.
AK_KEY_CASES = [
    ("point off the curve", lambda raw: raw[:-1] + bytes([raw[-1] ^ 1])),
    ("unsupported curve", lambda raw: raw[:16] + b"\x00\x05" + raw[18:]),
    ("name algorithm NULL", lambda raw: raw[:2] + b"\x00\x10" + raw[4:]),
]


@pytest.mark.parametrize("change", [c[1] for c in AK_KEY_CASES], ids=[c[0] for c in AK_KEY_CASES])
def test_ak_public_whose_key_cannot_be_built_is_malformed(golden, change):
    doc = _replace_raw(golden.document(), "ak_public", change)
    with pytest.raises(VerificationError) as err:
        golden.verifier.verify(doc, golden.nonce)
    assert err.value.reason == "malformed"


def test_rsa_ak_public_with_bad_modulus_is_malformed(golden):
    attributes = (
        tpm2.ATTR_FIXED_TPM
        | tpm2.ATTR_FIXED_PARENT
        | tpm2.ATTR_SENSITIVE_DATA_ORIGIN
        | tpm2.ATTR_RESTRICTED
        | tpm2.ATTR_SIGN
    )
    rsa_public = (
        struct.pack(">HHIH", tpm2.ALG_RSA, tpm2.ALG_SHA256, attributes, 0)  # no authPolicy
        + struct.pack(">HHHI", tpm2.ALG_NULL, tpm2.ALG_NULL, 2048, 0)  # symmetric, scheme, keyBits, exponent
        + b"\x00\x01\x00"
    )  # a one-byte modulus of 0
    signature = struct.pack(">HHH", tpm2.ALG_RSASSA, tpm2.ALG_SHA256, 256) + bytes(256)
    doc = _with(golden.document(), ak_public=_b64(rsa_public), signature=_b64(signature))
    with pytest.raises(VerificationError) as err:
        golden.verifier.verify(doc, golden.nonce)
    assert err.value.reason == "malformed"


def test_unreadable_ek_certificate_is_malformed_at_trust_level_2(golden):
    policy = MeasurementPolicy("sha256", golden.policy.rules, "ek-certificate")
    doc = _with(golden.document(), ek_certificate=_b64(b"\x30\x03\x02\x01\x00"))
    with pytest.raises(VerificationError) as err:
        Verifier(policy, golden.ca_certificates).verify(doc, golden.nonce)
    assert err.value.reason == "malformed"
    assert "EK certificate or EK public key is unreadable" in str(err.value)


# Fuzzing: whatever arrives, Verifier.verify answers with VerificationError (or accepts an unchanged quote).


def _verify_only_refuses(golden, document) -> None:
    try:
        result = golden.verifier.verify(document, golden.nonce)
    except VerificationError as exc:
        assert exc.reason and str(exc)
        return
    except Exception as exc:  # noqa: BLE001 - the property under test is that nothing else escapes
        raise AssertionError(f"{type(exc).__name__} escaped Verifier.verify: {exc}") from exc
    # Accepted: then whatever was mutated is not what the TPM signed or what binds the quote.
    golden_evidence = golden.evidence
    assert (result.evidence.quote, result.evidence.signature, result.evidence.user_data) == (
        golden_evidence.quote,
        golden_evidence.signature,
        golden_evidence.user_data,
    )
    assert {i: result.pcrs[i] for i in POLICY_PCRS} == {i: golden_evidence.pcrs["sha256"][i] for i in POLICY_PCRS}


FUZZ = settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=40)
    | st.sampled_from(["", "AA==", "tpm", "sha256", "0", "23", "24", "-1"]),
    lambda children: (
        st.lists(children, max_size=6)
        | st.dictionaries(st.text(max_size=10) | st.sampled_from(REQUIRED_FIELDS), children, max_size=6)
    ),
    max_leaves=30,
)


@FUZZ
@given(value=JSON_VALUES, as_text=st.booleans())
def test_fuzz_random_json_structures_only_raise_verification_error(golden, value, as_text):
    _verify_only_refuses(golden, json.dumps(value) if as_text else value)


@FUZZ
@given(data=st.data())
def test_fuzz_golden_with_one_part_replaced_only_raises_verification_error(golden, data):
    doc = golden.document()
    where = data.draw(
        st.sampled_from(REQUIRED_FIELDS + ("ek_public", "ek_certificate", "event_log", "pcrs.sha256", "pcrs.sha256.N"))
    )
    value = data.draw(JSON_VALUES)
    if where == "pcrs.sha256":
        doc["pcrs"]["sha256"] = value
    elif where == "pcrs.sha256.N":
        doc["pcrs"]["sha256"][data.draw(st.text(max_size=4) | st.sampled_from([str(i) for i in range(26)]))] = value
    else:
        doc[where] = value
    _verify_only_refuses(golden, doc)


MUTATIONS = st.lists(
    st.tuples(st.sampled_from(["flip", "set", "insert", "delete"]), st.integers(min_value=0), st.integers(0, 255)),
    min_size=1,
    max_size=4,
)


def _mutate(raw: bytes, mutations, cut) -> bytes:
    data = bytearray(raw)
    for kind, position, byte in mutations:
        if not data:
            break
        i = position % len(data)
        if kind == "flip":
            data[i] ^= 1 << (byte % 8)
        elif kind == "set":
            data[i] = byte
        elif kind == "insert":
            data.insert(i, byte)
        else:
            del data[i]
    return bytes(data[:cut] if cut is not None else data)


@FUZZ
@given(mutations=MUTATIONS, cut=st.none() | st.integers(min_value=0, max_value=6000), as_text=st.booleans())
def test_fuzz_byte_mutations_of_the_document_only_raise_verification_error(golden, mutations, cut, as_text):
    raw = _mutate(golden.json().encode(), mutations, cut)
    _verify_only_refuses(golden, raw.decode("utf-8", "replace") if as_text else raw)


@FUZZ
@given(
    name=st.sampled_from(("ak_public", "quote", "signature", "user_data", "ek_public", "ek_certificate", "pcr")),
    mutations=MUTATIONS,
    cut=st.none() | st.integers(min_value=0, max_value=200),
    pcr=st.integers(0, 23),
)
def test_fuzz_byte_mutations_inside_fields_only_raise_verification_error(golden, name, mutations, cut, pcr):
    doc = golden.document()
    if name == "pcr":
        doc["pcrs"]["sha256"][str(pcr)] = _b64(
            _mutate(base64.b64decode(doc["pcrs"]["sha256"][str(pcr)]), mutations, cut)
        )
    else:
        doc = _replace_raw(doc, name, lambda raw: _mutate(raw, mutations, cut))
    _verify_only_refuses(golden, doc)
