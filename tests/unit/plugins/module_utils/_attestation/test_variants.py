# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The evidence variant registry: the verifier and the issuer hand the work to the variant the evidence names. A
throw-away variant registered here (what a new variant's file does) is dispatched to; an unknown one is refused by
name, with the known ones listed. The TPM variant's own checks are the rest of this directory's tests."""

from __future__ import annotations

import os

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import tpm_variant, variants
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.evidence import (
    Evidence,
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


class ThrowAway(variants.Variant):
    """A variant as a new file would add one: its evidence is whatever its device says, and it checks only the nonce."""

    name = "throw-away"

    def __init__(self):
        self.verifiers_made: list[MeasurementPolicy] = []

    def verifier(self, policy, ek_ca_certificates, now):
        self.verifiers_made.append(policy)
        return ThrowAwayVerifier()

    def issue(self, device, nonce, user_data, **options):
        return Evidence(
            self.name,
            ak_public=device,
            quote=nonce,
            signature=repr(sorted(options.items())).encode(),
            pcrs={"sha256": {15: bytes(32)}},
            user_data=user_data,
        )


class ThrowAwayVerifier(variants.VariantVerifier):
    def verify(self, evidence, nonce):
        if evidence.quote != nonce:
            raise VerificationError("nonce", "not bound to this nonce")
        return VerificationResult(evidence, b"throw-away key", 1, evidence.pcrs["sha256"], [])


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
    assert evidence.variant == "throw-away" and evidence.ak_public == b"the device"
    assert evidence.signature == repr([("event_log", b"log"), ("include_ek", False)]).encode()
    verifier = Verifier(POLICY)
    document = evidence.to_document()
    assert verifier.verify(document, nonce).ak_name == b"throw-away key"
    assert verifier.verify(evidence, nonce).ak_name == b"throw-away key"
    with pytest.raises(VerificationError) as refused:
        verifier.verify(document, os.urandom(32))
    assert refused.value.reason == "nonce"
    # One set of checks per verifier and variant, made with the verifier's policy.
    assert throw_away.verifiers_made == [POLICY]


@pytest.mark.parametrize("registered", [False, True], ids=["tpm only", "with the throw-away"])
def test_an_unknown_variant_is_refused_by_name_with_the_known_ones(request, registered):
    known = "tpm"
    if registered:
        request.getfixturevalue("throw_away")
        known = "tpm, throw-away"
    message = f"evidence variant 'sev-snp' is not supported (known: {known})"
    evidence = Evidence("sev-snp", b"ak", b"quote", b"signature", {"sha256": {15: bytes(32)}}, b"user data")
    with pytest.raises(EvidenceError) as parse_refused:
        parse_evidence(evidence.to_document())
    assert str(parse_refused.value) == message
    with pytest.raises(VerificationError) as refused:
        Verifier(POLICY).verify(evidence, os.urandom(32))
    assert refused.value.reason == "malformed" and str(refused.value) == message
    with pytest.raises(EvidenceError) as issue_refused:
        issue_evidence(b"the device", os.urandom(32), b"user data", variant="sev-snp")
    assert str(issue_refused.value) == message


def test_a_name_is_registered_once(throw_away):
    with pytest.raises(ValueError, match="'throw-away' is empty or taken"):
        variants.register(ThrowAway())
    with pytest.raises(ValueError, match="'tpm' is empty or taken"):
        variants.register(type("AnotherTpm", (variants.Variant,), {"name": "tpm"})())
    assert variants.find("tpm") is tpm_variant.TPM
