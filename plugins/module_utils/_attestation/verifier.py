# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pure-Python verification of evidence against a measurement policy: the Verifier hands a document to the checks of
its variant (variants.py; the TPM's in tpm_variant.py), and what every variant answers with.

Checks run in the order of DESIGN section 3; each failure raises
``VerificationError`` with a stable ``reason`` and, for the policy check,
every mismatching PCR rather than the first.
"""

from __future__ import annotations

import datetime
import hmac
from dataclasses import dataclass, field
from typing import NamedTuple

try:
    from cryptography import x509
except ImportError:  # reported by the modules through missing_required_lib()
    pass

from . import tpm2
from .evidence import Evidence, EvidenceError, parse_evidence, variant_of
from .policy import MeasurementPolicy
from .variants import VariantVerifier

EK_REQUIRED_ATTRIBUTES = {
    "restricted": tpm2.ATTR_RESTRICTED,
    "decrypt": tpm2.ATTR_DECRYPT,
    "fixedTPM": tpm2.ATTR_FIXED_TPM,
}


class VerificationError(Exception):
    """Evidence was rejected. ``reason`` is a stable code; the message is for operators."""

    def __init__(
        self, reason: str, message: str, mismatches: list[dict] | None = None, warnings: list[dict] | None = None
    ):
        super().__init__(message)
        self.reason = reason
        self.mismatches = mismatches or []
        self.warnings = warnings or []

    def to_result(self) -> dict:
        return {
            "verified": False,
            "reason": self.reason,
            "msg": str(self),
            "mismatches": self.mismatches,
            "warnings": self.warnings,
        }


@dataclass(frozen=True)
class ActivationChallenge:
    """A credential only the TPM holding both the EK and the AK can activate."""

    ak_name: bytes
    credential: tpm2.Credential
    secret: bytes = field(repr=False)

    def check(self, activated_secret: bytes) -> None:
        if not hmac.compare_digest(self.secret, activated_secret):
            raise VerificationError(
                "credential-activation",
                "the AK was not proven by credential activation: the TPM holding the EK did not release the credential",
            )


class VerificationResult(NamedTuple):
    """What a verify established (immutable; a tuple, made on every verify, so cheaper to build than a frozen dataclass)."""

    evidence: Evidence
    ak_name: bytes
    ak_trust_level: int
    pcrs: dict[int, bytes]
    warnings: list[dict]
    challenge: ActivationChallenge | None = None

    def to_result(self) -> dict:
        return {
            "verified": self.challenge is None,
            "reason": "activation-required" if self.challenge else "ok",
            "ak_name": self.ak_name.hex(),
            "ak_trust_level": self.ak_trust_level,
            "pcrs": {str(i): v.hex() for i, v in sorted(self.pcrs.items())},
            "mismatches": [],
            "warnings": self.warnings,
        }


def load_ca_certificates(pem_data: bytes) -> list[x509.Certificate]:
    try:
        certs = x509.load_pem_x509_certificates(pem_data)
    except ValueError as exc:
        raise VerificationError("ek-ca", f"EK CA bundle holds no readable PEM certificate: {exc}") from None
    return certs


class Verifier:
    """Checks evidence against a measurement policy (and, for AK trust level 2, an EK CA bundle): the document's
    ``variant`` names the registered variant (variants.py) whose checks run."""

    def __init__(
        self,
        policy: MeasurementPolicy,
        ek_ca_certificates: list[x509.Certificate] | None = None,
        now=lambda: datetime.datetime.now(datetime.timezone.utc),
    ):
        self.policy = policy
        self.ek_ca_certificates = ek_ca_certificates or []
        self._now = now
        self._variant_verifiers: dict[str, VariantVerifier] = {}

    def verify(self, document: object, nonce: bytes) -> VerificationResult:
        try:
            evidence = document if isinstance(document, Evidence) else parse_evidence(document)
            variant = variant_of(evidence.variant)
        except EvidenceError as exc:
            raise VerificationError("malformed", str(exc)) from None
        checks = self._variant_verifiers.get(variant.name)
        if checks is None:
            checks = self._variant_verifiers[variant.name] = variant.verifier(
                self.policy, self.ek_ca_certificates, self._now
            )
        return checks.verify(evidence, nonce)


def check_ek_template(ek: tpm2.Public) -> None:
    """The EK must be the TCG default EK template of its key type (what an EK certificate certifies): attributes,
    authPolicy and parameters byte for byte. Raises VerificationError ``ek-template``."""
    problem = tpm2.ek_template_problem(ek)
    if problem is not None:
        raise VerificationError(
            "ek-template", f"the evidence's EK is not an endorsement key as its certificate implies: {problem}"
        )
