# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Runtime integrity, the verifier core: the kernel's IMA measurement list replayed to PCR 10 and every entry checked
against a runtime policy in Keylime's format (issue 38, items 1-3).

Scope: this file parses, replays and checks; it does not read the log off a node, put it into evidence or store the
incremental state anywhere (the evidence, the join service and the continuous loop do not send or check IMA yet).

Binary measurement list (``/sys/kernel/security/ima/binary_runtime_measurements``, integers little-endian): per entry
PCR index u32, template hash (20 bytes in that list, the SHA-1 of the template data; 32 in
``binary_runtime_measurements_sha256``), template name length u32 and name, template data length u32 and the data,
which is the template's fields, each u32 length + bytes. Templates read: ``ima-ng`` (d-ng, n-ng), ``ima-sig`` (d-ng,
n-ng, sig) and ``ima-buf`` (d-ng, n-ng, buf); d-ng is ``<algorithm>:\\0`` + digest, n-ng the path with its NUL.
The ASCII list (``ascii_runtime_measurements``) is read too, rebuilt into the same template data.

Replay (the kernel's ``ima_pcr_extend``, Keylime's ``keylime/ima/ast.py``): a bank whose algorithm is the list's
template-hash algorithm is extended with the template hash, any other bank with that bank's hash of the template data;
a violation entry (ToMToU or open-writers, template hash all zero) is extended as all 0xFF in every bank. As Keylime
does, the quoted PCR 10 may lag the log: the replay matches at the first entry where it equals the quote, and the
incremental state advances to that entry only.

Runtime policy (Keylime 7's ``keylime-policy create runtime``): ``digests`` {path: [hex, ...]}, ``excludes`` (Python
regular expressions, matched with ``re.match`` on the path as one alternation, like Keylime), ``keyrings`` and
``ima-buf`` {name: [hex, ...]}, ``ima`` {``ignored_keyrings``, ``log_hash_alg``, ``dm_policy``}; the older allowlist
(JSON ``{"hashes": ...}`` or ``sha256sum``-style text) plus an exclude list. As in Keylime, a digest is compared as hex
whatever algorithm the entry names, a violation entry is a failure, an ``ima-sig`` entry is checked by its digest
(signatures are parsed, not verified: ``verification-keys`` is read but not used, so a file allowed only by its
signature is refused here while Keylime accepts it), and an ``ima-buf`` entry carrying a key is checked against
``keyrings`` unless its keyring is ignored, any other against ``ima-buf``. Unlike Keylime, the boot aggregate (the
first entry of a list, path ``boot_aggregate``) must match the quoted PCRs: the kernel's hash of PCRs 0-7 for SHA-1,
of PCRs 0-9 for other banks (0-7 also accepted, as older kernels wrote), never a value the policy lists.

Standard library only, plus ``cryptography`` to tell whether an ``ima-buf`` entry carries a key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import struct
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

IMA_PCR = 10
MAX_LOG_BYTES = 64 * 1024 * 1024
MAX_ENTRIES = 500_000
MAX_TEMPLATE_NAME = 16
MAX_TEMPLATE_DATA = 64 * 1024
MAX_POLICY_BYTES = 64 * 1024 * 1024
MAX_POLICY_PATHS = 1_000_000
MAX_DIGESTS_PER_PATH = 64
MAX_EXCLUDES = 1024
MAX_EXCLUDE_LENGTH = 1024
MAX_NAMED_FAILURES = 10
SUPPORTED_POLICY_VERSION = 1
DIGEST_SIZES = {"md5": 16, "sha1": 20, "sha256": 32, "sha384": 48, "sha512": 64, "sm3": 32}
BANKS = ("sha1", "sha256", "sha384", "sha512")
TEMPLATE_FIELDS = {"ima-ng": 2, "ima-sig": 3, "ima-buf": 3}
BOOT_AGGREGATE = "boot_aggregate"

IMA_MALFORMED = "ima-malformed"
IMA_LOG_MISMATCH = "ima-log-mismatch"
RUNTIME_POLICY = "runtime-policy"
IMA_BOOT_AGGREGATE = "ima-boot-aggregate"
IMA_LIMITS = "ima-limits"
REASONS = (IMA_MALFORMED, IMA_LOG_MISMATCH, RUNTIME_POLICY, IMA_BOOT_AGGREGATE, IMA_LIMITS)

