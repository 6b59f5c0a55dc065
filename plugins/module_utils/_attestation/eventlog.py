# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The TCG event log: parse (bounded), replay per PCR and bank, name the events that differ.

Layout (TCG PC Client Platform Firmware Profile, section 10; all integers little-endian):
the first record is a TCG_PCR_EVENT in the SHA-1 format, EV_NO_ACTION on PCR 0 with a zero digest, whose data is the
TCG_EfiSpecIDEvent ("Spec ID Event03\\0", platform class, version 2.x, uintn size, then numberOfAlgorithms
(algorithmId u16, digestSize u16) pairs and vendor information); every further record is a TCG_PCR_EVENT2:
pcrIndex u32, eventType u32, TPML_DIGEST_VALUES (count u32, then count (hashAlg u16, digest of the size the Spec ID
event gives)), eventSize u32, event data. The same parser reads a real firmware's log
(/sys/kernel/security/tpm0/binary_bios_measurements) and the lab's made-up boot events.

A confidential VM's CC event log (the area the ACPI CCEL table points to; UEFI 2.10's EFI_CC_MEASUREMENT_PROTOCOL) is
the same format with two differences that ``parse_ccel`` reads: each record's index is the CC measurement register
(TDX: 0 MRTD, 1..4 RTMR0..3; the Spec ID record sits on MR index 0 or 1), and the area is padded with 0xFF to the
length the table gives.

Older firmware (GCE's Debian 10 and Windows shielded VMs) writes the SHA-1 format instead (TCG PC Client spec,
TCG_PCClientPCREvent): no crypto-agile Spec ID event, every record a TCG_PCR_EVENT - pcrIndex u32, eventType u32, a
SHA-1 digest (20 bytes), eventSize u32, event data - possibly led by a "Spec ID Event00" EV_NO_ACTION record. Such a
log parses as one with the single bank sha1 (``format`` "sha1"), and replays to the sha1 PCRs.

