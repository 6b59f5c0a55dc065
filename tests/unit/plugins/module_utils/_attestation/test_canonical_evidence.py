"""Canonical evidence (issue 25): one text per document, identifiers without extra bytes, the EK's public area exactly
a TCG default EK template, nesting bounded before anything recurses, refusals that quote only a short prefix.

Starts from one real swtpm quote (its EK is the TCG L-1 template, with a certificate from the lab's EK CA).
"""

from __future__ import annotations

import base64
import json
import os
import struct
from types import SimpleNamespace

import pytest
from ansible.parsing.dataloader import DataLoader
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import controller, issuer, node, tpm2
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.evidence import (
    MAX_CONTAINERS,
    QUOTE_LIMIT,
    EvidenceError,
    parse_evidence,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import (
    MeasurementPolicy,
    PcrRule,
    PolicyError,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.tpm_evidence import check_ek_template
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.verifier import (
    VerificationError,
    Verifier,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.seal import EphemeralKey
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.crypto import JoinCrypto, Refusal
from ansible_collections.confidential.kubernetes.plugins.module_utils._ticket import TicketError, open_sealed

POLICY_PCRS = (0, 4, 8, 9, 15)


class Golden:
    def __init__(self, swtpm):
        self.nonce = os.urandom(32)
        with issuer.Tpm(swtpm.tcti) as tpm:
            self.evidence = issuer.issue_evidence(tpm, self.nonce, EphemeralKey.generate().public_bytes())
        values = self.evidence.pcrs["sha256"]
        rules = {i: PcrRule(i, (values[i],)) for i in POLICY_PCRS}
        self.level1 = Verifier(MeasurementPolicy("sha256", rules, "pcrs-only"))
        self.level2 = Verifier(
            MeasurementPolicy("sha256", rules, "ek-certificate"), x509.load_pem_x509_certificates(swtpm.ca_pem)
        )

    def text(self) -> str:
        return self.evidence.to_json()

    def document(self) -> dict:
        return json.loads(self.text())


@pytest.fixture(scope="module")
def golden(manufactured_tpms):
    manufactured = manufactured_tpms["lab"]
    swtpm_instance = type(manufactured).__init__.__globals__["SwtpmInstance"]
    instance = swtpm_instance(manufactured)
    try:
        yield Golden(instance)
    finally:
        instance.stop()


def _refused(golden, document, words: str) -> str:
    """parse_evidence and the verifier (as text, as bytes) refuse with these words; the message."""
    with pytest.raises(EvidenceError) as err:
        parse_evidence(document)
    assert words in str(err.value), str(err.value)
    for form in (document, document.encode()) if isinstance(document, str) else (document,):
        with pytest.raises(VerificationError) as verify_err:
            golden.level1.verify(form, golden.nonce)
        assert verify_err.value.reason == "malformed" and words in str(verify_err.value)
    return str(err.value)


def test_golden_verifies_so_each_refusal_below_is_the_change(golden):
    for form in (golden.text(), golden.text().encode(), golden.document()):
        assert golden.level1.verify(form, golden.nonce).to_result()["verified"] is True


@pytest.mark.parametrize("key", ["version", "pcrs", "ak_public"])
def test_duplicate_top_level_key_is_refused(golden, key):
    text = golden.text()
    value = json.dumps(golden.document()[key])
    duplicated = "{" + json.dumps(key) + ": " + value + ", " + text[1:]  # the same key twice, the same value even
    _refused(golden, duplicated, f"repeats the key '{key}'")


def test_duplicate_pcr_index_is_refused(golden):
    """Last wins in json.loads: another parser would read the first PCR 0 value, the verifier the second."""
    document = golden.document()
    bank_text = json.dumps(document["pcrs"]["sha256"])
    zero = json.dumps(document["pcrs"]["sha256"]["0"])
    text = golden.text().replace(
        bank_text, '{"0": ' + json.dumps(base64.b64encode(bytes(32)).decode()) + ", " + bank_text[1:], 1
    )
    assert zero in text and text.count('"0": ') >= 2
    _refused(golden, text, "repeats the key '0'")


def _padding_bits_set(text: str) -> str:
    """The same bytes in another base64 text: the last character before '=' with its unused low bits set."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    stripped = text.rstrip("=")
    # Before one '=' the last character carries 2 unused bits, before two 4: canonical text has them zero.
    return stripped[:-1] + alphabet[alphabet.index(stripped[-1]) | 1] + text[len(stripped) :]


def test_non_canonical_base64_is_refused_in_every_field(golden):
    document = golden.document()
    fields = [
        name
        for name in ("ak_public", "quote", "signature", "user_data", "ek_public", "ek_certificate")
        if document[name].endswith("=")
    ]
    assert fields, "no field of the golden document has padding"
    for name in fields:
        changed = dict(document, **{name: _padding_bits_set(document[name])})
        assert base64.b64decode(changed[name]) == base64.b64decode(document[name])  # the same bytes, another text
        _refused(golden, changed, f"evidence field {name!r} is not canonical base64")


BASE64_CHANGES = [
    lambda v: v + "\n",
    lambda v: v.rstrip("="),
    lambda v: v + "=",
    lambda v: " " + v,
    lambda v: v[:4] + "\n" + v[4:],
]


@pytest.mark.parametrize(
    "change",
    BASE64_CHANGES,
    ids=["trailing newline", "missing padding", "extra padding", "leading space", "inner newline"],
)
def test_base64_with_extra_or_missing_characters_is_refused(golden, change):
    document = golden.document()
    name = next(n for n in ("ak_public", "quote", "signature", "user_data", "ek_public") if document[n].endswith("="))
    _refused(golden, dict(document, **{name: change(document[name])}), f"evidence field {name!r}")


@pytest.mark.parametrize("version_text", ["1.0", "true", "1e0", '"1"'])
def test_version_that_is_not_the_integer_1_is_refused(golden, version_text):
    text = golden.text().replace('"version": 1', '"version": ' + version_text, 1)
    assert json.loads(text)["version"] == json.loads(version_text)
    _refused(golden, text, "is not supported (expected 1, an integer)")


@pytest.mark.parametrize("depth", [MAX_CONTAINERS + 1, 500, 50_000])
def test_nesting_is_refused_before_any_recursion(golden, depth):
    document = golden.document()
    text = golden.text().replace('"pcrs": ', '"pcrs": ' + "[" * depth + "]" * depth + ', "x": ', 1)
    _refused(golden, text, f"more than {MAX_CONTAINERS} objects and arrays")
    nested: object = "x"
    for dummy in range(min(depth, 5000)):
        nested = {"a": nested}
    _refused(golden, dict(document, pcrs=nested), f"more than {MAX_CONTAINERS} objects and arrays")


@pytest.mark.parametrize("field", ["variant", "version", "unknown key", "pcr bank", "pcr index", "duplicate key"])
def test_refusals_quote_a_short_escaped_prefix_of_the_input(golden, field):
    attacker = "\x1b[31m" + "A" * 5000 + "\u202e"
    document = golden.document()
    if field == "variant":
        document["variant"] = attacker
    elif field == "version":
        document["version"] = attacker
    elif field == "unknown key":
        document[attacker] = 1
    elif field == "pcr bank":
        document["pcrs"][attacker] = {}
    elif field == "pcr index":
        document["pcrs"]["sha256"][attacker] = document["pcrs"]["sha256"]["0"]
    text = json.dumps(document)
    if field == "duplicate key":
        text = "{" + json.dumps(attacker) + ": 1, " + json.dumps(attacker) + ": 2, " + text[1:]
    with pytest.raises(EvidenceError) as err:
        parse_evidence(text)
    message = str(err.value)
    assert "A" * 40 in message and "A" * (QUOTE_LIMIT + 1) not in message, message
    assert len(message) < 300 and "\x1b" not in message and "\u202e" not in message, message
    assert "characters)" in message  # says how long the input was


# --- identifiers: exactly their digits, nothing more ----------------------------------------------------------------


@pytest.mark.parametrize("extra", ["\n", " ", "\t", "\r\n", " 00"])
def test_hex_nonce_with_extra_characters_is_refused_everywhere(golden, extra, tmp_path):
    nonce_hex = golden.nonce.hex() + extra
    policy = golden.level1.policy
    with pytest.raises(VerificationError) as err:
        controller.verify(golden.text(), nonce_hex, policy, [], None)
    assert err.value.reason == "nonce"
    assert controller.verify(golden.text(), golden.nonce.hex(), policy, [], None).to_result()["verified"] is True
    with pytest.raises(EvidenceError):
        node.decode_nonce(nonce_hex)
    assert node.decode_nonce(golden.nonce.hex()) == golden.nonce
    with pytest.raises(TicketError, match="64 hex characters"):
        open_sealed(None, "", "join", nonce_hex, "v")


@pytest.mark.parametrize("extra", ["\n", " ", "\r\n"])
def test_cluster_id_with_extra_characters_is_refused(golden, extra):
    cluster_id = os.urandom(32).hex()
    policy = {
        "version": 1,
        "hash_algorithm": "sha256",
        "ak_trust": "pcrs-only",
        "pcrs": {"0": {"allowed": ["00" * 32]}},
    }
    assert 15 in controller.resolve_policy(None, policy, cluster_id).rules
    with pytest.raises(PolicyError, match="64-hex cluster ID"):
        controller.resolve_policy(None, policy, cluster_id + extra)


# --- the EK public area: a TCG default EK template, as its certificate implies -----------------------------------------


def _template_bits(ek_public: bytes) -> int:
    """How many leading bytes of an EK TPMT_PUBLIC are the template (everything before the unique field)."""
    ek = tpm2.parse_public(ek_public)
    return len(ek_public) - sum(2 + len(part) for part in ek.unique)


def test_the_swtpm_ek_is_the_tcg_l1_template(golden):
    ek = tpm2.parse_public(golden.evidence.ek_public)
    assert tpm2.ek_template_problem(ek) is None
    assert ek.attributes == 0x000300B2 and ek.auth_policy == tpm2.EK_POLICY_A_SHA256


def test_every_single_bit_change_of_the_ek_template_is_refused_at_level_2_and_by_the_join_service(golden):
    """The fuzzer found 301 single-bit changes of the EK public that still activated: now each one is refused."""
    raw = golden.evidence.ek_public
    document = golden.document()
    refused = accepted = 0
    for bit in range(_template_bits(raw) * 8):
        flipped = bytearray(raw)
        flipped[bit // 8] ^= 1 << (bit % 8)
        try:
            ek = tpm2.parse_public(bytes(flipped))
            ek.public_key()
        except tpm2.StructureError:
            refused += 1  # not a public area at all
            continue
        with pytest.raises(VerificationError) as err:
            golden.level2.verify(dict(document, ek_public=base64.b64encode(bytes(flipped)).decode()), golden.nonce)
        assert err.value.reason in ("ek-template", "ek-certificate", "malformed"), (bit, err.value)
        with pytest.raises(VerificationError) as err:
            check_ek_template(ek)
        assert err.value.reason == "ek-template"
        verified = golden.level1.verify(golden.text(), golden.nonce)
        with pytest.raises(Refusal) as refusal:
            JoinCrypto._ek(verified._replace(evidence=verified.evidence._replace(ek_public=bytes(flipped))))
        assert refusal.value.reason in ("ek-template", "malformed"), (bit, refusal.value)
        accepted += 1
    assert accepted > 300, accepted  # the changes that parse, and were accepted before


def _ecc_ek(curve, curve_id: int, name_alg: int, attributes: int, policy: bytes, aes_bits: int) -> bytes:
    numbers = ec.generate_private_key(curve).public_key().public_numbers()
    size = curve.key_size // 8 + (1 if curve.key_size % 8 else 0)
    return (
        struct.pack(">HHIH", tpm2.ALG_ECC, name_alg, attributes, len(policy))
        + policy
        + struct.pack(">HHHHHH", tpm2.ALG_AES, aes_bits, tpm2.ALG_CFB, tpm2.ALG_NULL, curve_id, tpm2.ALG_NULL)
        + struct.pack(">H", size)
        + numbers.x.to_bytes(size, "big")
        + struct.pack(">H", size)
        + numbers.y.to_bytes(size, "big")
    )


LOW, HIGH = 0x000300B2, 0x000300F2


@pytest.mark.parametrize(
    "case,curve,curve_id,name_alg,attributes,policy,aes_bits,problem",
    [
        ("L-2", ec.SECP256R1(), tpm2.ECC_NIST_P256, tpm2.ALG_SHA256, LOW, tpm2.EK_POLICY_A_SHA256, 128, None),
        ("H-2", ec.SECP256R1(), tpm2.ECC_NIST_P256, tpm2.ALG_SHA256, HIGH, tpm2.EK_POLICY_B_SHA256, 128, None),
        ("H-3", ec.SECP384R1(), tpm2.ECC_NIST_P384, tpm2.ALG_SHA384, HIGH, tpm2.EK_POLICY_B_SHA384, 256, None),
        (
            "L-2 with userWithAuth",
            ec.SECP256R1(),
            tpm2.ECC_NIST_P256,
            tpm2.ALG_SHA256,
            HIGH,
            tpm2.EK_POLICY_A_SHA256,
            128,
            "L-2/H-2",
        ),
        (
            "L-2 without adminWithPolicy",
            ec.SECP256R1(),
            tpm2.ECC_NIST_P256,
            tpm2.ALG_SHA256,
            LOW & ~0x80,
            tpm2.EK_POLICY_A_SHA256,
            128,
            "L-2/H-2",
        ),
        ("L-2 with no policy", ec.SECP256R1(), tpm2.ECC_NIST_P256, tpm2.ALG_SHA256, LOW, b"", 128, "L-2/H-2"),
        (
            "H-3 with PolicyA",
            ec.SECP384R1(),
            tpm2.ECC_NIST_P384,
            tpm2.ALG_SHA384,
            HIGH,
            tpm2.EK_POLICY_A_SHA256,
            256,
            "H-3",
        ),
        (
            "H-3 with AES-128",
            ec.SECP384R1(),
            tpm2.ECC_NIST_P384,
            tpm2.ALG_SHA384,
            HIGH,
            tpm2.EK_POLICY_B_SHA384,
            128,
            "H-3",
        ),
    ],
)
def test_ecc_ek_templates(case, curve, curve_id, name_alg, attributes, policy, aes_bits, problem):
    ek = tpm2.parse_public(_ecc_ek(curve, curve_id, name_alg, attributes, policy, aes_bits))
    found = tpm2.ek_template_problem(ek)
    if problem is None:
        assert found is None, (case, found)
    else:
        assert found is not None and problem in found, (case, found)


def test_join_service_refuses_an_ek_public_that_is_not_its_certificates_key(golden):
    verified = golden.level1.verify(golden.text(), golden.nonce)
    other = tpm2.parse_public(
        _ecc_ek(ec.SECP256R1(), tpm2.ECC_NIST_P256, tpm2.ALG_SHA256, LOW, tpm2.EK_POLICY_A_SHA256, 128)
    )
    assert tpm2.ek_template_problem(other) is None
    with pytest.raises(Refusal) as refusal:
        JoinCrypto._ek(verified._replace(evidence=verified.evidence._replace(ek_public=other.raw)))
    assert refusal.value.reason == "ek-certificate"
    assert JoinCrypto._ek(verified).raw == golden.evidence.ek_public  # the genuine pair passes


# --- the actions: evidence bounded before Ansible's argument validation walks it --------------------------------------


def _run_action(module: str, args: dict) -> dict:
    import importlib

    action_module = importlib.import_module(
        f"ansible_collections.confidential.kubernetes.plugins.action.{module}"
    ).ActionModule
    task = SimpleNamespace(
        args=args, async_val=0, check_mode=False, diff=False, action=f"confidential.kubernetes.{module}", no_log=False
    )
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir=None), has_native_async=False)
    return action_module(task, connection, None, DataLoader(), None, None).run(task_vars={})


@pytest.mark.parametrize("module", ["verify_evidence", "seal_init_secrets", "recover_secrets"])
@pytest.mark.parametrize("evidence", ["nested 500", "nested list 900", "text too long"])
def test_actions_refuse_deep_or_huge_evidence_before_argument_validation(module, evidence, tmp_path):
    from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.evidence import (
        MAX_DOCUMENT_BYTES,
    )

    if evidence == "text too long":
        value: object = " " * (MAX_DOCUMENT_BYTES + 1)
    else:
        value = "x"
        for dummy in range(500 if evidence == "nested 500" else 900):
            value = {"a": value} if evidence == "nested 500" else [value]
    args = {
        "evidence": value,
        "nonce": "00" * 32,
        "policy": str(tmp_path / "p.json"),
        "secrets_file": str(tmp_path / "s"),
        "policy_content": None,
    }
    if module != "verify_evidence":
        args.pop("policy_content")
    result = _run_action(module, args)
    assert result["failed"] and result["reason"] == "malformed", result
    assert "objects and arrays" in result["msg"] or "larger than" in result["msg"]
    assert not (tmp_path / "s").exists()