_U32 = struct.Struct("<I")
# PCR index, template hash, template name length: per template-hash algorithm
_HEADERS = {bank: struct.Struct(f"<I{hashlib.new(bank).digest_size}sI") for bank in BANKS}
_ZERO = {size: bytes(size) for size in (20, 32, 48, 64)}
_TEMPLATES = {name.encode(): name for name in TEMPLATE_FIELDS}
_ALGORITHMS = {name.encode(): name for name in DIGEST_SIZES}
_HEX_DIGEST = re.compile(r"[0-9a-f]{32,128}")
_ALGORITHM_NAME = re.compile(rb"[a-z0-9-]{1,16}")
# A quantified group whose body ends in a quantifier, like (a+)+ or (.*)*: the cheap-to-detect catastrophic patterns.
_NESTED_QUANTIFIER = re.compile(r"\((?:[^()\\]|\\.)*[+*}]\)[+*{]")


class ImaError(ValueError):
    """A refusal; ``reason`` is one of REASONS and the message names what was wrong."""

    def __init__(self, reason: str, message: str):
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.detail = message


class ImaEntry(NamedTuple):
    """One measurement. ``number`` counts from 0 over the whole list (across incremental checks); ``path`` is the
    n-ng field (the keyring or buffer name for ``ima-buf``); ``extra`` is the sig or buf field."""

    number: int
    pcr: int
    template_hash: bytes
    template: str
    data: bytes
    digest_algorithm: str
    digest: bytes
    path: str
    extra: bytes

    @property
    def violation(self) -> bool:
        return not any(self.template_hash)


class ImaState(NamedTuple):
    """What an incremental check keeps per node: the bank, the running PCR 10 value and the entries verified so far."""

    bank: str
    pcr10: bytes
    entries: int

    @classmethod
    def fresh(cls, bank: str = "sha256") -> ImaState:
        if bank not in BANKS:
            raise ImaError(IMA_MALFORMED, f"bank {bank!r} is not one of {', '.join(BANKS)}")
        return cls(bank, bytes(hashlib.new(bank).digest_size), 0)


def shown(path: str) -> str:
    """A path as a message may carry it: bytes that are not UTF-8 as \\xNN, control characters escaped (the path
    comes from the node's log)."""
    text = path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class EntryFailure(NamedTuple):
    """An entry the policy does not allow: its path (as ``shown``), measured digest and what the policy allows."""

    number: int
    path: str
    measured: str
    allowed: tuple[str, ...]
    what: str

    def summary(self) -> str:
        if self.what == "violation":
            return f"{self.path} violation entry (file changed while measured or open for write): content not measured"
        allowed = ", ".join(self.allowed) if self.allowed else "none for this path"
        kind = {"keyring": "key in keyring ", "ima-buf": "buffer "}.get(self.what, "")
        return f"{kind}{self.path} {self.measured} not allowed (allowed: {allowed})"


class RuntimePolicy(NamedTuple):
    """A runtime policy as Keylime keeps it, digests as lower-case hex."""

    digests: Mapping[str, frozenset[str]]
    excludes: tuple[str, ...]
    keyrings: Mapping[str, frozenset[str]]
    ima_buf: Mapping[str, frozenset[str]]
    ignored_keyrings: frozenset[str]
    log_hash_alg: str
    verification_keys: str
    exclude_regex: re.Pattern[str] | None


class ImaResult(NamedTuple):
    """The verdict of one check. ``failures`` names the first MAX_NAMED_FAILURES failing entries, ``failure_count``
    counts them all; ``state`` is what the next check starts from (advanced when ok, fresh when not, as Keylime
    resets); ``entries_parsed`` is how many entries this check read."""

    ok: bool
    reasons: tuple[str, ...]
    messages: tuple[str, ...]
    failures: tuple[EntryFailure, ...]
    failure_count: int
    state: ImaState
    entries_parsed: int
    matched_entries: int

    @property
    def reason(self) -> str | None:
        return self.reasons[0] if self.reasons else None

    def raise_for_failure(self) -> None:
        if not self.ok:
            raise ImaError(self.reasons[0], "; ".join(self.messages))


# --- the measurement list ---------------------------------------------------------------------------------------------


