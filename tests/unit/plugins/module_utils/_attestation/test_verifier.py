"""The verifier against real swtpm quotes: golden quote and single-bit mutations (Keylime style)."""

from __future__ import annotations

import base64
import copy
import datetime
import hashlib
import os

import pytest
from cryptography import x509

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import issuer, tpm2
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.nonces import NonceStore
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


def _quote(swtpm, nonce, user_data=None):
    user_data = user_data or EphemeralKey.generate().public_bytes()
    with issuer.Tpm(swtpm.tcti) as tpm:
        return issuer.issue_evidence(tpm, nonce, user_data)


def _policy(evidence, ak_trust="pcrs-only", pcrs=POLICY_PCRS):
    values = evidence.pcrs["sha256"]
    return MeasurementPolicy("sha256", {i: PcrRule(i, (values[i],)) for i in pcrs}, ak_trust)


def _verifier(policy, swtpm):
    return Verifier(policy, x509.load_pem_x509_certificates(swtpm.ca_pem))


def _flip(doc, field, byte_index=-1):
    mutated = copy.deepcopy(doc)
    raw = bytearray(base64.b64decode(mutated[field]))
    raw[byte_index] ^= 0x01
    mutated[field] = base64.b64encode(bytes(raw)).decode()
    return mutated


@pytest.fixture
def golden(swtpm):
    nonce = os.urandom(32)
    evidence = _quote(swtpm, nonce)
    return swtpm, nonce, evidence, _policy(evidence)


def test_valid_quote_verifies(golden):
    swtpm, nonce, evidence, policy = golden
    result = _verifier(policy, swtpm).verify(evidence.to_json(), nonce)
    assert result.challenge is None
    assert result.pcrs[15] == bytes(32)
    assert result.to_result()["verified"] is True


def test_a_policy_with_no_pcr_rule_but_the_node_lock_accepts_no_quote(golden):
    # A policy of CVM sections only reads with no PCR rule; the join service and the hand-overs add PCR 15's. Such a
    # policy says nothing of what a TPM node booted, so it must not pass every quote.
    swtpm, nonce, evidence, _policy_ = golden
    section = {"tdx": {"event_log": "required"}}
    for policy in (
        MeasurementPolicy("sha256", {}, "pcrs-only", (), section),
        MeasurementPolicy("sha256", {}, "pcrs-only", (), section).with_rule(15, [bytes(32)]),
    ):
        with pytest.raises(VerificationError) as err:
            _verifier(policy, swtpm).verify(evidence.to_json(), nonce)
        assert err.value.reason == "policy" and "no 'pcrs' rule besides the node lock" in str(err.value)
    # One rule of what booted is enough.
    assert _verifier(_policy(evidence, pcrs=(0, 15)), swtpm).verify(evidence.to_json(), nonce).pcrs[15] == bytes(32)


def test_signature_bit_flip_fails(golden):
    swtpm, nonce, evidence, policy = golden
    with pytest.raises(VerificationError) as err:
        _verifier(policy, swtpm).verify(_flip(evidence.to_document(), "signature"), nonce)
    assert err.value.reason == "signature"


@pytest.mark.parametrize("offset", [6, 40, 60, -40, -1], ids=["signer", "extraData", "clock", "selection", "pcrDigest"])
def test_quote_bit_flip_fails_the_signature(golden, offset):
    swtpm, nonce, evidence, policy = golden
    with pytest.raises(VerificationError) as err:
        _verifier(policy, swtpm).verify(_flip(evidence.to_document(), "quote", offset), nonce)
    assert err.value.reason in ("signature", "malformed")


@pytest.mark.parametrize("pcr", range(24))
def test_each_pcr_value_bit_flip_fails_the_digest(golden, pcr):
    swtpm, nonce, evidence, policy = golden
    doc = evidence.to_document()
    raw = bytearray(base64.b64decode(doc["pcrs"]["sha256"][str(pcr)]))
    raw[0] ^= 0x80
    doc["pcrs"]["sha256"][str(pcr)] = base64.b64encode(bytes(raw)).decode()
    with pytest.raises(VerificationError) as err:
        _verifier(policy, swtpm).verify(doc, nonce)
    assert err.value.reason == "pcr-digest"


