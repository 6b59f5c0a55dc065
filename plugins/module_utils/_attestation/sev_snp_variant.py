# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``sev-snp`` evidence variant (DESIGN section 3): an AMD SEV-SNP attestation report and the VCEK/VLEK
certificate that signed it, checked by sev_snp.py against the policy's ``sev-snp`` section (the keys of
``SevSnpPolicy`` plus ``chain``, the PEM of the product's ASK and ARK that the operator pins). The report's
REPORT_DATA must be SHA-512(nonce || SHA-256(user_data)).

Body fields: ``report`` (the 1184-byte ATTESTATION_REPORT, base64) and ``certificate`` (the VCEK or VLEK, DER,
base64). This variant verifies; a node's SNP evidence comes from its guest firmware, not from this collection yet."""

from __future__ import annotations

import json
from dataclasses import dataclass

from .evidence import EVIDENCE_VERSION, EvidenceError, b64, decode_b64
from .variants import Variant, VariantVerifier, VerificationError, VerificationResult, policy_section, register

try:
    from . import sev_snp
except ImportError as exc:  # cryptography is missing: the modules report it through missing_required_lib()
    CORE_IMPORT_ERROR: ImportError | None = exc
else:
    CORE_IMPORT_ERROR = None

SECTION = "sev-snp"
CERTIFICATE_LIMIT = 8192


@dataclass(frozen=True)
class SevSnpEvidence:
    variant: str
    report: bytes
    certificate: bytes
    user_data: bytes

    def to_document(self) -> dict:
        return {
            "version": EVIDENCE_VERSION,
            "variant": self.variant,
            "user_data": b64(self.user_data),
            "report": b64(self.report),
            "certificate": b64(self.certificate),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_document(), sort_keys=True)


def _require_core() -> None:
    if CORE_IMPORT_ERROR is not None:
        raise VerificationError(
            "dependency", f"cryptography >= 47 is required to verify SEV-SNP evidence: {CORE_IMPORT_ERROR}"
        )


def read_policy(section: dict) -> tuple[sev_snp.AmdChain, sev_snp.SevSnpPolicy]:
    """The pinned chain and the policy of the policy file's sev-snp section; VerificationError naming the key."""
    _require_core()
    fields = dict(section)
    chain = fields.pop("chain", None)
    try:
        if not isinstance(chain, str):
            raise sev_snp.SevSnpError(
                "snp-policy-invalid", "chain (the PEM of the product's ASK and ARK, pinned) is required"
            )
        return sev_snp.AmdChain.from_pem(chain.encode()), sev_snp.SevSnpPolicy.from_dict(fields)
    except sev_snp.SevSnpError as exc:
        raise VerificationError(exc.reason, str(exc)) from None


class SevSnpVerifier(VariantVerifier):
    raw_report_data = True

    def __init__(self, policy: object, now) -> None:
        self.chain, self.policy = read_policy(policy_section(policy, SECTION))
        self._now = now

    def verify(self, evidence: SevSnpEvidence, nonce: bytes, report_data: bytes | None = None) -> VerificationResult:
        binding = (
            {"report_data": report_data}
            if report_data is not None
            else {"nonce": nonce, "user_data": evidence.user_data}
        )
        try:
            result = sev_snp.verify_report(
                evidence.report, evidence.certificate, self.chain, self.policy, self._now(), **binding
            )
        except sev_snp.SevSnpError as exc:
            raise VerificationError(exc.reason, str(exc)) from None
        if result.differences:
            listed = "; ".join(str(difference) for difference in result.differences)
            mismatches = [
                {"reason": d.reason, "field": d.field, "expected": d.expected, "actual": d.actual}
                for d in result.differences
            ]
            raise VerificationError(
                result.differences[0].reason, f"SEV-SNP report differs from the policy: {listed}", mismatches
            )
        return VerificationResult(evidence, result.identity, 1, dict(result.measurements), [])


class SevSnpVariant(Variant):
    name = SECTION
    body_required = ("report", "certificate")
    policy_section = True

    def parse_body(self, document: dict, user_data: bytes) -> SevSnpEvidence:
        _require_core()
        report = decode_b64("report", document["report"], sev_snp.REPORT_SIZE)
        certificate = decode_b64("certificate", document["certificate"], CERTIFICATE_LIMIT)
        return SevSnpEvidence(self.name, report, certificate, user_data)

    def read_policy_section(self, section: dict) -> tuple[sev_snp.AmdChain, sev_snp.SevSnpPolicy]:
        return read_policy(section)

    def verifier(self, policy: object, ek_ca_certificates: list, now) -> SevSnpVerifier:
        return SevSnpVerifier(policy, now)

    def issue(self, device: object, nonce: bytes, user_data: bytes, **options: object) -> SevSnpEvidence:
        raise EvidenceError("SEV-SNP evidence comes from the guest's firmware; this collection only verifies it")


SEV_SNP = register(SevSnpVariant())
