"""The TCG event log parser (crypto-agile, and the older SHA-1 format): layout, replay, tpm2_eventlog agreement,
refusals, event differences."""

from __future__ import annotations

import hashlib
import re
import shutil
import struct
import subprocess

import pytest
import yaml

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import eventlog as el
from eventlogs import COMMAND_LINE, firmware_events, firmware_log, ipl_log, sha1_log

FIXTURE_LOGS = {
    "firmware sha1+sha256": lambda: firmware_log(locality=None),
    "firmware sha256": lambda: firmware_log(banks=("sha256",), locality=None),
    "firmware sha384": lambda: firmware_log(banks=("sha256", "sha384"), locality=None),
    "grub strings": lambda: ipl_log({8: ["grub_cmd: linux /vmlinuz", "kernel_cmdline: /vmlinuz ro"], 9: ["/vmlinuz"]}),
    "spec id only": lambda: el.build(("sha256",), []),
}


def _tpm2_eventlog(tmp_path, raw: bytes) -> dict:
    path = tmp_path / "binary_bios_measurements"
    path.write_bytes(raw)
    out = subprocess.run(["tpm2_eventlog", str(path)], check=True, capture_output=True, text=True).stdout
    return yaml.safe_load(out)


needs_tpm2_tools = pytest.mark.skipif(shutil.which("tpm2_eventlog") is None, reason="tpm2-tools is not installed")


@needs_tpm2_tools
@pytest.mark.parametrize("name", FIXTURE_LOGS)
def test_tpm2_eventlog_parses_each_fixture_log_and_agrees_on_every_digest_and_pcr(tmp_path, name):
    raw = FIXTURE_LOGS[name]()
    theirs = _tpm2_eventlog(tmp_path, raw)
    ours = el.parse(raw)
    events = theirs["events"][1:]  # theirs counts the Spec ID event as event 0
    assert [(e["PCRIndex"], e["EventType"]) for e in events] == [(e.pcr, e.type_name) for e in ours.events]
    assert [{d["AlgorithmId"]: d["Digest"] for d in e["Digests"]} for e in events] == [
        {bank: digest.hex() for bank, digest in e.digests.items()} for e in ours.events
    ]
    replayed = {
        bank: {pcr: int(value.hex(), 16) for pcr, value in values.items()}
        for bank, values in ours.replay().items()
        if values
    }
    assert replayed == (theirs.get("pcrs") or {})  # YAML reads their 0x... values as integers


def test_firmware_log_reads_as_the_real_vm_log_does():
    log = el.parse(firmware_log())
    assert log.banks == ("sha1", "sha256")
    named = [(e.pcr, e.type_name, e.description) for e in log.events]
    assert (0, "EV_S_CRTM_VERSION", "EDK II") in named
    assert (7, "EV_EFI_VARIABLE_DRIVER_CONFIG", "SecureBoot") in named
    assert (1, "EV_EFI_VARIABLE_BOOT", "BootOrder") in named
    assert (4, "EV_EFI_BOOT_SERVICES_APPLICATION", "\\EFI\\debian\\vmlinuz") in named
    assert named[-4:-1] == [
        (4, "EV_EFI_BOOT_SERVICES_APPLICATION", "\\EFI\\debian\\vmlinuz"),
        (9, "EV_EVENT_TAG", "LOADED_IMAGE::LoadOptions"),
        (9, "EV_EVENT_TAG", "Linux initrd"),
    ]
    assert [e.description for e in log.events if e.type == el.EV_SEPARATOR] == ["separator"] * 8
    assert log.events[0].number == 1 and log.events[0].description == "StartupLocality"


def test_replay_extends_each_bank_from_zero():
    raw = ipl_log({8: ["a", "b"]}, banks=("sha1", "sha256"))
    for bank in ("sha1", "sha256"):
        size = hashlib.new(bank).digest_size
        value = bytes(size)
        for text in (b"a", b"b"):
            value = hashlib.new(bank, value + hashlib.new(bank, text).digest()).digest()
        assert el.parse(raw).replay()[bank] == {8: value}