def parse(raw: bytes, template_hash_alg: str = "sha1", first_number: int = 0) -> tuple[ImaEntry, ...]:
    """Parse a binary measurement list (or the tail of one, numbering from ``first_number``)."""
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise ImaError(IMA_MALFORMED, f"measurement list must be bytes, got {type(raw).__name__}")
    if template_hash_alg not in BANKS:
        raise ImaError(IMA_MALFORMED, f"template hash algorithm {template_hash_alg!r} is not one of {', '.join(BANKS)}")
    if not isinstance(raw, bytes):
        raw = bytes(raw)
    if len(raw) > MAX_LOG_BYTES:
        raise ImaError(IMA_LIMITS, f"measurement list is larger than {MAX_LOG_BYTES} bytes ({len(raw)})")
    header = _HEADERS[template_hash_alg]
    head = header.size
    unpack_header = header.unpack_from
    unpack = _U32.unpack_from
    entries: list[ImaEntry] = []
    append = entries.append
    offset = 0
    end = len(raw)
    number = first_number
    limit = first_number + MAX_ENTRIES
    while offset < end:
        if number >= limit:
            raise ImaError(IMA_LIMITS, f"measurement list holds more than {MAX_ENTRIES} entries")
        if end - offset < head:
            raise ImaError(
                IMA_MALFORMED,
                f"entry {number} (offset {offset}) is truncated: {head} bytes of header needed, {end - offset} left",
            )
        pcr, template_hash, name_size = unpack_header(raw, offset)
        position = offset + head
        if not 1 <= name_size <= MAX_TEMPLATE_NAME:
            raise ImaError(
                IMA_MALFORMED,
                f"entry {number} (offset {offset}): template name length {name_size} is not 1..{MAX_TEMPLATE_NAME}",
            )
        if end - position < name_size + 4:
            raise ImaError(IMA_MALFORMED, f"entry {number} (offset {offset}) is truncated in its template name")
        template = _TEMPLATES.get(raw[position : position + name_size])
        if template is None:
            name = raw[position : position + name_size].decode("ascii", "replace")
            raise ImaError(
                IMA_MALFORMED,
                f"entry {number} (offset {offset}): template {name!r} is not supported ({', '.join(TEMPLATE_FIELDS)})",
            )
        position += name_size
        (data_size,) = unpack(raw, position)
        position += 4
        if data_size > MAX_TEMPLATE_DATA:
            raise ImaError(
                IMA_LIMITS,
                f"entry {number} (offset {offset}): template data of {data_size} bytes, over {MAX_TEMPLATE_DATA}",
            )
        if end - position < data_size:
            raise ImaError(
                IMA_MALFORMED,
                f"entry {number} (offset {offset}) is truncated: {data_size} bytes of template data, "
                f"{end - position} left",
            )
        if pcr != IMA_PCR:
            raise ImaError(
                IMA_MALFORMED,
                f"entry {number} (offset {offset}): measured into PCR {pcr}; only PCR {IMA_PCR} is replayed",
            )
        data = raw[position : position + data_size]
        append(_entry(number, pcr, template_hash, template, data, offset))
        offset = position + data_size
        number += 1
    return tuple(entries)


