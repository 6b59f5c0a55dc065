# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The evidence document: versioned JSON, base64 for bytes (DESIGN section 3)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from typing import NamedTuple

from . import variants
from .eventlog import MAX_EVENT_LOG_BYTES

EVIDENCE_VERSION = 1
# 64 KiB for the quote and keys, and room for the firmware's event log in base64.
MAX_DOCUMENT_BYTES = 64 * 1024 + 4 * MAX_EVENT_LOG_BYTES // 3
PCR_INDICES = range(24)
_PCR_INDEX_NAMES = {str(i): i for i in PCR_INDICES}
_FIELD_LIMITS = {
    "ak_public": 1024,
    "quote": 1024,
    "signature": 1024,
    "user_data": 4096,
    "ek_public": 1024,
    "ek_certificate": 8192,
    "event_log": MAX_EVENT_LOG_BYTES,
}
_REQUIRED = ("version", "variant", "ak_public", "quote", "signature", "pcrs", "user_data")
_OPTIONAL = ("ek_public", "ek_certificate", "event_log")
_REQUIRED_SET = frozenset(_REQUIRED)
_KNOWN = frozenset(_REQUIRED + _OPTIONAL)
_BANKS = {"sha1": 20, "sha256": 32, "sha384": 48, "sha512": 64}
# A genuine document nests three deep (document, pcrs, bank) and holds a handful of objects: more containers than this
# are refused before the JSON parser sees them, so no depth reaches its recursion.
MAX_CONTAINERS = 32
# Refusals quote at most this many characters of what the caller sent.
QUOTE_LIMIT = 64


class _DuplicateKey(Exception):
    """An object repeats a key (not a ValueError: the JSON decoder's own errors are those)."""


def _unique_keys(pairs: list) -> dict:
    document = dict(pairs)
    if len(document) != len(pairs):
        seen = set()
        for key, _value in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return document


_JSON = json.JSONDecoder(object_pairs_hook=_unique_keys)
_JSON_WHITESPACE = " \t\n\r"
# Decoded PCR values by their exact base64 text, per bank: the same values come again and again (each join of a
# node, every node of one image). Only values of the bank's size go in; a full cache is emptied.
_DECODED_PCRS: dict[str, dict[str, bytes]] = {bank: {} for bank in _BANKS}
_DECODED_PCRS_LIMIT = 1024
# Per bank, the bank decoded last and the exact text it came from: a node attesting again, and the next node of the
# same image, send the same bank, and comparing it whole costs less than hashing each value to look it up above.
_LAST_BANK: dict[str, tuple[dict, dict[int, bytes]]] = {}
_NO_BANK: tuple[dict, dict[int, bytes]] = ({}, {})  # before the first: an empty bank's text and what it decodes to


class EvidenceError(ValueError):
    """The evidence document is malformed; the message names the field."""


class Evidence(NamedTuple):
    """A parsed evidence document (immutable; a tuple, made on every verify, so cheaper to build than a frozen dataclass)."""

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
            "ak_public": _b64(self.ak_public),
            "quote": _b64(self.quote),
            "signature": _b64(self.signature),
            "pcrs": {bank: {str(i): _b64(v) for i, v in sorted(values.items())} for bank, values in self.pcrs.items()},
            "user_data": _b64(self.user_data),
        }
        if self.ek_public is not None:
            doc["ek_public"] = _b64(self.ek_public)
        if self.ek_certificate is not None:
            doc["ek_certificate"] = _b64(self.ek_certificate)
        if self.event_log:
            doc["event_log"] = _b64(self.event_log)
        return doc

    def to_json(self) -> str:
        return json.dumps(self.to_document(), sort_keys=True)


def variant_of(name: object) -> variants.Variant:
    """The registered variant called ``name``; EvidenceError naming it and the known ones otherwise."""
    variant = variants.find(name)
    if variant is None:
        raise EvidenceError(f"evidence variant {excerpt(name)} is not supported (known: {', '.join(variants.names())})")
    return variant


