# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pure-Python verification of evidence against a measurement policy: the Verifier hands a document to the checks of
its variant (variants.py: the TPM's in tpm_variant.py, SEV-SNP's in sev_snp_variant.py, TDX's in tdx_variant.py),
which answer with the common result and error types of variants.py.

Each variant's checks run in the order DESIGN section 3 gives; each failure raises ``VerificationError`` with a stable
``reason`` and, for the policy check, every mismatch rather than the first.
"""

from __future__ import annotations

import datetime

try:
    from cryptography import x509
except ImportError:  # reported by the modules through missing_required_lib()
    pass

from .evidence import EvidenceError, parse_evidence, variant_of
from .policy import MeasurementPolicy
from .variants import VariantVerifier, VerificationError, VerificationResult


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

    def verify(self, document: object, nonce: bytes, *, report_data: bytes | None = None) -> VerificationResult:
        """The result of ``document`` (JSON text, bytes, a dict, or evidence a variant parsed or issued) checked by its
        variant against the policy and bound to ``nonce``; VerificationError otherwise. ``report_data`` (64 bytes)
        replaces the nonce binding for the variants that have a raw report-data mode (SEV-SNP, TDX): for reports whose
        report data a third party fixed, never for a node's evidence."""
        try:
            evidence = document if hasattr(document, "to_document") else parse_evidence(document)
            variant = variant_of(evidence.variant)
        except EvidenceError as exc:
            raise VerificationError("malformed", str(exc)) from None
        checks = self._variant_verifiers.get(variant.name)
        if checks is None:
            checks = self._variant_verifiers[variant.name] = variant.verifier(
                self.policy, self.ek_ca_certificates, self._now
            )
        if report_data is None:
            return checks.verify(evidence, nonce)
        if not checks.raw_report_data:
            raise VerificationError(
                "malformed", f"evidence variant {variant.name!r} binds only to a nonce: it has no raw report-data mode"
            )
        return checks.verify(evidence, nonce, report_data=report_data)