Standard library only: the lab loads this file by path to write and check its nodes' logs.
"""

from __future__ import annotations

import difflib
import hashlib
import struct
from typing import NamedTuple

MAX_EVENT_LOG_BYTES = 96 * 1024
# A CCEL area is the table's LAML (GCE: 256 KiB, mostly 0xFF padding); the log inside it has the same limit as a TPM's.
MAX_CCEL_AREA_BYTES = 4 * 1024 * 1024
CC_MR_INDICES = range(5)
_CCEL_SPEC_ID_INDICES = (0, 1)
MAX_EVENTS = 1024
MAX_ALGORITHMS = 8
MAX_DESCRIPTION = 160
DEFAULT_PATH = "/sys/kernel/security/tpm0/binary_bios_measurements"
SPEC_ID_SIGNATURE = b"Spec ID Event03\x00"
SHA1_SPEC_ID_SIGNATURE = b"Spec ID Event00\x00"  # TCG_EfiSpecIdEventStruct of a SHA-1 format log
CRYPTO_AGILE = "crypto-agile"
SHA1_FORMAT = "sha1"
STARTUP_LOCALITY_SIGNATURE = b"StartupLocality\x00"
PCR_INDICES = range(24)
# TPM_ALG_ID -> (bank name, digest size); a log may name other algorithms, which are read but not replayed.
ALGORITHMS = {0x0004: ("sha1", 20), 0x000B: ("sha256", 32), 0x000C: ("sha384", 48), 0x000D: ("sha512", 64)}
ALGORITHM_IDS = {name: alg for alg, (name, _size) in ALGORITHMS.items()}
_MAX_DIGEST_SIZE = 64

EV_NO_ACTION = 0x3
EV_SEPARATOR = 0x4
EV_EVENT_TAG = 0x6
EV_IPL = 0xD
EV_EFI_VARIABLE_DRIVER_CONFIG = 0x80000001
EV_EFI_VARIABLE_BOOT = 0x80000002
EV_EFI_BOOT_SERVICES_APPLICATION = 0x80000003
EV_EFI_BOOT_SERVICES_DRIVER = 0x80000004
EV_EFI_RUNTIME_SERVICES_DRIVER = 0x80000005
EV_EFI_ACTION = 0x80000007
EV_EFI_VARIABLE_BOOT2 = 0x8000000C
EV_EFI_VARIABLE_AUTHORITY = 0x800000E0
EVENT_TYPES = {
    0x0: "EV_PREBOOT_CERT",
    0x1: "EV_POST_CODE",
    0x2: "EV_UNUSED",
    EV_NO_ACTION: "EV_NO_ACTION",
    EV_SEPARATOR: "EV_SEPARATOR",
    0x5: "EV_ACTION",
    EV_EVENT_TAG: "EV_EVENT_TAG",
    0x7: "EV_S_CRTM_CONTENTS",
    0x8: "EV_S_CRTM_VERSION",
    0x9: "EV_CPU_MICROCODE",
    0xA: "EV_PLATFORM_CONFIG_FLAGS",
    0xB: "EV_TABLE_OF_DEVICES",
    0xC: "EV_COMPACT_HASH",
    EV_IPL: "EV_IPL",
    0xE: "EV_IPL_PARTITION_DATA",
    0xF: "EV_NONHOST_CODE",
    0x10: "EV_NONHOST_CONFIG",
    0x11: "EV_NONHOST_INFO",
    0x12: "EV_OMIT_BOOT_DEVICE_EVENTS",
    0x13: "EV_POST_CODE2",
    0x80000000: "EV_EFI_EVENT_BASE",
    EV_EFI_VARIABLE_DRIVER_CONFIG: "EV_EFI_VARIABLE_DRIVER_CONFIG",
    EV_EFI_VARIABLE_BOOT: "EV_EFI_VARIABLE_BOOT",
    EV_EFI_BOOT_SERVICES_APPLICATION: "EV_EFI_BOOT_SERVICES_APPLICATION",
    EV_EFI_BOOT_SERVICES_DRIVER: "EV_EFI_BOOT_SERVICES_DRIVER",
    EV_EFI_RUNTIME_SERVICES_DRIVER: "EV_EFI_RUNTIME_SERVICES_DRIVER",
    0x80000006: "EV_EFI_GPT_EVENT",
    EV_EFI_ACTION: "EV_EFI_ACTION",
    0x80000008: "EV_EFI_PLATFORM_FIRMWARE_BLOB",
    0x80000009: "EV_EFI_HANDOFF_TABLES",
    0x8000000A: "EV_EFI_PLATFORM_FIRMWARE_BLOB2",
    0x8000000B: "EV_EFI_HANDOFF_TABLES2",
    EV_EFI_VARIABLE_BOOT2: "EV_EFI_VARIABLE_BOOT2",
    0x8000000D: "EV_EFI_GPT_EVENT2",
    0x80000010: "EV_EFI_HCRTM_EVENT",
    EV_EFI_VARIABLE_AUTHORITY: "EV_EFI_VARIABLE_AUTHORITY",
    0x800000E1: "EV_EFI_SPDM_FIRMWARE_BLOB",
    0x800000E2: "EV_EFI_SPDM_FIRMWARE_CONFIG",
}
EVENT_TYPE_IDS = {name: number for number, name in EVENT_TYPES.items()}
# The Linux EFI stub's tagged events in PCR 9 (drivers/firmware/efi/libstub/efistub.h: INITRD_EVENT_TAG_ID 0x8F3B22EC,
# LOAD_OPTIONS_EVENT_TAG_ID 0x8F3B22ED): the name when an event carries no text of its own.
LINUX_EVENT_TAGS = {0x8F3B22EC: "Linux initrd", 0x8F3B22ED: "LOADED_IMAGE::LoadOptions"}
_VARIABLE_EVENTS = (
    EV_EFI_VARIABLE_DRIVER_CONFIG,
    EV_EFI_VARIABLE_BOOT,
    EV_EFI_VARIABLE_BOOT2,
    EV_EFI_VARIABLE_AUTHORITY,
)
_IMAGE_EVENTS = (EV_EFI_BOOT_SERVICES_APPLICATION, EV_EFI_BOOT_SERVICES_DRIVER, EV_EFI_RUNTIME_SERVICES_DRIVER)
_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")
_EVENT2_HEAD = struct.Struct("<III")  # pcrIndex, eventType, digest count
_ALG = struct.Struct("<HH")
_FIRST_HEAD = struct.Struct("<II20sI")  # pcrIndex, eventType, SHA-1 digest, eventSize
_SPEC_ID_HEAD = struct.Struct("<16sIBBBBI")  # signature, platformClass, minor, major, errata, uintnSize, algorithms


class EventLogError(ValueError):
    """The event log is malformed or over a limit; the message names the event and its byte offset."""


def type_name(event_type: int) -> str:
    return EVENT_TYPES.get(event_type, f"EV_0x{event_type:08x}")


class Event(NamedTuple):
    """One TCG_PCR_EVENT2 record. ``number`` counts from 1 (0 is the Spec ID event); digests by bank name."""

    number: int
    pcr: int
    type: int
    digests: dict[str, bytes]
    data: bytes

    @property
    def type_name(self) -> str:
        return type_name(self.type)

    @property
    def description(self) -> str:
        return describe(self.type, self.data)

    @property
    def measured(self) -> bool:
        """Whether the firmware extended it into its PCR (EV_NO_ACTION events are only logged)."""
        return self.type != EV_NO_ACTION


class EventLog(NamedTuple):
    """A parsed log: the Spec ID event's algorithms (bank names; unknown ones as alg-0xNNNN) and the events; a SHA-1
    format log has the one bank sha1."""

    banks: tuple[str, ...]
    events: tuple[Event, ...]
    format: str = CRYPTO_AGILE

    def replay(self) -> dict[str, dict[int, bytes]]:
        """Bank -> PCR -> the value a TPM reset at boot holds after these events, for every PCR the log extends."""
        return replay(self)


def _alg_name(alg: int) -> str:
    return ALGORITHMS[alg][0] if alg in ALGORITHMS else f"alg-0x{alg:04x}"


def parse(raw: bytes) -> EventLog:
    """Parse a crypto-agile or SHA-1 format event log, refusing anything malformed or over the limits with
    EventLogError."""
    raw = _as_bytes(raw, MAX_EVENT_LOG_BYTES, "event log")
    if _is_sha1_format(raw):
        return _parse_sha1_format(raw)
    return _parse(raw, (0,), PCR_INDICES, padded=False)


def parse_ccel(raw: bytes) -> EventLog:
    """Parse a CC event log (the CCEL area, trailing 0xFF padding allowed); ``Event.pcr`` is the CC MR index."""
    raw = _as_bytes(raw, MAX_CCEL_AREA_BYTES, "CC event log")
    return _parse(raw, _CCEL_SPEC_ID_INDICES, CC_MR_INDICES, padded=True)


def _as_bytes(raw: bytes, limit: int, what: str) -> bytes:
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise EventLogError(f"{what} must be bytes, got {type(raw).__name__}")
    raw = bytes(raw)
    if len(raw) > limit:
        raise EventLogError(f"{what} is larger than {limit} bytes ({len(raw)})")
    if not raw:
        raise EventLogError(f"{what} is empty")
    return raw


def _parse(raw: bytes, spec_id_indices: tuple[int, ...], indices: range, *, padded: bool) -> EventLog:
    sizes, offset = _parse_spec_id(raw, spec_id_indices)
    banks = tuple(_alg_name(alg) for alg in sizes)
    events: list[Event] = []
    # The fast path reads a record whose digests come in the Spec ID event's order, whole and in bounds, with one
    # struct unpack; any other record (another order, a truncation, a bad index) goes to _parse_event2, whose checks
    # and messages are the definition.
    record = struct.Struct("<III" + "".join(f"H{size}s" for size in sizes.values()) + "I")
    head_size = record.size
    algorithms = tuple(sizes)
    count = len(algorithms)
    names = tuple(_alg_name(alg) for alg in algorithms)
    end = len(raw)
    unpack = record.unpack_from
    make = tuple.__new__
    while offset < end:
        if padded and raw[offset : offset + 4] == b"\xff\xff\xff\xff":
            if raw.count(0xFF, offset) != len(raw) - offset:
                raise EventLogError(f"CC event log: padding at offset {offset} is followed by bytes other than 0xFF")
            break
        number = len(events) + 1
        if number > MAX_EVENTS:
            raise EventLogError(f"event log holds more than {MAX_EVENTS} events")
        if offset > MAX_EVENT_LOG_BYTES:
            raise EventLogError(f"event log is larger than {MAX_EVENT_LOG_BYTES} bytes (event at offset {offset})")
        if end - offset >= head_size:
            fields = unpack(raw, offset)
            start = offset + head_size
            size = fields[-1]
            if fields[0] in indices and fields[2] == count and fields[3:-1:2] == algorithms and end - start >= size:
                offset = start + size
                events.append(
                    make(Event, (number, fields[0], fields[1], dict(zip(names, fields[4::2])), raw[start:offset]))
                )
                continue
        event, offset = _parse_event2(raw, offset, number, sizes, indices)
        events.append(event)
    return EventLog(banks, tuple(events))


def _is_sha1_format(raw: bytes) -> bool:
    """Whether the first record is not a crypto-agile Spec ID event: no "Spec ID Event03" data, and not an
    EV_NO_ACTION with a zero digest on PCR 0 that names another Spec ID (then the Spec ID checks say what is wrong),
    except the SHA-1 format's own "Spec ID Event00"."""
    if len(raw) < _FIRST_HEAD.size:
        return False
    pcr, event_type, digest, _size = _FIRST_HEAD.unpack_from(raw, 0)
    data = raw[_FIRST_HEAD.size : _FIRST_HEAD.size + len(SPEC_ID_SIGNATURE)]
    if data.startswith(SHA1_SPEC_ID_SIGNATURE):
        return True
    if data.startswith(SPEC_ID_SIGNATURE):
        return False
    return not (pcr == 0 and event_type == EV_NO_ACTION and digest == bytes(20) and data.startswith(b"Spec ID"))


