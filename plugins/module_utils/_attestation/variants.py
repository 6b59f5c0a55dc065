# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Evidence variants (DESIGN section 3): the kinds of hardware evidence, by the name an evidence document carries in
``variant``. The envelope (evidence.py), the verifier and the issuer look the variant up here and hand it the work.

This module sits at the bottom of ``_attestation``: it owns what every variant answers with (``VerificationResult``,
``VerificationError``) and imports nothing of the package, so that every variant, the envelope and the verifier import
it and it imports none of them.

A variant is one file: a ``Variant`` subclass that parses its own body of the evidence document, checks it against
its own section of the measurement policy and makes its evidence, registered under its name, and imported by the
package's ``__init__`` so that it is registered whatever is imported first: ``tpm`` (tpm_variant.py, its body and EK
checks in tpm_evidence.py), ``sev-snp`` (sev_snp_variant.py over sev_snp.py), ``tdx`` (tdx_variant.py over tdx.py).
"""

from __future__ import annotations

import datetime
from typing import Callable, NamedTuple, Protocol


class Evidence(Protocol):
    """What every variant's parsed evidence offers: its variant's name, the bound user data, and its document."""

    @property
    def variant(self) -> str: ...

    @property
    def user_data(self) -> bytes: ...

    def to_document(self) -> dict: ...

    def to_json(self) -> str: ...


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


class VerificationResult(NamedTuple):
    """What a verify established, the same for every variant (immutable; a tuple, made on every verify, so cheaper to
    build than a frozen dataclass): the evidence, the identity it proves (the TPM's AK name, the SNP chip ID, the TDX
    platform's PCK), how far that identity is trusted, the measurements by name (the TPM's by PCR index), the policy
    differences that only warn, and the challenge still to be answered before the identity is proven (or None)."""

    evidence: Evidence
    identity: bytes
    trust_level: int
    measurements: dict
    warnings: list[dict]
    challenge: object | None = None

    @property
    def variant(self) -> str:
        return self.evidence.variant

    @property
    def user_data(self) -> bytes:
        return self.evidence.user_data

    def to_result(self) -> dict:
        return {
            "verified": self.challenge is None,
            "reason": "activation-required" if self.challenge else "ok",
            "variant": self.evidence.variant,
            "identity": self.identity.hex(),
            "trust_level": self.trust_level,
            "measurements": {str(name): value.hex() for name, value in sorted(self.measurements.items())},
            "mismatches": [],
            "warnings": self.warnings,
        }


class VariantVerifier:
    """Checks one variant's evidence against one measurement policy; made once per Verifier and variant."""

    # Whether verify takes report_data: the 64 bytes a report must carry instead of the nonce binding (for evidence
    # whose report data a third party fixed, such as published real reports).
    raw_report_data = False

    def verify(self, evidence: Evidence, nonce: bytes) -> VerificationResult:
        """The result of every check, or VerificationError with the reason of the first that failed."""
        raise NotImplementedError


class Variant:
    """One kind of evidence: the fields of its body, how it parses them, how a verifier checks it, how a node makes
    it."""

    name = ""
    body_required: tuple[str, ...] = ()
    body_optional: tuple[str, ...] = ()
    # Whether the measurement policy has a section of this variant's name (policy.py keeps it for the variant to read);
    # the TPM's rules are the policy's top level.
    policy_section = False

    def parse_body(self, document: dict, user_data: bytes) -> Evidence:
        """The evidence of a document whose envelope (version, variant, user_data) evidence.py has checked and whose
        keys are the envelope's and this variant's; EvidenceError naming the field that is wrong."""
        raise NotImplementedError

    def read_policy_section(self, section: dict) -> object:
        """This variant's section of the measurement policy, read (for a variant with ``policy_section``);
        VerificationError naming the field that is wrong. policy.py calls it when it reads a policy file."""
        raise NotImplementedError

    def verifier(
        self,
        policy: object,  # the MeasurementPolicy (policy.py): its rules and this variant's section
        ek_ca_certificates: list,  # x509 certificates, for the variants whose identity chains to an EK CA
        now: Callable[[], datetime.datetime],
    ) -> VariantVerifier:
        raise NotImplementedError

    def issue(self, device: object, nonce: bytes, user_data: bytes, **options: object) -> Evidence:
        """Evidence from ``device`` (the variant's own: a TPM for the TPM variant) bound to ``nonce`` and ``user_data``."""
        raise NotImplementedError


def policy_section(policy: object, name: str) -> dict:
    """The measurement policy's section of the variant ``name`` (``sev-snp``, ``tdx``: policy.py keeps them as the file
    has them); VerificationError ``policy`` when the policy has none, so it accepts none of that variant's evidence."""
    section = getattr(policy, "variant_sections", {}).get(name)
    if section is None:
        raise VerificationError(
            "policy", f"the measurement policy has no {name!r} section, so it accepts no {name} evidence"
        )
    return section


_REGISTRY: dict[str, Variant] = {}


def register(variant: Variant) -> Variant:
    """Make ``variant`` known under its name (once: a second variant of the same name is refused)."""
    if not variant.name or variant.name in _REGISTRY:
        raise ValueError(
            f"an evidence variant needs a name of its own, and {variant.name!r} is empty or taken "
            f"(registered: {', '.join(_REGISTRY)})"
        )
    _REGISTRY[variant.name] = variant
    return variant


def policy_sections() -> tuple[str, ...]:
    """The names of the registered variants that read a section of the measurement policy of their name."""
    return tuple(name for name, variant in _REGISTRY.items() if variant.policy_section)


def names() -> tuple[str, ...]:
    """The registered variants' names, the first registered first."""
    return tuple(_REGISTRY)


def find(name: object) -> Variant | None:
    """The variant registered as ``name``; None for any other name or a value that is no name."""
    return _REGISTRY.get(name) if isinstance(name, str) else None