def test_nonce_bit_flip_fails(golden):
    swtpm, nonce, evidence, policy = golden
    flipped = bytes([nonce[0] ^ 1]) + nonce[1:]
    with pytest.raises(VerificationError) as err:
        _verifier(policy, swtpm).verify(evidence.to_json(), flipped)
    assert err.value.reason == "nonce"


def test_swapped_ephemeral_key_fails(golden):
    swtpm, nonce, evidence, policy = golden
    doc = evidence.to_document()
    doc["user_data"] = base64.b64encode(EphemeralKey.generate().public_bytes()).decode()
    with pytest.raises(VerificationError) as err:
        _verifier(policy, swtpm).verify(doc, nonce)
    assert err.value.reason == "nonce"


def test_stale_nonce_fails():
    clock = [1000.0]
    store = NonceStore(ttl=60, clock=lambda: clock[0])
    nonce = store.issue()
    clock[0] += 61
    with pytest.raises(VerificationError) as err:
        store.consume(nonce)
    assert err.value.reason == "nonce-stale"


def test_reused_nonce_fails(tmp_path):
    store = NonceStore(path=str(tmp_path / "nonces.json"))
    nonce = store.issue()
    store.consume(nonce)
    with pytest.raises(VerificationError) as err:
        NonceStore(path=str(tmp_path / "nonces.json")).consume(nonce)
    assert err.value.reason == "nonce-reused"
    assert oct((tmp_path / "nonces.json").stat().st_mode & 0o777) == "0o600"


def test_unknown_nonce_fails():
    with pytest.raises(VerificationError) as err:
        NonceStore().consume(os.urandom(32))
    assert err.value.reason == "nonce-unknown"


def test_quote_whose_selection_misses_a_policy_pcr_fails(swtpm):
    from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.evidence import qualifying_data
    from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.tpm_evidence import (
        TpmEvidence as Evidence,
    )

    nonce = os.urandom(32)
    user_data = EphemeralKey.generate().public_bytes()
    with issuer.Tpm(swtpm.tcti) as tpm:
        ak, ak_public = tpm.attestation_key()
        values = tpm.read_pcrs()
        attest, signature = tpm.quote(ak, qualifying_data(nonce, user_data), indices=(0, 4, 8))
    evidence = Evidence("tpm", ak_public, attest, signature, {"sha256": values}, user_data)
    with pytest.raises(VerificationError) as err:
        _verifier(_policy(evidence), swtpm).verify(evidence, nonce)
    assert err.value.reason == "pcr-selection"
    assert "9, 15" in str(err.value)


def test_every_policy_mismatch_is_reported_and_warn_only_is_a_warning(golden):
    swtpm, nonce, evidence, policy = golden
    wrong = hashlib.sha256(b"other").digest()
    policy = policy.with_rule(4, [wrong]).with_rule(9, [wrong]).with_rule(8, [wrong], warn_only=True)
    with pytest.raises(VerificationError) as err:
        _verifier(policy, swtpm).verify(evidence.to_json(), nonce)
    assert err.value.reason == "pcr-policy"
    assert [m["pcr"] for m in err.value.mismatches] == [4, 9]
    assert [w["pcr"] for w in err.value.warnings] == [8]
    # The message gives each value and what the policy allows, and the next step.
    message = str(err.value)
    assert message.startswith("PCR(s) 4, 9 do not match the measurement policy (")
    for index in (4, 9):
        assert f"PCR {index} is {evidence.pcrs['sha256'][index].hex()}, the policy allows {wrong.hex()}" in message
    assert (
        "enrol it (confidential.kubernetes.measurements; several golden nodes with measurements_merge=true)" in message
    )


def test_a_pcr_15_mismatch_points_at_reboot_and_rejoin_or_reset_not_at_enrolling(golden):
    # A node locked to a cluster (the node lock's mark in PCR 15) where the policy expects a fresh node.
    swtpm, _nonce, _evidence, policy = golden
    with issuer.Tpm(swtpm.tcti) as tpm:
        tpm.pcr_event(15, bytes(range(32)))
    nonce = os.urandom(32)
    evidence = _quote(swtpm, nonce)
    with pytest.raises(VerificationError) as err:
        _verifier(policy, swtpm).verify(evidence.to_json(), nonce)
    message = str(err.value)
    assert message.startswith("PCR(s) 15 do not match the measurement policy (")
    assert "PCR 15 is the node lock, not the image" in message
    assert "reboot it and let it rejoin (it does at boot; recover.yml when no join service answers)" in message
    assert "confidential.kubernetes.reset -l <node> -e confirm_reset=yes-reset-<node>" in message
    assert "measurements" not in message
    # With an image PCR wrong too, both next steps.
    policy = policy.with_rule(4, [hashlib.sha256(b"other").digest()])
    with pytest.raises(VerificationError) as err:
        _verifier(policy, swtpm).verify(evidence.to_json(), nonce)
    assert "PCR 15 is the node lock" in str(err.value) and "enrol it (confidential.kubernetes.measurements" in str(
        err.value
    )