def _parse_sha1_format(raw: bytes) -> EventLog:
    events: list[Event] = []
    offset = 0
    while offset < len(raw):
        if len(events) >= MAX_EVENTS:
            raise EventLogError(f"event log holds more than {MAX_EVENTS} events")
        number = len(events) + 1
        what = f"event {number} (offset {offset}) of the SHA-1 format log"
        _need(raw, offset, _FIRST_HEAD.size, what)
        pcr, event_type, digest, size = _FIRST_HEAD.unpack_from(raw, offset)
        if pcr not in PCR_INDICES:
            raise EventLogError(f"{what}: PCR index {pcr} is not 0..23")
        position = offset + _FIRST_HEAD.size
        _need(raw, position, size, f"{what} data")
        events.append(Event(number, pcr, event_type, {"sha1": digest}, raw[position : position + size]))
        offset = position + size
    return EventLog(("sha1",), tuple(events), SHA1_FORMAT)


def _need(raw: bytes, offset: int, size: int, what: str) -> None:
    if len(raw) - offset < size:
        raise EventLogError(f"{what} is truncated: {size} bytes needed at offset {offset}, {len(raw) - offset} left")


def _parse_spec_id(raw: bytes, indices: tuple[int, ...]) -> tuple[dict[int, int], int]:
    """The first record: algorithm id -> digest size, and the offset of the first TCG_PCR_EVENT2."""
    what = "event 0 (the Spec ID event)"
    _need(raw, 0, _FIRST_HEAD.size, what)
    pcr, event_type, digest, size = _FIRST_HEAD.unpack_from(raw, 0)
    if pcr not in indices or event_type != EV_NO_ACTION or digest != bytes(20):
        raise EventLogError(
            f"{what} must be EV_NO_ACTION on PCR {' or '.join(map(str, indices))} with a zero SHA-1 digest, got "
            f"{type_name(event_type)} on PCR {pcr}: not a TCG crypto-agile event log"
        )
    start = _FIRST_HEAD.size
    _need(raw, start, size, f"{what} data")
    data = raw[start : start + size]
    if len(data) < _SPEC_ID_HEAD.size or not data.startswith(SPEC_ID_SIGNATURE):
        raise EventLogError(f"{what} does not start with 'Spec ID Event03': not a crypto-agile (TCG_PCR_EVENT2) log")
    _sig, _platform, _minor, major, _errata, _uintn, count = _SPEC_ID_HEAD.unpack_from(data, 0)
    if major != 2:
        raise EventLogError(f"{what} names spec version {major}.x, not 2.x")
    if not 1 <= count <= MAX_ALGORITHMS:
        raise EventLogError(f"{what} names {count} algorithms, not 1..{MAX_ALGORITHMS}")
    position = _SPEC_ID_HEAD.size
    if len(data) < position + count * _ALG.size + 1:
        raise EventLogError(f"{what} is too short for its {count} algorithms")
    sizes: dict[int, int] = {}
    for _entry in range(count):
        alg, digest_size = _ALG.unpack_from(data, position)
        position += _ALG.size
        if alg in sizes:
            raise EventLogError(f"{what} names algorithm 0x{alg:04x} twice")
        expected = ALGORITHMS.get(alg, (None, None))[1]
        if (expected is not None and digest_size != expected) or not 1 <= digest_size <= _MAX_DIGEST_SIZE:
            raise EventLogError(f"{what} gives algorithm {_alg_name(alg)} a digest size of {digest_size}")
        sizes[alg] = digest_size
    vendor_size = data[position]
    if position + 1 + vendor_size != len(data):
        raise EventLogError(
            f"{what} has {len(data) - position - 1} bytes of vendor information, its header says {vendor_size}"
        )
    return sizes, start + size


