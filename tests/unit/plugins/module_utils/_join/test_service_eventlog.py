"""A joining node sends its firmware's TCG event log; the join service replays it against the quote and, with a
golden log in its policy, names the event behind a PCR that fails (real client, real service, real swtpm)."""

from __future__ import annotations

import dataclasses
import hashlib
import struct

import pytest
from tpm2_pytss import ESYS_TR, TPML_DIGEST_VALUES, TPMT_HA, TPMU_HA

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import eventlog as el
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import issuer
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import dump_policy
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.client import JoinError
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.protocol import JoinTicket

from join_harness import join_with_client


def _boot_log(command_line: str) -> bytes:
    """PCR 4 a kernel, PCR 9 the Linux EFI stub's LoadOptions tag for this command line (digests in sha256)."""
    tag = b"LOADED_IMAGE::LoadOptions\x00"
    return el.build(
        ("sha256",),
        [
            (4, el.EV_EFI_BOOT_SERVICES_APPLICATION, {"sha256": hashlib.sha256(b"kernel").digest()}, bytes(32)),
            (
                9,
                el.EV_EVENT_TAG,
                {"sha256": hashlib.sha256(command_line.encode("utf-16-le")).digest()},
                struct.pack("<II", 0x8F3B22ED, len(tag)) + tag,
            ),
        ],
    )


@pytest.fixture
def booted(join_lab, tmp_path, monkeypatch):
    """The lab's swtpm booted through a log that the node's client finds where the kernel puts the firmware's."""
    log = _boot_log("ro quiet")
    with issuer.Tpm(join_lab.swtpm.tcti) as tpm:
        for event in el.parse(log).events:
            digest = TPMT_HA(hashAlg=el.ALGORITHM_IDS["sha256"], digest=TPMU_HA(sha256=event.digests["sha256"]))
            tpm.esapi.pcr_extend(getattr(ESYS_TR, f"PCR{event.pcr}"), TPML_DIGEST_VALUES([digest]))
    firmware = tmp_path / "binary_bios_measurements"
    firmware.write_bytes(log)
    monkeypatch.setattr(el, "DEFAULT_PATH", str(firmware))
    return join_lab, firmware, log


def test_a_node_whose_log_replays_joins(booted):
    join_lab, _firmware, _log = booted
    service = join_lab.start("pcrs-only")
    ticket = join_with_client(join_lab, service)
    assert isinstance(ticket, JoinTicket) and ticket.node_name == "worker-1"


def test_a_node_whose_log_cannot_be_parsed_joins_without_it_and_is_warned(booted):
    join_lab, firmware, log = booted
    firmware.write_bytes(log[:-3])
    service = join_lab.start("pcrs-only")
    warnings: list[str] = []
    ticket = join_with_client(join_lab, service, warnings=warnings)
    assert isinstance(ticket, JoinTicket)
    assert len(warnings) == 1 and warnings[0].startswith(f"event log {firmware}: event 2 (offset ")
    assert warnings[0].endswith("the evidence goes without the event log (its PCRs are checked as quoted)")


def test_event_log_none_sends_no_log(booted):
    join_lab, firmware, log = booted
    # A log that would be refused (a digest flipped) is not sent at all: the join passes on the quoted PCRs.
    digest = el.parse(log).events[1].digests["sha256"]
    firmware.write_bytes(log.replace(digest, bytes((digest[0] ^ 1,)) + digest[1:]))
    service = join_lab.start("pcrs-only")
    warnings: list[str] = []
    assert isinstance(join_with_client(join_lab, service, event_log="none", warnings=warnings), JoinTicket)
    assert warnings == []


def test_a_log_with_one_digest_flipped_is_refused_as_a_mismatch(booted):
    join_lab, firmware, log = booted
    digest = el.parse(log).events[1].digests["sha256"]
    firmware.write_bytes(log.replace(digest, bytes((digest[0] ^ 1,)) + digest[1:]))
    service = join_lab.start("pcrs-only")
    with pytest.raises(JoinError) as refused:
        join_with_client(join_lab, service)
    assert refused.value.reason == "event-log-mismatch"
    assert "the event log does not replay to the quoted PCR(s) sha256:9" in str(refused.value)


def test_a_changed_command_line_is_refused_naming_the_loadoptions_event(booted):
    join_lab, _firmware, _log = booted
    service = join_lab.start("pcrs-only")
    # The golden node booted another command line: its PCR 9 and its LoadOptions event are what the policy holds.
    golden_log = el.parse(_boot_log("ro quiet init=/bin/sh"))
    golden_pcr9 = golden_log.replay()["sha256"][9]
    policy = join_lab.write_policy("pcrs-only").with_rule(9, [golden_pcr9])
    policy = dataclasses.replace(policy, event_log=el.golden_events(golden_log, "sha256"))
    join_lab.policy_file.write_text(dump_policy(policy))
    with pytest.raises(JoinError) as refused:
        join_with_client(join_lab, service)
    assert refused.value.reason == "pcr-policy"
    assert (
        "PCR(s) 9 do not match the measurement policy: PCR 9: EV_EVENT_TAG LOADED_IMAGE::LoadOptions digest changed"
    ) in str(refused.value)