def qualifying_data(nonce: bytes, user_data: bytes) -> bytes:
    """SHA-256(nonce || SHA-256(user_data)): what the quote's extraData must hold."""
    return hashlib.sha256(nonce + hashlib.sha256(user_data).digest()).digest()


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def excerpt(value: object) -> str:
    """A value the caller sent, for a refusal: ASCII-escaped (as by ascii()) and cut to QUOTE_LIMIT characters."""
    return _cut(ascii(value))


def _cut(text: str) -> str:
    return text if len(text) <= QUOTE_LIMIT else f"{text[:QUOTE_LIMIT]}... ({len(text)} characters)"


def _decode_b64(name: str, value: object, limit: int) -> bytes:
    if not isinstance(value, str):
        raise EvidenceError(f"evidence field {name!r} must be a base64 string, got {type(value).__name__}")
    if len(value) > (limit * 4) // 3 + 4:
        raise EvidenceError(f"evidence field {name!r} is larger than {limit} bytes")
    try:
        decoded = binascii.a2b_base64(value, strict_mode=True)
    except (binascii.Error, ValueError):
        raise EvidenceError(f"evidence field {name!r} is not valid base64") from None
    if not decoded:
        raise EvidenceError(f"evidence field {name!r} is empty")
    # One text per value: padding bits set, as in "QR==", decode like "QQ==" (and a relay could tell them apart).
    if binascii.b2a_base64(decoded, newline=False) != value.encode():
        raise EvidenceError(f"evidence field {name!r} is not canonical base64 (padding bits set)")
    return decoded


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
        raw = _decode_b64(f"pcrs.{bank}.{index}", pcr_value, size)
        if len(raw) != size:
            raise EvidenceError(f"evidence PCR {bank}:{index} has {len(raw)} bytes, expected {size}")
        parsed[number] = raw
    if len(known) + len(parsed) > _DECODED_PCRS_LIMIT:
        known.clear()
    known.update(zip(entries.values(), parsed.values()))
    return parsed


def _load_text(document: str) -> object:
    # A genuine document is ASCII (JSON escapes the rest): its length is its UTF-8 size and it holds no lone surrogate.
    if document.isascii():
        size = len(document)
    else:
        try:
            size = len(document.encode())
        except UnicodeEncodeError as exc:
            raise EvidenceError(
                f"evidence document is not valid Unicode text (a lone surrogate at character {exc.start})"
            ) from None
    if size > MAX_DOCUMENT_BYTES:
        raise EvidenceError(f"evidence document is larger than {MAX_DOCUMENT_BYTES} bytes")
    if document.count("{") + document.count("[") > MAX_CONTAINERS:
        raise EvidenceError(
            f"evidence document holds more than {MAX_CONTAINERS} objects and arrays (or nests them deeper)"
        )
    try:
        return _decode_json(document)
    except _DuplicateKey as exc:
        raise EvidenceError(f"evidence document repeats the key {excerpt(exc.args[0])} in one object") from None
    except (ValueError, RecursionError):
        raise EvidenceError("evidence document is not valid JSON") from None


def _decode_json(text: str) -> object:
    """json.loads, straight to its C scanner when the value starts the text (as it does in a document we issue);
    anything else, errors included, goes the whole way so that the answer is json.loads's own."""
    try:
        value, end = _JSON.scan_once(text, 0)
    except (StopIteration, ValueError):
        return _JSON.decode(text)
    if end != len(text) and text[end:].strip(_JSON_WHITESPACE):
        return _JSON.decode(text)
    return value


def check_containers(document: object, what: str = "evidence document") -> None:
    """At most MAX_CONTAINERS dicts and lists, counted without recursion: a document nested hundreds deep is refused
    before anything (json.dumps, Ansible's argument validation, deepcopy) recurses into it."""
    pending, seen = [document], 0
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, (list, tuple)):
            pending.extend(value)
        else:
            continue
        seen += 1
        if seen > MAX_CONTAINERS:
            raise EvidenceError(f"{what} holds more than {MAX_CONTAINERS} objects and arrays (or nests them deeper)")