def test_no_action_events_are_not_extended_and_startup_locality_sets_pcr_0():
    # PC Client PFP: PCR 0 starts at the locality the firmware started the TPM from; EV_NO_ACTION is only logged.
    # (tpm2_eventlog 5.4 extends the StartupLocality event's zero digest instead, so this is pinned by hand.)
    with_locality = el.parse(firmware_log(locality=3)).replay()["sha256"]
    without = el.parse(firmware_log(locality=None)).replay()["sha256"]
    value = bytes(31) + b"\x03"
    for event in el.parse(firmware_log(locality=3)).events:
        if event.pcr == 0 and event.measured:
            value = hashlib.sha256(value + event.digests["sha256"]).digest()
    assert with_locality[0] == value != without[0]
    assert {i: v for i, v in with_locality.items() if i} == {i: v for i, v in without.items() if i}


def test_only_pcrs_the_log_extends_are_replayed():
    assert set(el.parse(firmware_log()).replay()["sha256"]) == {0, 1, 2, 3, 4, 5, 6, 7, 9}


def test_event_type_names_cover_the_pc_client_table_and_name_unknown_types():
    assert el.type_name(0x80000003) == "EV_EFI_BOOT_SERVICES_APPLICATION"
    assert el.type_name(0xD) == "EV_IPL" and el.type_name(0x6) == "EV_EVENT_TAG"
    assert el.type_name(0x7FFF0000) == "EV_0x7fff0000"


@pytest.mark.parametrize(
    "event_type, data, description",
    [
        (
            el.EV_EVENT_TAG,
            struct.pack("<II", 0x8F3B22ED, 26) + b"LOADED_IMAGE::LoadOptions\x00",
            "LOADED_IMAGE::LoadOptions",
        ),
        (el.EV_EVENT_TAG, struct.pack("<II", 0x8F3B22EC, 0), "Linux initrd"),
        (el.EV_EVENT_TAG, struct.pack("<II", 0x12345678, 0), "tag 0x12345678"),
        (el.EV_EVENT_TAG, b"\x01", ""),
        (el.EV_IPL, b"kernel_cmdline: ro quiet\x00", "kernel_cmdline: ro quiet"),
        (el.EV_IPL, "\\vmlinuz".encode("utf-16-le") + b"\x00\x00", "\\vmlinuz"),
        (el.EV_IPL, b"\x89PNG\x00\x01binary", ""),
        (el.EV_IPL, b"x" * 1000, "x" * el.MAX_DESCRIPTION),
        (el.EV_SEPARATOR, b"\xff\xff\xff\xff", "error"),
        (el.EV_EFI_VARIABLE_BOOT, bytes(16) + struct.pack("<QQ", 10**12, 0), ""),
        (el.EV_EFI_BOOT_SERVICES_APPLICATION, bytes(31), ""),
        (el.EV_EFI_BOOT_SERVICES_APPLICATION, bytes(32), "image"),
    ],
)
def test_descriptions_are_readable_and_bounded(event_type, data, description):
    assert el.describe(event_type, data) == description


def _spec_id(algorithms=((0x000B, 32),), signature=el.SPEC_ID_SIGNATURE, major=2, vendor=b"", vendor_size=None):
    body = struct.pack("<16sIBBBBI", signature, 0, 0, major, 0, 2, len(algorithms))
    body += b"".join(struct.pack("<HH", alg, size) for alg, size in algorithms)
    body += bytes((len(vendor) if vendor_size is None else vendor_size,)) + vendor
    return struct.pack("<II20sI", 0, el.EV_NO_ACTION, bytes(20), len(body)) + body


def _event2(pcr=8, event_type=el.EV_IPL, digests=((0x000B, bytes(32)),), data=b"x", count=None, size=None):
    out = struct.pack("<III", pcr, event_type, len(digests) if count is None else count)
    out += b"".join(struct.pack("<H", alg) + digest for alg, digest in digests)
    return out + struct.pack("<I", len(data) if size is None else size) + data