def test_warn_only_mismatch_alone_verifies_with_a_warning(golden):
    swtpm, nonce, evidence, policy = golden
    policy = policy.with_rule(8, [hashlib.sha256(b"other").digest()], warn_only=True)
    result = _verifier(policy, swtpm).verify(evidence.to_json(), nonce)
    assert [w["pcr"] for w in result.warnings] == [8]


def test_several_allowed_values_per_pcr(golden):
    swtpm, nonce, evidence, policy = golden
    policy = policy.with_rule(0, [hashlib.sha256(b"old firmware").digest(), evidence.pcrs["sha256"][0]])
    assert _verifier(policy, swtpm).verify(evidence.to_json(), nonce).warnings == []


def test_node_locked_for_a_cluster_fails_a_fresh_node_policy(swtpm):
    with issuer.Tpm(swtpm.tcti) as tpm:
        tpm.pcr_event(15, b"some cluster id")
    nonce = os.urandom(32)
    evidence = _quote(swtpm, nonce)
    policy = _policy(evidence).with_rule(15, [bytes(32)])
    with pytest.raises(VerificationError) as err:
        _verifier(policy, swtpm).verify(evidence.to_json(), nonce)
    assert [m["pcr"] for m in err.value.mismatches] == [15]


def test_level2_ak_proven_by_credential_activation(golden):
    swtpm, nonce, evidence, unused_policy = golden
    result = _verifier(_policy(evidence, "ek-certificate"), swtpm).verify(evidence.to_json(), nonce)
    assert result.challenge is not None and result.ak_trust_level == 2
    with issuer.Tpm(swtpm.tcti) as tpm:
        secret = issuer.answer_challenge(
            tpm, result.challenge.credential.blob, result.challenge.credential.encrypted_seed
        )
    result.challenge.check(secret)


def test_level2_ak_from_another_tpm_is_not_proven(swtpm, other_swtpm):
    """EK (and its certificate) of one TPM, AK and quote of another: activation must fail."""
    nonce = os.urandom(32)
    genuine = _quote(swtpm, nonce)
    foreign = _quote(other_swtpm, nonce, genuine.user_data)
    doc = foreign.to_document()
    doc["ek_public"] = genuine.to_document()["ek_public"]
    doc["ek_certificate"] = genuine.to_document()["ek_certificate"]
    result = _verifier(_policy(foreign, "ek-certificate"), swtpm).verify(doc, nonce)
    # The TPM that owns the EK cannot activate a credential for an AK it does not hold.
    with issuer.Tpm(swtpm.tcti) as tpm:
        with pytest.raises(issuer.TpmError, match="credential activation"):
            issuer.answer_challenge(tpm, result.challenge.credential.blob, result.challenge.credential.encrypted_seed)
    # And a guessed answer is refused.
    with pytest.raises(VerificationError) as err:
        result.challenge.check(os.urandom(32))
    assert err.value.reason == "credential-activation"


def test_level2_ek_certificate_from_another_ca_fails(foreign_swtpm, swtpm):
    nonce = os.urandom(32)
    evidence = _quote(foreign_swtpm, nonce)
    with pytest.raises(VerificationError) as err:
        _verifier(_policy(evidence, "ek-certificate"), swtpm).verify(evidence.to_json(), nonce)
    assert err.value.reason == "ek-certificate"
    issuer_name = x509.load_der_x509_certificate(evidence.ek_certificate).issuer.rfc4514_string()
    assert (
        f"does not chain to the configured EK CA (issuer {issuer_name}): add the certificate of {issuer_name}"
        in str(err.value)
    )
    assert "to confidential_ek_ca_file (openssl verify -partial_chain" in str(err.value)


