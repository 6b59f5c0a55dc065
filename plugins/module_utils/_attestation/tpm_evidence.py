# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The TPM variant's room beside its checks (tpm_variant.py): the body of a ``tpm`` evidence document (DESIGN section
3: ``ak_public``, ``quote``, ``signature``, ``pcrs``, optional ``ek_public``, ``ek_certificate``, ``event_log``), the
EK's identity checks and the credential challenge that proves the AK sits beside the EK. The envelope around the body
is evidence.py's; nothing outside the TPM variant reads these fields."""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass, field
from typing import NamedTuple

from . import tpm2
from .evidence import EVIDENCE_VERSION, EvidenceError, b64, decode_b64, excerpt
from .eventlog import MAX_EVENT_LOG_BYTES
from .variants import VerificationError, VerificationResult

PCR_INDICES = range(24)
_PCR_INDEX_NAMES = {str(i): i for i in PCR_INDICES}
FIELD_LIMITS = {
    "ak_public": 1024,
    "quote": 1024,
    "signature": 1024,
    "ek_public": 1024,
    "ek_certificate": 8192,
    "event_log": MAX_EVENT_LOG_BYTES,
}
BODY_REQUIRED = ("ak_public", "quote", "signature", "pcrs")
BODY_OPTIONAL = ("ek_public", "ek_certificate", "event_log")
_BANKS = {"sha1": 20, "sha256": 32, "sha384": 48, "sha512": 64}
# Decoded PCR values by their exact base64 text, per bank: the same values come again and again (each join of a
# node, every node of one image). Only values of the bank's size go in; a full cache is emptied.
_DECODED_PCRS: dict[str, dict[str, bytes]] = {bank: {} for bank in _BANKS}
_DECODED_PCRS_LIMIT = 1024
# Per bank, the bank decoded last and the exact text it came from: a node attesting again, and the next node of the
# same image, send the same bank, and comparing it whole costs less than hashing each value to look it up above.
_LAST_BANK: dict[str, tuple[dict, dict[int, bytes]]] = {}
_NO_BANK: tuple[dict, dict[int, bytes]] = ({}, {})  # before the first: an empty bank's text and what it decodes to

EK_REQUIRED_ATTRIBUTES = {
    "restricted": tpm2.ATTR_RESTRICTED,
    "decrypt": tpm2.ATTR_DECRYPT,
    "fixedTPM": tpm2.ATTR_FIXED_TPM,
}


class TpmEvidence(NamedTuple):
    """A parsed ``tpm`` evidence document (immutable; a tuple, made on every verify, so cheaper to build than a frozen
    dataclass)."""

    variant: str
    ak_public: bytes
    quote: bytes
    signature: bytes
    pcrs: dict[str, dict[int, bytes]]
    user_data: bytes
    ek_public: bytes | None = None
    ek_certificate: bytes | None = None
    event_log: bytes | None = None  # the TCG crypto-agile event log as the node read it (parsed by the verifier)

    def to_document(self) -> dict:
        doc = {
            "version": EVIDENCE_VERSION,
            "variant": self.variant,
            "ak_public": b64(self.ak_public),
            "quote": b64(self.quote),
            "signature": b64(self.signature),
            "pcrs": {bank: {str(i): b64(v) for i, v in sorted(values.items())} for bank, values in self.pcrs.items()},
            "user_data": b64(self.user_data),
        }
        if self.ek_public is not None:
            doc["ek_public"] = b64(self.ek_public)
        if self.ek_certificate is not None:
            doc["ek_certificate"] = b64(self.ek_certificate)
        if self.event_log:
            doc["event_log"] = b64(self.event_log)
        return doc

    def to_json(self) -> str:
        return json.dumps(self.to_document(), sort_keys=True)


