# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``tdx`` evidence variant (DESIGN section 3): an Intel TDX quote (v4 or v5, with its certification data) and
optionally the CCEL event log, checked by tdx.py against the policy's ``tdx`` section (``TdxPolicy``'s fields). The
quote's report data must be SHA-512(nonce || SHA-256(user_data)).

Body fields: ``quote`` (base64) and optional ``event_log`` (the CCEL area, base64). This variant verifies; a node's
TDX evidence comes from its guest, not from this collection yet."""

from __future__ import annotations

import json
from dataclasses import dataclass

from .eventlog import MAX_EVENT_LOG_BYTES
from .evidence import EVIDENCE_VERSION, EvidenceError, b64, decode_b64
from .variants import Variant, VariantVerifier, VerificationError, VerificationResult, policy_section, register

try:
    from . import tdx
except ImportError as exc:  # cryptography is missing: the modules report it through missing_required_lib()
    CORE_IMPORT_ERROR: ImportError | None = exc
else:
    CORE_IMPORT_ERROR = None

QUOTE_LIMIT = 32 * 1024  # a quote with its PCK chain is about 5 KiB


@dataclass(frozen=True)
class TdxEvidence:
    variant: str
    quote: bytes
    user_data: bytes
    event_log: bytes | None = None

    def to_document(self) -> dict:
        document = {
            "version": EVIDENCE_VERSION,
            "variant": self.variant,
            "user_data": b64(self.user_data),
            "quote": b64(self.quote),
        }
        if self.event_log is not None:
            document["event_log"] = b64(self.event_log)
        return document

    def to_json(self) -> str:
        return json.dumps(self.to_document(), sort_keys=True)


def read_policy(section: dict) -> tdx.TdxPolicy:
    """The policy of the policy file's tdx section; VerificationError naming the field."""
    if CORE_IMPORT_ERROR is not None:
        raise VerificationError(
            "dependency", f"cryptography >= 47 is required to verify TDX evidence: {CORE_IMPORT_ERROR}"
        )
    try:
        return tdx.TdxPolicy.from_dict(dict(section))
    except tdx.TdxError as exc:
        raise VerificationError(exc.reason, str(exc)) from None


class TdxVerifier(VariantVerifier):
    raw_report_data = True

    def __init__(self, policy: object, now) -> None:
        self.policy = read_policy(policy_section(policy, TdxVariant.name))
        self._now = now

    def verify(self, evidence: TdxEvidence, nonce: bytes, report_data: bytes | None = None) -> VerificationResult:
        binding = (
            {"report_data": report_data}
            if report_data is not None
            else {"nonce": nonce, "user_data": evidence.user_data}
        )
        try:
            result = tdx.verify(evidence.quote, self.policy, now=self._now(), event_log=evidence.event_log, **binding)
        except tdx.TdxError as exc:
            raise VerificationError(exc.reason, str(exc)) from None
        if result.differences:
            raise VerificationError(
                result.differences[0].reason,
                "TDX quote differs from the policy: " + "; ".join(d.message for d in result.differences),
                [d.to_result() for d in result.differences],
            )
        measurements = {name: bytes.fromhex(value) for name, value in result.measurements.items()}
        # The PCK leaf names the platform that vouches for the TD.
        return VerificationResult(evidence, bytes.fromhex(result.identity["pck_sha256"]), 1, measurements, [])


class TdxVariant(Variant):
    name = "tdx"
    body_required = ("quote",)
    body_optional = ("event_log",)
    policy_section = True

    def parse_body(self, document: dict, user_data: bytes) -> TdxEvidence:
        quote = decode_b64("quote", document["quote"], QUOTE_LIMIT)
        event_log = None
        if "event_log" in document:
            event_log = decode_b64("event_log", document["event_log"], MAX_EVENT_LOG_BYTES)
        return TdxEvidence(self.name, quote, user_data, event_log)

    def read_policy_section(self, section: dict) -> tdx.TdxPolicy:
        return read_policy(section)

    def verifier(self, policy: object, ek_ca_certificates: list, now) -> TdxVerifier:
        return TdxVerifier(policy, now)

    def issue(self, device: object, nonce: bytes, user_data: bytes, **options: object) -> TdxEvidence:
        raise EvidenceError("TDX evidence comes from the guest; this collection only verifies it")


TDX = register(TdxVariant())