def parse_ascii(text: bytes | str, template_hash_alg: str = "sha1", first_number: int = 0) -> tuple[ImaEntry, ...]:
    """Parse the ASCII list (``ascii_runtime_measurements``: PCR, template hash, template, then the fields, each
    after one space; an empty last field leaves the space). Entries are rebuilt in the binary template data, so the
    template hash is checked and the replay is the same as for the binary list."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "surrogateescape")
    if not isinstance(text, str):
        raise ImaError(IMA_MALFORMED, f"measurement list must be text, got {type(text).__name__}")
    if template_hash_alg not in BANKS:
        raise ImaError(IMA_MALFORMED, f"template hash algorithm {template_hash_alg!r} is not one of {', '.join(BANKS)}")
    if len(text) > MAX_LOG_BYTES:
        raise ImaError(IMA_LIMITS, f"measurement list is larger than {MAX_LOG_BYTES} bytes ({len(text)})")
    hash_size = hashlib.new(template_hash_alg).digest_size
    entries: list[ImaEntry] = []
    for line_number, line in enumerate(text.split("\n"), 1):
        if not line:
            continue
        number = first_number + len(entries)
        if len(entries) >= MAX_ENTRIES:
            raise ImaError(IMA_LIMITS, f"measurement list holds more than {MAX_ENTRIES} entries")
        what = f"entry {number} (line {line_number})"
        parts = line.lstrip(" ").split(" ", 3)
        if len(parts) != 4:
            raise ImaError(IMA_MALFORMED, f"{what}: not '<pcr> <template hash> <template> <fields>'")
        pcr_text, hash_text, template, rest = parts
        if template not in TEMPLATE_FIELDS:
            raise ImaError(
                IMA_MALFORMED, f"{what}: template {template[:20]!r} is not supported ({', '.join(TEMPLATE_FIELDS)})"
            )
        if pcr_text != str(IMA_PCR):
            raise ImaError(IMA_MALFORMED, f"{what}: measured into PCR {pcr_text[:8]}; only PCR {IMA_PCR} is replayed")
        try:
            template_hash = bytes.fromhex(hash_text)
            digest_text, rest = rest.split(" ", 1)
            algorithm, digest_hex = digest_text.split(":", 1)
            fields = [algorithm.encode("ascii") + b":\x00" + bytes.fromhex(digest_hex)]
            if TEMPLATE_FIELDS[template] == 3:
                name, extra_hex = rest.rsplit(" ", 1)
                fields += [name.encode("utf-8", "surrogateescape") + b"\x00", bytes.fromhex(extra_hex)]
            else:
                fields.append(rest.encode("utf-8", "surrogateescape") + b"\x00")
        except (ValueError, UnicodeEncodeError):
            raise ImaError(IMA_MALFORMED, f"{what}: fields are not '<algorithm>:<hex digest> <name>[ <hex>]'") from None
        if len(template_hash) != hash_size:
            raise ImaError(IMA_MALFORMED, f"{what}: template hash of {len(template_hash)} bytes, not {hash_size}")
        data = b"".join(_U32.pack(len(field)) + field for field in fields)
        if len(data) > MAX_TEMPLATE_DATA:
            raise ImaError(IMA_LIMITS, f"{what}: template data of {len(data)} bytes, over {MAX_TEMPLATE_DATA}")
        entries.append(_entry(number, IMA_PCR, template_hash, template, data, line_number))
    return tuple(entries)


def _field_error(number: int, offset: int, template: str, field: int) -> ImaError:
    return ImaError(
        IMA_MALFORMED,
        f"entry {number} (offset {offset}): {template} field {field} of {TEMPLATE_FIELDS[template]} overruns the "
        "template data",
    )


def _entry(number: int, pcr: int, template_hash: bytes, template: str, data: bytes, offset: int) -> ImaEntry:
    # d-ng and n-ng, then for ima-sig and ima-buf a third field; unrolled: this is the parser's hot path
    unpack = _U32.unpack_from
    size = len(data)
    if size < 4:
        raise _field_error(number, offset, template, 1)
    digest_end = 4 + unpack(data, 0)[0]
    if digest_end + 4 > size:
        raise _field_error(number, offset, template, 2 if digest_end <= size else 1)
    name_end = digest_end + 4 + unpack(data, digest_end)[0]
    if TEMPLATE_FIELDS[template] == 3:
        if name_end + 4 > size:
            raise _field_error(number, offset, template, 3 if name_end <= size else 2)
        end = name_end + 4 + unpack(data, name_end)[0]
        extra = data[name_end + 4 : end]
    else:
        end = name_end
        extra = b""
    if end != size:
        if end > size:
            raise _field_error(number, offset, template, TEMPLATE_FIELDS[template])
        raise ImaError(
            IMA_MALFORMED, f"entry {number} (offset {offset}): {size - end} bytes after the {template} fields"
        )
    digest_field = data[4:digest_end]
    name_field = data[digest_end + 4 : name_end]
    separator = digest_field.find(b":\x00")
    algorithm = _ALGORITHMS.get(digest_field[:separator]) if separator > 0 else None
    if algorithm is None:
        if separator < 0 or not _ALGORITHM_NAME.fullmatch(digest_field[:separator]):
            raise ImaError(
                IMA_MALFORMED, f"entry {number} (offset {offset}): d-ng field does not start with '<algorithm>:\\0'"
            )
        algorithm = digest_field[:separator].decode("ascii")
    digest = digest_field[separator + 2 :]
    expected = DIGEST_SIZES.get(algorithm)
    if (expected is not None and len(digest) != expected) or not 16 <= len(digest) <= 64:
        raise ImaError(IMA_MALFORMED, f"entry {number} (offset {offset}): {algorithm} digest of {len(digest)} bytes")
    if not name_field or name_field.find(b"\x00") != len(name_field) - 1:
        raise ImaError(IMA_MALFORMED, f"entry {number} (offset {offset}): n-ng field is not one NUL-terminated name")
    path = name_field[:-1].decode("utf-8", "surrogateescape")
    return ImaEntry(number, pcr, template_hash, template, data, algorithm, digest, path, extra)


# --- the policy -------------------------------------------------------------------------------------------------------


def load_policy(document: bytes | str | Mapping, excludes: bytes | str | Iterable[str] | None = None) -> RuntimePolicy:
    """A Keylime runtime policy (JSON text or the decoded object; a DSSE envelope is unwrapped, its signature not
    checked), or an older allowlist (JSON ``{"hashes": ...}`` or text lines ``<hex digest>  <path>``) with an
    optional exclude list (text, one regular expression a line, or a list)."""
    if isinstance(document, (bytes, bytearray)):
        if len(document) > MAX_POLICY_BYTES:
            raise ImaError(IMA_LIMITS, f"runtime policy is larger than {MAX_POLICY_BYTES} bytes")
        try:
            document = bytes(document).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ImaError(RUNTIME_POLICY, f"runtime policy is not UTF-8 text: {exc}") from None
    if isinstance(document, str):
        if len(document) > MAX_POLICY_BYTES:
            raise ImaError(IMA_LIMITS, f"runtime policy is larger than {MAX_POLICY_BYTES} bytes")
        stripped = document.lstrip()
        if stripped.startswith("{"):
            try:
                document = json.loads(document)
            except ValueError as exc:
                raise ImaError(RUNTIME_POLICY, f"runtime policy is not valid JSON: {exc}") from None
        else:
            return _policy({"digests": _text_allowlist(document)}, _exclude_lines(excludes))
    if not isinstance(document, Mapping):
        raise ImaError(RUNTIME_POLICY, f"runtime policy must be a JSON object, got {type(document).__name__}")
    if "payload" in document:
        try:
            document = json.loads(base64.b64decode(str(document["payload"]), validate=True))
        except (ValueError, binascii.Error) as exc:
            raise ImaError(RUNTIME_POLICY, f"DSSE envelope's payload is not a base64 JSON policy: {exc}") from None
        if not isinstance(document, Mapping):
            raise ImaError(RUNTIME_POLICY, "DSSE envelope's payload is not a JSON object")
    if "hashes" in document and "digests" not in document:
        return _policy({**document, "digests": document["hashes"]}, _exclude_lines(excludes))
    meta = document.get("meta")
    if not isinstance(meta, Mapping) or meta.get("version") != SUPPORTED_POLICY_VERSION:
        version = meta.get("version") if isinstance(meta, Mapping) else None
        raise ImaError(
            RUNTIME_POLICY,
            f"runtime policy meta.version is {version!r}; Keylime's format version {SUPPORTED_POLICY_VERSION} is read",
        )
    extra = _exclude_lines(excludes)
    return _policy(document, list(document.get("excludes") or []) + extra)


def _text_allowlist(text: str) -> dict[str, list[str]]:
    digests: dict[str, list[str]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 1)
        if len(parts) != 2:
            raise ImaError(RUNTIME_POLICY, f"allowlist line {number} is not '<hex digest>  <path>'")
        digests.setdefault(parts[1].lstrip("*"), []).append(parts[0].lower())
    return digests


def _exclude_lines(excludes: bytes | str | Iterable[str] | None) -> list[str]:
    if excludes is None:
        return []
    if isinstance(excludes, bytes):
        excludes = excludes.decode("utf-8", "replace")
    if isinstance(excludes, str):
        return [line.strip() for line in excludes.splitlines() if line.strip() and not line.startswith("#")]
    return list(excludes)


def _policy(document: Mapping, excludes: list) -> RuntimePolicy:
    ima = document.get("ima") or {}
    if not isinstance(ima, Mapping):
        raise ImaError(RUNTIME_POLICY, "runtime policy 'ima' must be an object")
    ignored = ima.get("ignored_keyrings") or []
    log_hash_alg = ima.get("log_hash_alg", "sha1")
    if log_hash_alg not in BANKS:
        raise ImaError(RUNTIME_POLICY, f"ima.log_hash_alg {log_hash_alg!r} is not one of {', '.join(BANKS)}")
    if ima.get("dm_policy") is not None:
        raise ImaError(RUNTIME_POLICY, "ima.dm_policy (device-mapper measurements) is not supported; set it to null")
    if not isinstance(ignored, list) or not all(isinstance(name, str) for name in ignored):
        raise ImaError(RUNTIME_POLICY, "ima.ignored_keyrings must be a list of keyring names")
    keys = document.get("verification-keys", "")
    if not isinstance(keys, str):
        raise ImaError(RUNTIME_POLICY, "verification-keys must be a string (JSON text), as Keylime writes it")
    digests = _digest_map(document.get("digests") or {}, "digests")
    return RuntimePolicy(
        digests=digests,
        excludes=tuple(excludes),
        keyrings=_digest_map(document.get("keyrings") or {}, "keyrings"),
        ima_buf=_digest_map(document.get("ima-buf") or {}, "ima-buf"),
        ignored_keyrings=frozenset(ignored),
        log_hash_alg=log_hash_alg,
        verification_keys=keys,
        exclude_regex=compile_excludes(excludes),
    )


def _digest_map(section: object, name: str) -> dict[str, frozenset[str]]:
    if not isinstance(section, Mapping):
        raise ImaError(RUNTIME_POLICY, f"runtime policy '{name}' must be an object of path -> [hex digest, ...]")
    if len(section) > MAX_POLICY_PATHS:
        raise ImaError(IMA_LIMITS, f"runtime policy '{name}' names more than {MAX_POLICY_PATHS} paths")
    result: dict[str, frozenset[str]] = {}
    for path, digests in section.items():
        if not isinstance(digests, list) or not digests:
            raise ImaError(RUNTIME_POLICY, f"runtime policy '{name}' {path}: must be a non-empty list of hex digests")
        if len(digests) > MAX_DIGESTS_PER_PATH:
            raise ImaError(IMA_LIMITS, f"runtime policy '{name}' {path}: more than {MAX_DIGESTS_PER_PATH} digests")
        for digest in digests:
            if not isinstance(digest, str) or not _HEX_DIGEST.fullmatch(digest):
                raise ImaError(
                    RUNTIME_POLICY, f"runtime policy '{name}' {path}: {digest!r} is not a lower-case hex digest"
                )
        result[str(path)] = frozenset(digests)
    return result


def compile_excludes(excludes: Iterable[object]) -> re.Pattern[str] | None:
    """Keylime's exclude list as one compiled alternation, after checking each pattern alone (count, length,
    syntax, and nested quantifiers such as ``(a+)+`` that backtrack catastrophically)."""
    patterns = list(excludes)
    if len(patterns) > MAX_EXCLUDES:
        raise ImaError(IMA_LIMITS, f"runtime policy has {len(patterns)} excludes, more than {MAX_EXCLUDES}")
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise ImaError(RUNTIME_POLICY, f"exclude {pattern!r} is not a string")
        if len(pattern) > MAX_EXCLUDE_LENGTH:
            raise ImaError(IMA_LIMITS, f"exclude {pattern[:40]!r}... is longer than {MAX_EXCLUDE_LENGTH} characters")
        if _NESTED_QUANTIFIER.search(pattern):
            raise ImaError(RUNTIME_POLICY, f"exclude {pattern!r} nests a quantifier in a quantified group")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ImaError(RUNTIME_POLICY, f"exclude {pattern!r} is not a regular expression: {exc}") from None
    if not patterns:
        return None
    return re.compile("(" + ")|(".join(patterns) + ")")


# --- the check --------------------------------------------------------------------------------------------------------


def boot_aggregates(pcrs: Mapping[int, bytes], bank: str) -> frozenset[bytes]:
    """The boot aggregates the kernel writes for these PCRs of one bank (PCRs 0-7 for SHA-1, 0-9 otherwise, and 0-7
    as kernels before 5.8 wrote for every bank)."""
    if any(index not in pcrs for index in range(8)):
        return frozenset()
    values = {hashlib.new(bank, b"".join(pcrs[i] for i in range(8))).digest()}
    if bank != "sha1" and all(index in pcrs for index in (8, 9)):
        values.add(hashlib.new(bank, b"".join(pcrs[i] for i in range(10))).digest())
    return frozenset(values)


def verify(
    log: bytes,
    policy: RuntimePolicy,
    pcr10: bytes,
    *,
    state: ImaState | None = None,
    bank: str = "sha256",
    pcrs: Mapping[str, Mapping[int, bytes]] | None = None,
    template_hash_alg: str | None = None,
    log_format: str = "binary",
) -> ImaResult:
    """Check the entries of ``log`` (the whole list, or only those after ``state.entries``) against the quoted PCR 10
    of ``bank`` and the policy; ``log_format`` "ascii" reads ``ascii_runtime_measurements``. ``pcrs`` are the quoted
    PCRs 0-9 per bank, for the boot aggregate; ``template_hash_alg`` is the list's (the policy's ``ima.log_hash_alg``
    unless given: sha1 for ``binary_runtime_measurements``, sha256 for its ``_sha256`` sibling). Raises ImaError for
    a list that cannot be read (``ima-malformed``, ``ima-limits``); every other refusal is in the result."""
    if template_hash_alg is None:
        template_hash_alg = policy.log_hash_alg
    if state is None:
        state = ImaState.fresh(bank)
    elif state.bank != bank:
        raise ImaError(IMA_MALFORMED, f"incremental state is of the {state.bank} bank, the check asks for {bank}")
    elif state.entries < 0:
        raise ImaError(IMA_MALFORMED, f"incremental state counts {state.entries} entries")
    if len(pcr10) != len(state.pcr10):
        raise ImaError(IMA_MALFORMED, f"quoted PCR 10 has {len(pcr10)} bytes, the {bank} bank {len(state.pcr10)}")
    if log_format not in ("binary", "ascii"):
        raise ImaError(IMA_MALFORMED, f"log format {log_format!r} is not 'binary' or 'ascii'")
    reader = parse if log_format == "binary" else parse_ascii
    entries = reader(log, template_hash_alg, state.entries)
    reasons: list[str] = []
    messages: list[str] = []
    failures: list[EntryFailure] = []
    count = 0

    matched, matched_value, bad_hash = _replay(entries, state.pcr10, pcr10, bank, template_hash_alg)
    if bad_hash:
        reasons.append(IMA_LOG_MISMATCH)
        first = bad_hash[0]
        messages.append(
            f"{len(bad_hash)} entr{'y' if len(bad_hash) == 1 else 'ies'} whose template hash is not the "
            f"{template_hash_alg} of its data, first entry {first.number} ({shown(first.path)})"
        )
    if matched is None:
        if IMA_LOG_MISMATCH not in reasons:
            reasons.append(IMA_LOG_MISMATCH)
        messages.append(
            f"replay of {state.entries + len(entries)} entries ({len(entries)} new) does not reach the quoted "
            f"{bank} PCR 10 {pcr10.hex()}"
        )

    if state.entries == 0 and entries:
        message = _boot_aggregate_problem(entries[0], pcrs or {})
        if message:
            reasons.append(IMA_BOOT_AGGREGATE)
            messages.append(message)
        checked = entries[1:]
    else:
        checked = entries

    exclude = policy.exclude_regex
    exclude_match = exclude.match if exclude is not None else None
    digests = policy.digests
    unreadable = {entry.number for entry in bad_hash}
    for entry in checked:
        if unreadable and entry.number in unreadable:
            continue  # its data is not what was measured: refused as a mismatch, not judged by the policy (Keylime too)
        # the common case inline: a file whose digest the policy lists for its path
        if entry.template != "ima-buf" and entry.template_hash != _ZERO[len(entry.template_hash)]:
            allowed = digests.get(entry.path)
            if allowed is not None and entry.digest.hex() in allowed:
                continue
        failure = _check_entry(entry, policy, exclude_match)
        if failure is not None:
            count += 1
            if len(failures) < MAX_NAMED_FAILURES:
                failures.append(failure)
    if count:
        reasons.append(RUNTIME_POLICY)
        named = "; ".join(f.summary() for f in failures)
        more = f" (and {count - len(failures)} more)" if count > len(failures) else ""
        messages.append(f"{count} entr{'y' if count == 1 else 'ies'} not allowed: {named}{more}")

    ok = not reasons
    if ok:
        next_state = ImaState(bank, matched_value, state.entries + matched)
    else:
        next_state = ImaState.fresh(bank)
    return ImaResult(
        ok, tuple(reasons), tuple(messages), tuple(failures), count, next_state, len(entries), matched or 0
    )


def _replay(
    entries: tuple[ImaEntry, ...], start: bytes, quoted: bytes, bank: str, template_hash_alg: str
) -> tuple[int | None, bytes, list[ImaEntry]]:
    """How many of the entries the quote covers (the first prefix whose replay equals it, as Keylime: the PCR may lag
    the log; or None), the PCR value there, and the entries whose template hash is not the hash of their data."""
    bank_hash = getattr(hashlib, bank)
    list_hash = getattr(hashlib, template_hash_alg)
    violation = b"\xff" * bank_hash().digest_size
    zero = bytes(list_hash().digest_size)
    same = bank == template_hash_alg
    bad_hash = []
    value = start
    matched: int | None = 0 if hmac.compare_digest(value, quoted) else None
    matched_value = value
    for count, entry in enumerate(entries, 1):
        template_hash = entry.template_hash
        if template_hash == zero:
            extend = violation
        else:
            if list_hash(entry.data).digest() != template_hash:
                bad_hash.append(entry)
            extend = template_hash if same else bank_hash(entry.data).digest()
        value = bank_hash(value + extend).digest()
        if matched is None and value == quoted:
            matched, matched_value = count, value
    return matched, matched_value, bad_hash


def _boot_aggregate_problem(entry: ImaEntry, pcrs: Mapping[str, Mapping[int, bytes]]) -> str | None:
    if entry.path != BOOT_AGGREGATE or entry.template not in ("ima-ng", "ima-sig"):
        return f"the first entry is {entry.template} {shown(entry.path)!r}, not the kernel's boot_aggregate"
    bank = entry.digest_algorithm
    if bank not in BANKS:
        return f"boot_aggregate is a {bank} digest; no PCR bank of that algorithm"
    allowed = boot_aggregates(pcrs.get(bank, {}), bank)
    if not allowed:
        return f"boot_aggregate is {bank}:{entry.digest.hex()} and PCRs 0-7 of the {bank} bank were not quoted"
    if entry.digest not in allowed:
        return (
            f"boot_aggregate {bank}:{entry.digest.hex()} is not the {bank} hash of the quoted PCRs 0-"
            f"{7 if bank == 'sha1' else 9} (allowed: {', '.join(sorted(bank + ':' + v.hex() for v in allowed))})"
        )
    return None


def _check_entry(
    entry: ImaEntry, policy: RuntimePolicy, exclude: Callable[[str], object] | None
) -> EntryFailure | None:
    measured = f"{entry.digest_algorithm}:{entry.digest.hex()}"
    if entry.violation:
        return EntryFailure(entry.number, shown(entry.path), measured, (), "violation")
    if entry.template == "ima-buf":
        if _is_key(entry.extra):
            if "*" in policy.ignored_keyrings or entry.path in policy.ignored_keyrings:
                return None
            return _allowed(entry, policy.keyrings, exclude, measured, "keyring")
        return _allowed(entry, policy.ima_buf, exclude, measured, "ima-buf")
    return _allowed(entry, policy.digests, exclude, measured, "file")


def _allowed(
    entry: ImaEntry,
    section: Mapping[str, frozenset[str]],
    exclude: Callable[[str], object] | None,
    measured: str,
    what: str,
) -> EntryFailure | None:
    if exclude is not None and exclude(entry.path):
        return None
    allowed = section.get(entry.path)
    if allowed is not None and entry.digest.hex() in allowed:
        return None
    return EntryFailure(entry.number, shown(entry.path), measured, tuple(sorted(allowed or ())), what)


def _is_key(buffer: bytes) -> bool:
    """Whether an ima-buf entry carries a key (an X.509 certificate or a public key, DER or PEM), as Keylime's
    ``file_signatures.get_pubkey`` decides which section checks it."""
    if not buffer:
        return False
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
    except ImportError:  # pragma: no cover - cryptography is a controller requirement
        return False
    loaders = (
        x509.load_der_x509_certificate,
        x509.load_pem_x509_certificate,
        serialization.load_der_public_key,
        serialization.load_pem_public_key,
    )
    for loader in loaders:
        try:
            loader(buffer)
        except (ValueError, TypeError):
            continue
        return True
    return False