def parse_body(document: dict, user_data: bytes) -> TpmEvidence:
    """The TPM body of an evidence document whose envelope evidence.py has checked."""
    ak_public = decode_b64("ak_public", document["ak_public"], FIELD_LIMITS["ak_public"])
    quote = decode_b64("quote", document["quote"], FIELD_LIMITS["quote"])
    signature = decode_b64("signature", document["signature"], FIELD_LIMITS["signature"])
    ek_public, ek_certificate = document.get("ek_public"), document.get("ek_certificate")
    if ek_public is not None:
        ek_public = decode_b64("ek_public", ek_public, FIELD_LIMITS["ek_public"])
    if ek_certificate is not None:
        ek_certificate = decode_b64("ek_certificate", ek_certificate, FIELD_LIMITS["ek_certificate"])
    pcrs = _parse_pcrs(document["pcrs"])
    event_log = None
    if "event_log" in document:
        event_log = decode_b64("event_log", document["event_log"], FIELD_LIMITS["event_log"])
        if len(event_log) > MAX_EVENT_LOG_BYTES:  # the text check lets up to 3 bytes more through
            raise EvidenceError(f"evidence field 'event_log' is larger than {MAX_EVENT_LOG_BYTES} bytes")
    return TpmEvidence(
        document["variant"], ak_public, quote, signature, pcrs, user_data, ek_public, ek_certificate, event_log
    )


def _parse_pcrs(value: object) -> dict[str, dict[int, bytes]]:
    if not isinstance(value, dict) or not value:
        raise EvidenceError("evidence field 'pcrs' must be a non-empty object of bank -> index -> value")
    banks: dict[str, dict[int, bytes]] = {}
    for bank, entries in value.items():
        if bank not in _BANKS:
            raise EvidenceError(f"evidence PCR bank {excerpt(bank)} is not one of {', '.join(_BANKS)}")
        if not isinstance(entries, dict):
            raise EvidenceError(f"evidence PCR bank {bank!r} must be an object of index -> value")
        last_text, last_decoded = _LAST_BANK.get(bank, _NO_BANK)
        if entries == last_text:
            banks[bank] = dict(last_decoded)
            continue
        known = _DECODED_PCRS[bank]
        try:
            decoded = {_PCR_INDEX_NAMES[index]: known[pcr_value] for index, pcr_value in entries.items()}
        except (KeyError, TypeError):  # an index that is not 0..23, a value not seen yet or not text
            decoded = _parse_bank(bank, entries, known)
        # Copies, as the caller may change its document, and the evidence it gets back, after this.
        _LAST_BANK[bank] = (dict(entries), decoded)
        banks[bank] = dict(decoded)
    return banks


def _parse_bank(bank: str, entries: dict, known: dict[str, bytes]) -> dict[int, bytes]:
    """A bank entry by entry, with a message naming the first bad index or value; good values are remembered."""
    size = _BANKS[bank]
    parsed: dict[int, bytes] = {}
    for index, pcr_value in entries.items():
        number = _PCR_INDEX_NAMES.get(index) if isinstance(index, str) else None
        if number is None:
            raise EvidenceError(f"evidence PCR index {excerpt(index)} in bank {bank!r} is not 0..23")
        raw = decode_b64(f"pcrs.{bank}.{index}", pcr_value, size)
        if len(raw) != size:
            raise EvidenceError(f"evidence PCR {bank}:{index} has {len(raw)} bytes, expected {size}")
        parsed[number] = raw
    if len(known) + len(parsed) > _DECODED_PCRS_LIMIT:
        known.clear()
    known.update(zip(entries.values(), parsed.values()))
    return parsed


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


class TpmResult(VerificationResult):
    """A verified TPM quote: the common result, named as the TPM names it (the AK's name is the identity, the PCRs
    of the policy's bank the measurements), and answered in the shape the TPM's callers have always read."""

    __slots__ = ()

    @property
    def ak_name(self) -> bytes:
        return self.identity

    @property
    def ak_trust_level(self) -> int:
        return self.trust_level

    @property
    def pcrs(self) -> dict[int, bytes]:
        return self.measurements

    def to_result(self) -> dict:
        return {
            "verified": self.challenge is None,
            "reason": "activation-required" if self.challenge else "ok",
            "ak_name": self.identity.hex(),
            "ak_trust_level": self.trust_level,
            "pcrs": {str(i): v.hex() for i, v in sorted(self.measurements.items())},
            "mismatches": [],
            "warnings": self.warnings,
        }


def check_ek_template(ek: tpm2.Public) -> None:
    """The EK must be the TCG default EK template of its key type (what an EK certificate certifies): attributes,
    authPolicy and parameters byte for byte. Raises VerificationError ``ek-template``."""
    problem = tpm2.ek_template_problem(ek)
    if problem is not None:
        raise VerificationError(
            "ek-template", f"the evidence's EK is not an endorsement key as its certificate implies: {problem}"
        )