def test_level2_without_ek_certificate_fails(golden):
    swtpm, nonce, evidence, unused_policy = golden
    doc = evidence.to_document()
    del doc["ek_certificate"], doc["ek_public"]
    with pytest.raises(VerificationError) as err:
        _verifier(_policy(evidence, "ek-certificate"), swtpm).verify(doc, nonce)
    assert err.value.reason == "ek-certificate"
    assert "provision the vendor's, or enrol the policy with measurements_ak_trust=pcrs-only" in str(err.value)


def test_level2_without_an_ek_ca_names_the_variable(golden):
    swtpm, nonce, evidence, unused_policy = golden
    with pytest.raises(VerificationError) as err:
        Verifier(_policy(evidence, "ek-certificate"), []).verify(evidence.to_json(), nonce)
    assert err.value.reason == "ek-ca"
    assert "set confidential_ek_ca_file to a PEM file" in str(err.value)


def test_level2_ek_certificate_out_of_validity_gives_its_dates_and_the_clock(golden):
    swtpm, nonce, evidence, unused_policy = golden
    certificate = x509.load_der_x509_certificate(evidence.ek_certificate)
    early = certificate.not_valid_before_utc - datetime.timedelta(days=1)  # its notAfter is 9999-12-31
    verifier = Verifier(
        _policy(evidence, "ek-certificate"), x509.load_pem_x509_certificates(swtpm.ca_pem), now=lambda: early
    )
    with pytest.raises(VerificationError) as err:
        verifier.verify(evidence.to_json(), nonce)
    assert err.value.reason == "ek-certificate"
    stamp = "%Y-%m-%dT%H:%M:%SZ"
    assert (
        f"outside its validity period ({certificate.not_valid_before_utc:{stamp}} to "
        f"{certificate.not_valid_after_utc:{stamp}}; the verifier's clock says {early:{stamp}}): check that clock"
        in str(err.value)
    )


def test_level2_ek_public_not_matching_certificate_fails(golden, other_swtpm):
    swtpm, nonce, evidence, unused_policy = golden
    doc = evidence.to_document()
    doc["ek_public"] = _quote(other_swtpm, nonce).to_document()["ek_public"]
    with pytest.raises(VerificationError) as err:
        _verifier(_policy(evidence, "ek-certificate"), swtpm).verify(doc, nonce)
    assert "not the key of the EK certificate" in str(err.value)


def test_software_make_credential_matches_the_tpm(swtpm):
    """Our pure-Python TPM2_MakeCredential is activated by a real TPM."""
    with issuer.Tpm(swtpm.tcti) as tpm:
        ak, ak_public = tpm.attestation_key()
        _certificate, ek, ek_public = tpm.endorsement_key()
        credential = tpm2.make_credential(tpm2.parse_public(ek_public), tpm2.parse_public(ak_public).name, b"s" * 32)
        assert tpm.activate_credential(ak, ek, credential.blob, credential.encrypted_seed) == b"s" * 32


def test_ak_without_restricted_attribute_fails(golden):
    swtpm, nonce, evidence, policy = golden
    doc = evidence.to_document()
    raw = bytearray(base64.b64decode(doc["ak_public"]))
    raw[5] &= ~0x01  # objectAttributes is bytes 4..7 big-endian; 'restricted' is bit 16
    doc["ak_public"] = base64.b64encode(bytes(raw)).decode()
    with pytest.raises(VerificationError) as err:
        _verifier(policy, swtpm).verify(doc, nonce)
    assert err.value.reason == "ak-attributes"


def test_a_known_attestation_key_stands_only_for_its_own_bytes(golden, other_swtpm):
    """The verifier keeps the AKs it has parsed, keyed by their bytes: after the genuine AK has verified, another
    AK of the same shape, or the genuine one with one attribute bit changed, is still refused."""
    swtpm, nonce, evidence, policy = golden
    verifier = _verifier(policy, swtpm)
    assert verifier.verify(evidence.to_json(), nonce).ak_name == tpm2.parse_public(evidence.ak_public).name
    other_ak = _quote(other_swtpm, nonce).ak_public
    assert other_ak != evidence.ak_public and len(other_ak) == len(evidence.ak_public)
    doc = evidence.to_document()
    doc["ak_public"] = base64.b64encode(other_ak).decode()
    with pytest.raises(VerificationError) as err:
        verifier.verify(doc, nonce)
    assert err.value.reason == "signature"
    with pytest.raises(VerificationError) as err:
        verifier.verify(_flip(evidence.to_document(), "ak_public", 5), nonce)  # 'restricted' cleared
    assert err.value.reason == "ak-attributes"
    assert verifier.verify(evidence.to_json(), nonce).to_result()["verified"] is True