def _check_object_size(document: dict) -> None:
    check_containers(document)
    try:
        size = len(json.dumps(document, ensure_ascii=False).encode())
    except UnicodeEncodeError as exc:
        raise EvidenceError(
            f"evidence document holds text that is not valid Unicode (a lone surrogate: {exc.object[exc.start : exc.end]!r})"
        ) from None
    except (TypeError, ValueError, RecursionError):
        raise EvidenceError("evidence document holds values that are not JSON") from None
    if size > MAX_DOCUMENT_BYTES:
        raise EvidenceError(f"evidence document is larger than {MAX_DOCUMENT_BYTES} bytes")


def parse_evidence(document: object) -> Evidence:
    """Validate shape and size limits; bytes, str and dict are accepted."""
    if isinstance(document, str):
        document = _load_text(document)
    elif isinstance(document, (bytes, bytearray)):
        if len(document) > MAX_DOCUMENT_BYTES:
            raise EvidenceError(f"evidence document is larger than {MAX_DOCUMENT_BYTES} bytes")
        try:
            text = document.decode()
        except UnicodeDecodeError:
            raise EvidenceError("evidence document is not UTF-8") from None
        document = _load_text(text)
    elif isinstance(document, dict):
        _check_object_size(document)
    if not isinstance(document, dict):
        raise EvidenceError(f"evidence document must be a JSON object, got {type(document).__name__}")
    keys = document.keys()
    if not keys >= _REQUIRED_SET:
        raise EvidenceError(f"evidence document lacks field(s): {', '.join(k for k in _REQUIRED if k not in document)}")
    if not keys <= _KNOWN:
        # A dict from a caller may have keys of any type (YAML gives integers, dates, null): name them as text.
        unknown = ascii(", ".join(sorted(map(str, keys - _KNOWN))))[1:-1]  # escaped, without ascii()'s quotes
        raise EvidenceError(f"evidence document has unknown field(s): {_cut(unknown)}")
    version = document["version"]
    # The integer itself: 1.0 and true compare equal to 1, and another reader may take them otherwise.
    if isinstance(version, bool) or not isinstance(version, int) or version != EVIDENCE_VERSION:
        raise EvidenceError(
            f"evidence version {excerpt(version)} is not supported (expected {EVIDENCE_VERSION}, an integer)"
        )
    variant_of(document["variant"])
    ak_public = _decode_b64("ak_public", document["ak_public"], _FIELD_LIMITS["ak_public"])
    quote = _decode_b64("quote", document["quote"], _FIELD_LIMITS["quote"])
    signature = _decode_b64("signature", document["signature"], _FIELD_LIMITS["signature"])
    user_data = _decode_b64("user_data", document["user_data"], _FIELD_LIMITS["user_data"])
    ek_public, ek_certificate = document.get("ek_public"), document.get("ek_certificate")
    if ek_public is not None:
        ek_public = _decode_b64("ek_public", ek_public, _FIELD_LIMITS["ek_public"])
    if ek_certificate is not None:
        ek_certificate = _decode_b64("ek_certificate", ek_certificate, _FIELD_LIMITS["ek_certificate"])
    pcrs = _parse_pcrs(document["pcrs"])
    event_log = None
    if "event_log" in document:
        event_log = _decode_b64("event_log", document["event_log"], _FIELD_LIMITS["event_log"])
        if len(event_log) > MAX_EVENT_LOG_BYTES:  # the text check lets up to 3 bytes more through
            raise EvidenceError(f"evidence field 'event_log' is larger than {MAX_EVENT_LOG_BYTES} bytes")
    return Evidence(
        document["variant"], ak_public, quote, signature, pcrs, user_data, ek_public, ek_certificate, event_log
    )