GOOD = _spec_id() + _event2()
MALFORMED = [
    ("empty", b"", "event log is empty"),
    ("too large", GOOD + b"\x00" * el.MAX_EVENT_LOG_BYTES, f"larger than {el.MAX_EVENT_LOG_BYTES} bytes"),
    ("not bytes", "text", "must be bytes"),
    ("truncated header", GOOD[:20], "event 0 (the Spec ID event) is truncated"),
    (
        "a SHA-1 format log on PCR 24",
        struct.pack("<II20sI", 0, 8, bytes(20), 4) + b"1.00" + struct.pack("<II20sI", 24, 8, bytes(20), 0),
        "event 2 (offset 36) of the SHA-1 format log: PCR index 24 is not 0..23",
    ),
    (
        "a SHA-1 format log cut short",
        struct.pack("<II20sI", 0, 8, bytes(20), 40) + b"1.00",
        "event 1 (offset 0) of the SHA-1 format log data is truncated: 40 bytes needed at offset 32, 4 left",
    ),
    (
        "SHA-1 format header cut short",
        sha1_log() + struct.pack("<II", 8, el.EV_IPL),
        "of the SHA-1 format log is truncated: 32 bytes needed",
    ),
    (
        "too many SHA-1 format events",
        struct.pack("<II20sI", 8, el.EV_IPL, bytes(20), 0) * (el.MAX_EVENTS + 1),
        f"more than {el.MAX_EVENTS} events",
    ),
    ("first event on PCR 1", struct.pack("<II", 1, 3) + GOOD[8:], "must be EV_NO_ACTION on PCR 0"),
    ("no Spec ID signature", _spec_id(signature=b"Spec ID Event02\x00"), "does not start with 'Spec ID Event03'"),
    ("spec version 1", _spec_id(major=1), "spec version 1.x"),
    ("no algorithms", _spec_id(algorithms=()), "names 0 algorithms"),
    ("too many algorithms", _spec_id(algorithms=tuple((0x100 + i, 32) for i in range(9))), "names 9 algorithms"),
    ("algorithm twice", _spec_id(algorithms=((0x000B, 32), (0x000B, 32))), "names algorithm 0x000b twice"),
    ("wrong sha256 size", _spec_id(algorithms=((0x000B, 20),)), "gives algorithm sha256 a digest size of 20"),
    ("oversized unknown digest", _spec_id(algorithms=((0x0099, 65),)), "digest size of 65"),
    ("vendor info overruns", _spec_id(vendor=b"ab", vendor_size=5), "bytes of vendor information, its header says 5"),
    ("Spec ID data overruns", _spec_id()[:-1], "event 0 (the Spec ID event) data is truncated"),
    ("PCR 24", _spec_id() + _event2(pcr=24), "event 1 (offset 65): PCR index 24 is not 0..23"),
    ("digest count differs", _spec_id() + _event2(count=2), "carries 2 digest(s), the Spec ID event names 1"),
    ("unnamed algorithm", _spec_id() + _event2(digests=((0x0004, bytes(20)),)), "0x0004 is not named by the Spec ID"),
    (
        "same bank twice",
        _spec_id(((0x000B, 32), (0x0004, 20))) + _event2(digests=((0x000B, bytes(32)),) * 2),
        "carries two sha256 digests",
    ),
    ("digest truncated", (_spec_id() + _event2())[:-15], "event 1 (offset 65) sha256 digest is truncated"),
    ("event data overruns", _spec_id() + _event2(size=1000), "event 1 (offset 65) data is truncated"),
    ("trailing bytes", GOOD + b"\x00\x00", "event 2 (offset 116) is truncated: 12 bytes needed at offset 116, 2 left"),
    ("too many events", _spec_id() + _event2(data=b"") * (el.MAX_EVENTS + 1), f"more than {el.MAX_EVENTS} events"),
    (
        "bad StartupLocality",
        _spec_id() + _event2(pcr=0, event_type=el.EV_NO_ACTION, data=el.STARTUP_LOCALITY_SIGNATURE),
        "StartupLocality event of 16 bytes",
    ),
]


