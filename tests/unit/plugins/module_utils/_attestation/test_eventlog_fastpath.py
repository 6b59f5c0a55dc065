"""The event-log parser's one-unpack fast path and the per-bank replay give exactly what the record-by-record parser
(_parse_event2, whose checks and messages are the definition) and a replay with hashlib.new give."""

from __future__ import annotations

import hashlib
import struct

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import eventlog as el
from eventlogs import firmware_log, gce_like_log, ipl_log


def _reference_parse(raw: bytes) -> el.EventLog:
    sizes, offset = el._parse_spec_id(raw, (0,))
    events = []
    while offset < len(raw):
        event, offset = el._parse_event2(raw, offset, len(events) + 1, sizes, el.PCR_INDICES)
        events.append(event)
    return el.EventLog(tuple(el._alg_name(alg) for alg in sizes), tuple(events))


def _reference_replay(log: el.EventLog) -> dict[str, dict[int, bytes]]:
    locality = el.startup_locality(log)
    values: dict[str, dict[int, bytes]] = {}
    for bank in log.banks:
        bank_values: dict[int, bytes] = {}
        for event in log.events:
            if event.measured:
                digest = event.digests[bank]
                old = bank_values.get(event.pcr, el._initial_value(event.pcr, len(digest), locality))
                bank_values[event.pcr] = hashlib.new(bank, old + digest).digest()
        values[bank] = bank_values
    return values


def _reversed_digests(raw: bytes, number: int) -> bytes:
    """The log with event ``number``'s two digests swapped in place (sha256 first): legal, not the Spec ID order."""
    event = el.parse(raw).events[number - 1]
    sha1, sha256 = event.digests["sha1"], event.digests["sha256"]
    old = struct.pack("<H", 0x0004) + sha1 + struct.pack("<H", 0x000B) + sha256
    new = struct.pack("<H", 0x000B) + sha256 + struct.pack("<H", 0x0004) + sha1
    assert raw.count(old) >= 1
    return raw.replace(old, new, 1)


LOGS = {
    "gce": gce_like_log(),
    "firmware": firmware_log(),
    "ipl-sha256": ipl_log({8: ["grub_cmd: linux /vmlinuz", "grub_cmd: initrd /initrd"], 9: ["/boot/grub/grub.cfg"]}),
    "reordered": _reversed_digests(firmware_log(), 3),
}


@pytest.mark.parametrize("name", sorted(LOGS))
def test_the_fast_path_parses_exactly_as_the_record_by_record_parser(name):
    raw = LOGS[name]
    parsed = el.parse(raw)
    assert parsed == _reference_parse(raw)
    assert [list(e.digests) for e in parsed.events] == [list(e.digests) for e in _reference_parse(raw).events]


def test_a_reordered_record_keeps_its_own_digest_order():
    event = el.parse(LOGS["reordered"]).events[2]
    assert list(event.digests) == ["sha256", "sha1"]


@pytest.mark.parametrize("name", sorted(LOGS))
def test_replay_and_replay_bank_give_what_a_replay_with_hashlib_new_gives(name):
    parsed = el.parse(LOGS[name])
    assert parsed.replay() == _reference_replay(parsed)
    for bank in parsed.banks:
        assert el.replay_bank(parsed, bank) == _reference_replay(parsed)[bank]
    assert el.replay_bank(parsed, "sha512") is None


@pytest.mark.parametrize("cut", [1, 4, 13, 40, 100])
def test_a_truncated_log_gets_the_record_by_record_parsers_error(cut):
    raw = gce_like_log()[:-cut]
    with pytest.raises(el.EventLogError) as fast:
        el.parse(raw)
    with pytest.raises(el.EventLogError) as reference:
        _reference_parse(raw)
    assert str(fast.value) == str(reference.value)


def test_a_bad_pcr_index_in_a_well_formed_record_gets_the_record_by_record_parsers_error():
    raw = firmware_log()
    event = el.parse(raw).events[4]
    head = struct.pack("<III", event.pcr, event.type, 2) + struct.pack("<H", 0x0004) + event.digests["sha1"]
    bad = raw.replace(head, struct.pack("<III", 30, event.type, 2) + head[12:], 1)
    with pytest.raises(el.EventLogError, match="PCR index 30 is not 0..23") as fast:
        el.parse(bad)
    with pytest.raises(el.EventLogError) as reference:
        _reference_parse(bad)
    assert str(fast.value) == str(reference.value)