def test_rsa_signature_for_ecc_key_fails_the_scheme_check(golden):
    swtpm, nonce, evidence, policy = golden
    doc = evidence.to_document()
    raw = bytearray(base64.b64decode(doc["signature"]))
    raw[0:2] = b"\x00\x14"  # TPM_ALG_RSASSA
    doc["signature"] = base64.b64encode(bytes(raw)).decode()
    with pytest.raises(VerificationError) as err:
        _verifier(policy, swtpm).verify(doc, nonce)
    assert err.value.reason in ("signature-scheme", "malformed")


def test_missing_tpm_is_a_clear_error(tmp_path):
    with pytest.raises(issuer.TpmError, match="cannot open TPM"):
        issuer.Tpm(f"swtpm:path={tmp_path}/absent.sock")


def test_level2_ek_public_that_names_no_usable_key_is_malformed(golden):
    """Found by the fuzzer (tests/security): an even RSA exponent escaped as a StructureError instead of a refusal."""
    swtpm, nonce, evidence, unused_policy = golden
    ek = tpm2.parse_public(evidence.ek_public)
    assert ek.type == tpm2.ALG_RSA
    exponent_at = len(evidence.ek_public) - (2 + len(ek.unique[0])) - 4
    broken = evidence.ek_public[:exponent_at] + (4).to_bytes(4, "big") + evidence.ek_public[exponent_at + 4 :]
    doc = evidence.to_document()
    doc["ek_public"] = base64.b64encode(broken).decode()
    with pytest.raises(VerificationError) as err:
        _verifier(_policy(evidence, "ek-certificate"), swtpm).verify(doc, nonce)
    assert err.value.reason == "malformed" and "EK public key is unreadable" in str(err.value)


def test_level2_ek_with_an_aes_key_size_no_aes_has_is_refused(golden):
    """Found by the fuzzer (tests/security): an EK symmetric key size of 168 bits escaped make_credential as ValueError."""
    swtpm, nonce, evidence, unused_policy = golden
    ek = tpm2.parse_public(evidence.ek_public)
    key_bits_at = 8 + 2 + len(ek.auth_policy) + 2
    assert int.from_bytes(evidence.ek_public[key_bits_at : key_bits_at + 2], "big") == ek.symmetric[1]
    doc = evidence.to_document()
    doc["ek_public"] = base64.b64encode(
        evidence.ek_public[:key_bits_at] + (168).to_bytes(2, "big") + evidence.ek_public[key_bits_at + 2 :]
    ).decode()
    with pytest.raises(VerificationError) as err:
        _verifier(_policy(evidence, "ek-certificate"), swtpm).verify(doc, nonce)
    # Now refused before make_credential: AES-168 is no TCG EK template's (the template check, issue 25).
    assert err.value.reason == "ek-template" and "not the TCG default EK template L-1/H-1" in str(err.value)


def test_level2_ek_certificate_with_an_unreadable_issuer_is_malformed(golden):
    """Found by the fuzzer (tests/security): cryptography reads the issuer only on first use, which raised ValueError."""
    swtpm, nonce, evidence, unused_policy = golden
    issuer_der = x509.load_der_x509_certificate(evidence.ek_certificate).issuer.public_bytes()
    at = evidence.ek_certificate.index(issuer_der)
    broken = bytearray(evidence.ek_certificate)
    first_set = at + 2 + (issuer_der[1] & 0x7F if issuer_der[1] & 0x80 else 0)
    oid = first_set + 4  # SET { SEQUENCE { OID, value } }, short lengths
    assert (broken[first_set], broken[first_set + 2], broken[oid]) == (0x31, 0x30, 0x06)
    broken[oid + 2 + broken[oid + 1]] = 0x0F  # the attribute value's tag: a type no Name holds
    doc = evidence.to_document()
    doc["ek_certificate"] = base64.b64encode(bytes(broken)).decode()
    with pytest.raises(VerificationError) as err:
        _verifier(_policy(evidence, "ek-certificate"), swtpm).verify(doc, nonce)
    assert err.value.reason == "malformed" and "EK certificate is unreadable" in str(err.value)
