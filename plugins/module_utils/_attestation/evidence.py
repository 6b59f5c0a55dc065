# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The evidence document's envelope: versioned JSON, base64 for bytes (DESIGN section 3). The envelope is the same
for every variant (``version``, ``variant``, ``user_data``) and names no variant's field: the variant the document
names (variants.py) parses the rest, its body."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json

from . import variants
from .eventlog import MAX_EVENT_LOG_BYTES

EVIDENCE_VERSION = 1
# 64 KiB for the quote and keys, and room for the firmware's event log in base64.
MAX_DOCUMENT_BYTES = 64 * 1024 + 4 * MAX_EVENT_LOG_BYTES // 3
USER_DATA_LIMIT = 4096
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


class EvidenceError(ValueError):
    """The evidence document is malformed; the message names the field."""


def variant_of(name: object) -> variants.Variant:
    """The registered variant called ``name``; EvidenceError naming it and the known ones otherwise."""
    variant = variants.find(name)
    if variant is None:
        raise EvidenceError(f"evidence variant {excerpt(name)} is not supported (known: {', '.join(variants.names())})")
    return variant


def qualifying_data(nonce: bytes, user_data: bytes) -> bytes:
    """SHA-256(nonce || SHA-256(user_data)): what the quote's extraData must hold."""
    return hashlib.sha256(nonce + hashlib.sha256(user_data).digest()).digest()


def report_data(nonce: bytes, user_data: bytes) -> bytes:
    """SHA-512(nonce || SHA-256(user_data)): what an SEV-SNP report's or a TDX quote's report data must hold."""
    return hashlib.sha512(nonce + hashlib.sha256(user_data).digest()).digest()


def b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def excerpt(value: object) -> str:
    """A value the caller sent, for a refusal: ASCII-escaped (as by ascii()) and cut to QUOTE_LIMIT characters."""
    return _cut(ascii(value))


def _cut(text: str) -> str:
    return text if len(text) <= QUOTE_LIMIT else f"{text[:QUOTE_LIMIT]}... ({len(text)} characters)"


def decode_b64(name: str, value: object, limit: int) -> bytes:
    """A base64 field of the document (any variant's), decoded; EvidenceError naming it when it is not canonical
    base64 of 1..``limit`` bytes."""
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
    # strict_mode has refused every other second spelling, so only the last group can differ: re-encode just that
    # (a 39 KB event log otherwise costs a whole re-encoding and comparison).
    if binascii.b2a_base64(decoded[-(len(decoded) % 3 or 3) :], newline=False) != value[-4:].encode():
        raise EvidenceError(f"evidence field {name!r} is not canonical base64 (padding bits set)")
    return decoded


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


def parse_evidence(document: object) -> variants.Evidence:
    """Validate the envelope's shape and size limits and hand the body to the document's variant; bytes, str and dict
    are accepted."""
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
    # A document naming no variant is named by its missing fields as one of the first registered (the issuer's default).
    variant = variants.find(document["variant"] if "variant" in document else variants.names()[0])
    keys = document.keys()
    required = ("version", "variant") + (variant.body_required if variant else ()) + ("user_data",)
    if not keys >= set(required):
        raise EvidenceError(f"evidence document lacks field(s): {', '.join(k for k in required if k not in document)}")
    if variant is not None:
        known = frozenset(required + variant.body_optional)
        if not keys <= known:
            # A dict from a caller may have keys of any type (YAML gives integers, dates, null): name them as text.
            unknown = ascii(", ".join(sorted(map(str, keys - known))))[1:-1]  # escaped, without ascii()'s quotes
            raise EvidenceError(f"evidence document has unknown field(s): {_cut(unknown)}")
    version = document["version"]
    # The integer itself: 1.0 and true compare equal to 1, and another reader may take them otherwise.
    if isinstance(version, bool) or not isinstance(version, int) or version != EVIDENCE_VERSION:
        raise EvidenceError(
            f"evidence version {excerpt(version)} is not supported (expected {EVIDENCE_VERSION}, an integer)"
        )
    variant = variant_of(document["variant"])
    user_data = decode_b64("user_data", document["user_data"], USER_DATA_LIMIT)
    return variant.parse_body(document, user_data)