def _parse_event2(raw: bytes, offset: int, number: int, sizes: dict[int, int], indices: range) -> tuple[Event, int]:
    what = f"event {number} (offset {offset})"
    _need(raw, offset, _EVENT2_HEAD.size, what)
    pcr, event_type, count = _EVENT2_HEAD.unpack_from(raw, offset)
    if pcr not in indices:
        raise EventLogError(f"{what}: PCR index {pcr} is not {indices.start}..{indices.stop - 1}")
    if count != len(sizes):
        raise EventLogError(f"{what}: carries {count} digest(s), the Spec ID event names {len(sizes)} algorithm(s)")
    position = offset + _EVENT2_HEAD.size
    digests: dict[str, bytes] = {}
    for _entry in range(count):
        _need(raw, position, _U16.size, what)
        (alg,) = _U16.unpack_from(raw, position)
        size = sizes.get(alg)
        if size is None:
            raise EventLogError(f"{what}: digest algorithm 0x{alg:04x} is not named by the Spec ID event")
        name = _alg_name(alg)
        if name in digests:
            raise EventLogError(f"{what}: carries two {name} digests")
        _need(raw, position + _U16.size, size, f"{what} {name} digest")
        digests[name] = raw[position + _U16.size : position + _U16.size + size]
        position += _U16.size + size
    _need(raw, position, _U32.size, what)
    (size,) = _U32.unpack_from(raw, position)
    position += _U32.size
    _need(raw, position, size, f"{what} data")
    return Event(number, pcr, event_type, digests, raw[position : position + size]), position + size


