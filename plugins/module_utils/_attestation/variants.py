# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Evidence variants (DESIGN section 3): the kinds of hardware evidence, by the name an evidence document carries in
``variant``. The verifier and the issuer look the variant up here and hand it the work.

A variant is one file: a ``Variant`` subclass with its checks and its way of making evidence, registered under its
name, and imported by the package's ``__init__`` so that it is registered whatever is imported first. The TPM
(tpm_variant.py) is the first; SEV-SNP or TDX would each be another such file, plus its tests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the variants import this module
    import datetime
    from typing import Callable

    from cryptography import x509

    from .evidence import Evidence
    from .policy import MeasurementPolicy
    from .verifier import VerificationResult


class VariantVerifier:
    """Checks one variant's evidence against one measurement policy; made once per Verifier and variant."""

    def verify(self, evidence: Evidence, nonce: bytes) -> VerificationResult:
        """The result of every check, or VerificationError with the reason of the first that failed."""
        raise NotImplementedError


class Variant:
    """One kind of evidence: how a verifier checks it and how a node makes it."""

    name = ""

    def verifier(
        self,
        policy: MeasurementPolicy,
        ek_ca_certificates: list[x509.Certificate],
        now: Callable[[], datetime.datetime],
    ) -> VariantVerifier:
        raise NotImplementedError

    def issue(self, device: object, nonce: bytes, user_data: bytes, **options: object) -> Evidence:
        """Evidence from ``device`` (the variant's own: a TPM for the TPM variant) bound to ``nonce`` and ``user_data``."""
        raise NotImplementedError


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


def names() -> tuple[str, ...]:
    """The registered variants' names, the first registered first."""
    return tuple(_REGISTRY)


def find(name: object) -> Variant | None:
    """The variant registered as ``name``; None for any other name or a value that is no name."""
    return _REGISTRY.get(name) if isinstance(name, str) else None
