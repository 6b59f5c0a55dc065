# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The evidence variant registry: the envelope, the verifier and the issuer hand the work to the variant the evidence
names. A throw-away variant registered here (what a new variant's file does: a body of its own, which the envelope
never reads) is dispatched to; an unknown one is refused by name, with the known ones listed. The TPM variant's own
checks are the rest of this directory's tests."""

from __future__ import annotations

import base64
import json
import os
from typing import NamedTuple

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import tpm_variant, variants
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.evidence import (
    EvidenceError,
    parse_evidence,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.issuer import issue_evidence
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import (
    MeasurementPolicy,
    PcrRule,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.verifier import (
    VerificationError,
    VerificationResult,
    Verifier,
)

POLICY = MeasurementPolicy("sha256", {15: PcrRule(15, (bytes(32),))}, ak_trust="pcrs-only")


class ThrowAwayEvidence(NamedTuple):
    variant: str
    device: bytes
    bound_nonce: bytes
    options: bytes
    user_data: bytes

    def to_document(self) -> dict:
        return {
            "version": 1,
            "variant": self.variant,
            "user_data": base64.b64encode(self.user_data).decode(),
            "device": self.device.decode(),
            "bound_nonce": self.bound_nonce.hex(),
            "options": self.options.decode(),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_document())


class ThrowAway(variants.Variant):
    """A variant as a new file would add one: its evidence is whatever its device says, and it checks only the nonce."""

    name = "throw-away"
    body_required = ("device", "bound_nonce")
    body_optional = ("options",)

    def parse_body(self, document, user_data):
        return ThrowAwayEvidence(
            self.name,
            document["device"].encode(),
            bytes.fromhex(document["bound_nonce"]),
            document.get("options", "").encode(),
            user_data,
        )

    def __init__(self):
        self.verifiers_made: list[MeasurementPolicy] = []

    def verifier(self, policy, ek_ca_certificates, now):
        self.verifiers_made.append(policy)
        return ThrowAwayVerifier()

    def issue(self, device, nonce, user_data, **options):
        return ThrowAwayEvidence(self.name, device, nonce, repr(sorted(options.items())).encode(), user_data)


class ThrowAwayVerifier(variants.VariantVerifier):
    def verify(self, evidence, nonce):
        if evidence.bound_nonce != nonce:
            raise VerificationError("nonce", "not bound to this nonce")
        return VerificationResult(evidence, b"throw-away key", 1, {"device": evidence.device}, [])


@pytest.fixture
def throw_away(monkeypatch):
    """The throw-away variant registered for one test only."""
    monkeypatch.setattr(variants, "_REGISTRY", dict(variants._REGISTRY))
    return variants.register(ThrowAway())


def test_the_tpm_is_the_first_variant():
    assert variants.names()[0] == "tpm"
    assert variants.find("tpm") is tpm_variant.TPM


def test_a_registered_variant_is_issued_and_verified_by_its_own_code(throw_away):
    nonce = os.urandom(32)
    evidence = issue_evidence(
        b"the device", nonce, b"user data", include_ek=False, event_log=b"log", variant="throw-away"
    )
    assert evidence.variant == "throw-away" and evidence.device == b"the device"
    assert evidence.options == repr([("event_log", b"log"), ("include_ek", False)]).encode()
    verifier = Verifier(POLICY)
    document = evidence.to_document()
    # The envelope hands the throw-away's own fields to it: it has no TPM field, and needs none.
    assert parse_evidence(json.dumps(document)) == evidence
    assert verifier.verify(document, nonce).identity == b"throw-away key"
    assert verifier.verify(evidence, nonce).to_result()["measurements"] == {"device": b"the device".hex()}
    with pytest.raises(EvidenceError, match="evidence document lacks field\\(s\\): bound_nonce"):
        parse_evidence({key: value for key, value in document.items() if key != "bound_nonce"})
    with pytest.raises(EvidenceError, match="unknown field\\(s\\): quote"):
        parse_evidence(dict(document, quote="AA=="))
    with pytest.raises(VerificationError) as refused:
        verifier.verify(document, os.urandom(32))
    assert refused.value.reason == "nonce"
    # One set of checks per verifier and variant, made with the verifier's policy.
    assert throw_away.verifiers_made == [POLICY]


@pytest.mark.parametrize("registered", [False, True], ids=["tpm only", "with the throw-away"])
def test_an_unknown_variant_is_refused_by_name_with_the_known_ones(request, registered):
    known = ", ".join(variants.names())
    if registered:
        request.getfixturevalue("throw_away")
        known += ", throw-away"
    message = f"evidence variant 'sgx' is not supported (known: {known})"
    evidence = ThrowAwayEvidence("sgx", b"the device", bytes(32), b"", b"user data")
    with pytest.raises(EvidenceError) as parse_refused:
        parse_evidence(evidence.to_json())
    assert str(parse_refused.value) == message
    with pytest.raises(VerificationError) as refused:
        Verifier(POLICY).verify(evidence, os.urandom(32))
    assert refused.value.reason == "malformed" and str(refused.value) == message
    with pytest.raises(EvidenceError) as issue_refused:
        issue_evidence(b"the device", os.urandom(32), b"user data", variant="sgx")
    assert str(issue_refused.value) == message


def test_a_name_is_registered_once(throw_away):
    with pytest.raises(ValueError, match="'throw-away' is empty or taken"):
        variants.register(ThrowAway())
    with pytest.raises(ValueError, match="'tpm' is empty or taken"):
        variants.register(type("AnotherTpm", (variants.Variant,), {"name": "tpm"})())
    assert variants.find("tpm") is tpm_variant.TPM