def _initial_value(pcr: int, size: int, locality: int) -> bytes:
    if pcr == 0:
        return bytes(size - 1) + bytes((locality,))
    if 17 <= pcr <= 22:  # the D-RTM PCRs start as all ones
        return b"\xff" * size
    return bytes(size)


_HASH_CONSTRUCTORS = {
    "sha1": hashlib.sha1,
    "sha256": hashlib.sha256,
    "sha384": hashlib.sha384,
    "sha512": hashlib.sha512,
}


def replay(log: EventLog) -> dict[str, dict[int, bytes]]:
    locality = startup_locality(log)
    return {bank: _replay_bank(log, bank, locality) for bank in log.banks if bank in ALGORITHM_IDS}


def replay_bank(log: EventLog, bank: str) -> dict[int, bytes] | None:
    """``replay(log)[bank]``, or None when the log has no such bank: one bank's work when only one is quoted."""
    if bank not in log.banks or bank not in ALGORITHM_IDS:
        return None
    return _replay_bank(log, bank, startup_locality(log))


def startup_locality(log: EventLog) -> int:
    """The locality the TPM was started from (a StartupLocality event), 0 without one; EventLogError if malformed."""
    locality = 0
    for event in log.events:
        if event.type == EV_NO_ACTION and event.pcr == 0 and event.data.startswith(STARTUP_LOCALITY_SIGNATURE):
            if len(event.data) != len(STARTUP_LOCALITY_SIGNATURE) + 1:
                raise EventLogError(f"event {event.number}: StartupLocality event of {len(event.data)} bytes, not 17")
            locality = event.data[-1]
    return locality