@pytest.mark.parametrize("raw, message", [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_malformed_logs_are_refused_naming_what_is_wrong(raw, message):
    with pytest.raises(el.EventLogError, match=re.escape(message)):
        el.parse(raw).replay()


def test_a_sha1_format_log_parses_as_the_one_bank_sha1_and_replays_as_firmware_extended_it():
    for raw in (sha1_log(), sha1_log(spec_id=False)):
        log = el.parse(raw)
        assert (log.format, log.banks) == (el.SHA1_FORMAT, ("sha1",))
        measured = [
            (pcr, kind, digests["sha1"])
            for pcr, kind, digests, _data in firmware_events(banks=("sha1",), locality=None)
        ]
        assert [(e.pcr, e.type, e.digests["sha1"]) for e in log.events if e.measured] == measured
        # The replay, worked out here from the events (sha1 from zero: swtpm starts at locality 0).
        expected: dict[int, bytes] = {}
        for pcr, _kind, digest in measured:
            expected[pcr] = hashlib.sha1(expected.get(pcr, bytes(20)) + digest).digest()
        assert log.replay() == {"sha1": expected}
    log = el.parse(sha1_log())
    assert (log.events[0].type_name, log.events[0].description) == ("EV_NO_ACTION", "Spec ID Event00")
    assert (4, "EV_EFI_BOOT_SERVICES_APPLICATION", "\\EFI\\debian\\vmlinuz") in [
        (e.pcr, e.type_name, e.description) for e in log.events
    ]
    assert el.parse(firmware_log()).format == el.CRYPTO_AGILE


def test_the_good_log_of_the_malformed_table_parses():
    log = el.parse(GOOD)
    assert log.banks == ("sha256",) and [(e.pcr, e.type_name, e.data) for e in log.events] == [(8, "EV_IPL", b"x")]


def test_an_unknown_algorithm_is_read_but_not_replayed():
    raw = _spec_id(((0x000B, 32), (0x0012, 32))) + _event2(digests=((0x000B, bytes(32)), (0x0012, b"\x01" * 32)))
    log = el.parse(raw)
    assert log.banks == ("sha256", "alg-0x0012") and set(log.replay()) == {"sha256"}


def test_a_log_of_max_events_parses():
    raw = _spec_id() + _event2(data=b"") * el.MAX_EVENTS
    assert len(el.parse(raw).events) == el.MAX_EVENTS


def _golden(raw, pcrs=None):
    return el.golden_events(el.parse(raw), "sha256", pcrs)


def test_a_changed_command_line_names_pcr_9_loadoptions_with_old_and_new_digests():
    golden = _golden(firmware_log())
    changed = el.parse(firmware_log(command_line=COMMAND_LINE + " debug"))
    found = el.differences(golden, changed, "sha256", 9)
    old = hashlib.sha256(COMMAND_LINE.encode("utf-16-le") + b"\0\0").hexdigest()
    new = hashlib.sha256((COMMAND_LINE + " debug").encode("utf-16-le") + b"\0\0").hexdigest()
    assert found == [el.EventDifference(9, "changed", "EV_EVENT_TAG", "LOADED_IMAGE::LoadOptions", old, new)]
    assert found[0].summary() == "PCR 9: EV_EVENT_TAG LOADED_IMAGE::LoadOptions digest changed"
    assert el.differences(golden, changed, "sha256", 4) == []


def test_a_changed_kernel_names_pcr_4_boot_services_application():
    found = el.differences(_golden(firmware_log()), el.parse(firmware_log(kernel=b"another kernel")), "sha256", 4)
    assert [(d.change, d.type, d.description) for d in found] == [
        ("changed", "EV_EFI_BOOT_SERVICES_APPLICATION", "\\EFI\\debian\\vmlinuz")
    ]


def test_added_and_removed_events_are_named():
    golden = _golden(ipl_log({8: ["grub_cmd: linux /vmlinuz", "kernel_cmdline: ro"]}))
    now = el.parse(ipl_log({8: ["grub_cmd: insmod evil", "grub_cmd: linux /vmlinuz"]}))
    found = el.differences(golden, now, "sha256", 8)
    assert [(d.change, d.description) for d in found] == [
        ("added", "grub_cmd: insmod evil"),
        ("removed", "kernel_cmdline: ro"),
    ]
    added = next(d for d in found if d.change == "added")
    assert added.old_digest is None and added.new_digest == hashlib.sha256(b"grub_cmd: insmod evil").hexdigest()
    removed_only = el.differences(golden, el.parse(ipl_log({8: ["grub_cmd: linux /vmlinuz"]})), "sha256", 8)
    assert [(d.change, d.description, d.new_digest) for d in removed_only] == [("removed", "kernel_cmdline: ro", None)]


def test_a_command_line_changed_in_place_is_one_changed_event_naming_both_lines():
    golden = _golden(ipl_log({8: ["kernel_cmdline: ro quiet"]}))
    found = el.differences(golden, el.parse(ipl_log({8: ["kernel_cmdline: ro quiet lab.tamper=1"]})), "sha256", 8)
    assert [(d.change, d.type, d.description) for d in found] == [
        ("changed", "EV_IPL", "kernel_cmdline: ro quiet -> kernel_cmdline: ro quiet lab.tamper=1")
    ]


def test_golden_events_keep_only_measured_events_of_the_asked_pcrs():
    golden = _golden(firmware_log(), {4, 9})
    assert [(g.pcr, g.type) for g in golden] == [
        (4, "EV_EFI_ACTION"),
        (4, "EV_SEPARATOR"),
        (4, "EV_EFI_BOOT_SERVICES_APPLICATION"),
        (9, "EV_EVENT_TAG"),
        (9, "EV_EVENT_TAG"),
    ]
    with pytest.raises(el.EventLogError, match="has no sha384 bank"):
        el.golden_events(el.parse(firmware_log()), "sha384")


def _ccel(events: bytes = b"", padding: int = 64) -> bytes:
    """A CC event log as TDVF writes it: the Spec ID record on MR index 1, sha384, the area padded with 0xFF."""
    spec_id = el.build(("sha384",), [])
    return struct.pack("<I", 1) + spec_id[4:] + events + b"\xff" * padding


def _cc_event(index: int, data: bytes) -> bytes:
    digest = hashlib.sha384(data).digest()
    return struct.pack("<IIIH", index, el.EV_EFI_ACTION, 1, 0x000C) + digest + struct.pack("<I", len(data)) + data


def test_a_ccel_area_parses_with_mr_indices_and_its_0xff_padding_ends_the_log():
    log = el.parse_ccel(_ccel(_cc_event(1, b"one") + _cc_event(4, b"four")))
    assert log.banks == ("sha384",)
    assert [(e.number, e.pcr, e.data) for e in log.events] == [(1, 1, b"one"), (2, 4, b"four")]


@pytest.mark.parametrize(
    "raw, message",
    [
        (_ccel(_cc_event(5, b"x")), "PCR index 5 is not 0..4"),
        (_ccel(padding=8) + b"\x00", "padding at offset"),
        (struct.pack("<I", 2) + _ccel()[4:], "must be EV_NO_ACTION on PCR 0 or 1"),
        (b"\xff" * (el.MAX_CCEL_AREA_BYTES + 1), "CC event log is larger than"),
    ],
    ids=["MR index 5", "bytes after the padding", "Spec ID on MR 2", "area too large"],
)
def test_malformed_ccel_areas_are_refused_naming_what_is_wrong(raw, message):
    with pytest.raises(el.EventLogError, match=re.escape(message)):
        el.parse_ccel(raw)


def test_a_tpm_log_still_refuses_0xff_padding_and_mr_index_records():
    with pytest.raises(el.EventLogError, match="is truncated"):
        el.parse(GOOD + b"\xff" * 8)
    with pytest.raises(el.EventLogError, match="must be EV_NO_ACTION on PCR 0 with"):
        el.parse(struct.pack("<I", 1) + GOOD[4:])