def _replay_bank(log: EventLog, bank: str, locality: int) -> dict[int, bytes]:
    new = _HASH_CONSTRUCTORS[bank]
    bank_values: dict[int, bytes] = {}
    for event in log.events:
        if event.type == EV_NO_ACTION:
            continue
        digest = event.digests[bank]
        old = bank_values.get(event.pcr)
        if old is None:
            old = _initial_value(event.pcr, len(digest), locality)
        bank_values[event.pcr] = new(old + digest).digest()
    return bank_values


def describe(event_type: int, data: bytes) -> str:
    """What an event measured, readable and bounded: a tag's or a variable's name, a string, an image's file path."""
    try:
        if event_type == EV_EVENT_TAG:
            text = _describe_tag(data)
        elif event_type in _VARIABLE_EVENTS:
            text = _describe_variable(data)
        elif event_type in _IMAGE_EVENTS:
            text = _describe_image(data)
        elif event_type == EV_SEPARATOR:
            text = "error" if data == b"\xff\xff\xff\xff" else "separator"
        elif event_type == EV_NO_ACTION:
            text = _text(data.split(b"\x00", 1)[0])
        else:
            text = _text(data)
    except (struct.error, IndexError):
        text = ""
    return text[:MAX_DESCRIPTION]


def _text(data: bytes) -> str:
    """Printable ASCII or UTF-16LE text (firmware writes both), without trailing NULs; else empty."""
    if len(data) >= 4 and len(data) % 2 == 0 and not any(data[1::2]):
        data = data[0::2]
    data = data.rstrip(b"\x00")
    if data and all(32 <= byte < 127 or byte in (9, 10, 13) for byte in data[: MAX_DESCRIPTION * 2]):
        return data[:MAX_DESCRIPTION].decode("ascii").strip()
    return ""


def _describe_tag(data: bytes) -> str:
    tag, size = struct.unpack_from("<II", data, 0)
    text = _text(data[8 : 8 + size])
    return text or LINUX_EVENT_TAGS.get(tag, f"tag 0x{tag:08x}")


def _describe_variable(data: bytes) -> str:
    # UEFI_VARIABLE_DATA: VariableName (GUID, 16 bytes), UnicodeNameLength u64, VariableDataLength u64, UnicodeName
    name_length = struct.unpack_from("<Q", data, 16)[0]
    if name_length > MAX_DESCRIPTION:
        return ""
    return _text(data[32 : 32 + 2 * name_length])


def _describe_image(data: bytes) -> str:
    # UEFI_IMAGE_LOAD_EVENT: location, length, link-time address, LengthOfDevicePath (u64 each), then the device path;
    # the media file-path nodes (type 4, subtype 4) name the image.
    path_length = struct.unpack_from("<Q", data, 24)[0]
    path = data[32 : 32 + min(path_length, len(data))]
    names = []
    while len(path) >= 4:
        node_type, subtype, length = path[0], path[1], _U16.unpack_from(path, 2)[0]
        if length < 4 or node_type == 0x7F:
            break
        if (node_type, subtype) == (4, 4):
            names.append(path[4:length].decode("utf-16-le", "replace").rstrip("\x00"))
        path = path[length:]
    return "".join(names) if names else "image"


class EventDifference(NamedTuple):
    """An event of one PCR that differs from the golden log: changed (digest), added or removed."""

    pcr: int
    change: str
    type: str
    description: str
    old_digest: str | None
    new_digest: str | None

    def summary(self) -> str:
        what = f"{self.type} {self.description}".rstrip()
        if self.change == "changed":
            return f"PCR {self.pcr}: {what} digest changed"
        return f"PCR {self.pcr}: {what} {self.change}"

    def to_result(self) -> dict:
        return {
            "pcr": self.pcr,
            "change": self.change,
            "type": self.type,
            "description": self.description,
            "old_digest": self.old_digest,
            "new_digest": self.new_digest,
        }


class GoldenEvent(NamedTuple):
    """A measured event of an enrolled golden log, in one bank: what a policy keeps to explain a PCR that fails."""

    pcr: int
    type: str
    description: str
    digest: bytes


def golden_events(log: EventLog, bank: str, pcrs: frozenset[int] | set[int] | None = None) -> tuple[GoldenEvent, ...]:
    """The measured events of a log (of the given PCRs), in one bank, as a policy enrols them."""
    if bank not in log.banks:
        raise EventLogError(f"event log has no {bank} bank (it has {', '.join(log.banks)})")
    return tuple(
        GoldenEvent(e.pcr, e.type_name, e.description, e.digests[bank])
        for e in log.events
        if e.measured and (pcrs is None or e.pcr in pcrs)
    )


def differences(golden: tuple[GoldenEvent, ...], log: EventLog, bank: str, pcr: int) -> list[EventDifference]:
    """The events of one PCR that differ between the golden log and this one, in log order.

    Events are aligned by type and description; an aligned pair whose digests differ is 'changed', as is a pair
    of the same type whose description changed in place (a command line); the rest are 'added' or 'removed'."""
    old = [g for g in golden if g.pcr == pcr]
    new = [
        GoldenEvent(e.pcr, e.type_name, e.description, e.digests[bank])
        for e in log.events
        if e.measured and e.pcr == pcr and bank in e.digests
    ]
    matcher = difflib.SequenceMatcher(
        None, [(g.type, g.description) for g in old], [(g.type, g.description) for g in new], autojunk=False
    )
    found: list[EventDifference] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag in ("equal", "replace"):
            for before, after in zip(old[i1:i2], new[j1:j2]):
                if before.type != after.type:
                    found.append(_difference(before, "removed"))
                    found.append(_difference(after, "added"))
                elif before.digest != after.digest:
                    description = (
                        after.description
                        if before.description == after.description
                        else (f"{before.description} -> {after.description}")
                    )
                    found.append(
                        EventDifference(
                            pcr,
                            "changed",
                            after.type,
                            description[: 2 * MAX_DESCRIPTION],
                            before.digest.hex(),
                            after.digest.hex(),
                        )
                    )
            common = min(i2 - i1, j2 - j1)
            i1, j1 = i1 + common, j1 + common
        found.extend(_difference(g, "removed") for g in old[i1:i2])
        found.extend(_difference(g, "added") for g in new[j1:j2])
    return found


def _difference(event: GoldenEvent, change: str) -> EventDifference:
    digest = event.digest.hex()
    return EventDifference(
        event.pcr,
        change,
        event.type,
        event.description,
        digest if change == "removed" else None,
        digest if change == "added" else None,
    )


def build(banks: tuple[str, ...], events: list[tuple[int, int, dict[str, bytes], bytes]]) -> bytes:
    """A crypto-agile log: the Spec ID event for these banks, then (pcr, type, bank -> digest, data) records.
    The lab writes its boot events with it, and tests build fixture logs."""
    algorithms = [ALGORITHM_IDS[bank] for bank in banks]
    spec_id = _SPEC_ID_HEAD.pack(SPEC_ID_SIGNATURE, 0, 0, 2, 0, 2, len(algorithms))
    spec_id += b"".join(_ALG.pack(alg, ALGORITHMS[alg][1]) for alg in algorithms) + b"\x00"
    out = [_FIRST_HEAD.pack(0, EV_NO_ACTION, bytes(20), len(spec_id)), spec_id]
    for pcr, event_type, digests, data in events:
        out.append(_EVENT2_HEAD.pack(pcr, event_type, len(algorithms)))
        out.extend(_U16.pack(alg) + digests[ALGORITHMS[alg][0]] for alg in algorithms)
        out.append(_U32.pack(len(data)) + data)
    return b"".join(out)


def measured_digests(banks: tuple[str, ...], data: bytes) -> dict[str, bytes]:
    """The digest of each bank over the event data, as firmware measures a string or a tag."""
    return {bank: hashlib.new(bank, data).digest() for bank in banks}
