"""The verifier replays the evidence's TCG event log against a real swtpm's quote and names the events that differ
from an enrolled golden log; the node reads, and the measurements module enrols, such logs."""

from __future__ import annotations

import base64
import hashlib
import json
import os

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import eventlog as el
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import issuer, node, tpm2
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.evidence import (
    EvidenceError,
    qualifying_data,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.tpm_evidence import (
    TpmEvidence as Evidence,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import (
    MeasurementPolicy,
    PcrRule,
    PolicyError,
    dump_policy,
    parse_policy,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.verifier import (
    VerificationError,
    Verifier,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.seal import EphemeralKey
from eventlogs import COMMAND_LINE, extend_into, firmware_log, ipl_log, sha1_log

POLICY_PCRS = (0, 4, 7, 9)


def _boot(swtpm, log: bytes) -> None:
    """What firmware does at boot: extend each measured event into the TPM."""
    with issuer.Tpm(swtpm.tcti) as tpm:
        extend_into(tpm, log)


def _evidence(swtpm, log: bytes | None):
    nonce = os.urandom(32)
    with issuer.Tpm(swtpm.tcti) as tpm:
        return issuer.issue_evidence(tpm, nonce, EphemeralKey.generate().public_bytes(), event_log=log), nonce


def _policy(evidence, golden_log: bytes | None = None, warn_only=()):
    values = evidence.pcrs["sha256"]
    golden = el.golden_events(el.parse(golden_log), "sha256", set(POLICY_PCRS)) if golden_log else ()
    rules = {i: PcrRule(i, (values[i],), i in warn_only) for i in POLICY_PCRS}
    return MeasurementPolicy("sha256", rules, "pcrs-only", golden)


def _flip_digest(log: bytes, event_number: int, bank: str = "sha256") -> bytes:
    event = el.parse(log).events[event_number - 1]
    offset = log.index(event.digests[bank])
    return log[:offset] + bytes((log[offset] ^ 1,)) + log[offset + 1 :]


@pytest.fixture
def booted(swtpm):
    """A swtpm booted through the firmware log, its evidence carrying that log, and a policy of its PCRs."""
    log = firmware_log(locality=None)
    _boot(swtpm, log)
    evidence, nonce = _evidence(swtpm, log)
    return swtpm, log, evidence, nonce


def test_a_log_that_replays_to_the_quote_verifies(booted):
    swtpm, log, evidence, nonce = booted
    replayed = el.parse(log).replay()["sha256"]
    assert all(evidence.pcrs["sha256"][i] == value for i, value in replayed.items())
    result = Verifier(_policy(evidence, log)).verify(evidence.to_json(), nonce)
    assert result.to_result()["verified"] is True


def test_a_log_with_one_digest_flipped_is_refused_as_a_mismatch_naming_the_pcr(booted):
    swtpm, log, evidence, nonce = booted
    kernel = next(e for e in el.parse(log).events if e.type == el.EV_EFI_BOOT_SERVICES_APPLICATION)
    document = evidence._replace(event_log=_flip_digest(log, kernel.number)).to_json()
    with pytest.raises(VerificationError) as refused:
        Verifier(_policy(evidence)).verify(document, nonce)
    assert refused.value.reason == "event-log-mismatch"
    assert str(refused.value) == "the event log does not replay to the quoted PCR(s) sha256:4"
    assert [(m["pcr"], m["bank"], m["quoted"]) for m in refused.value.mismatches] == [
        (4, "sha256", evidence.pcrs["sha256"][4].hex())
    ]


def test_a_flipped_digest_of_a_bank_the_quote_does_not_cover_is_not_compared(booted):
    swtpm, log, evidence, nonce = booted
    document = evidence._replace(event_log=_flip_digest(log, 2, "sha1")).to_json()
    assert Verifier(_policy(evidence)).verify(document, nonce).to_result()["verified"] is True


def test_a_log_without_the_quoted_bank_is_refused(booted):
    swtpm, log, evidence, nonce = booted
    document = evidence._replace(event_log=firmware_log(banks=("sha1",), locality=None)).to_json()
    message = r"the event log has no bank the quote covers \(it has sha1\)"
    with pytest.raises(VerificationError, match=message) as refused:
        Verifier(_policy(evidence)).verify(document, nonce)
    assert refused.value.reason == "event-log-mismatch"


def _evidence_quoting_sha1_too(swtpm, log: bytes):
    """Evidence whose quote selects the sha1 bank after sha256: swtpm has not allocated sha1, so that bank comes back
    selected with no PCR, as on a TPM that has one bank only."""
    nonce, user_data = os.urandom(32), EphemeralKey.generate().public_bytes()
    with issuer.Tpm(swtpm.tcti) as tpm:
        ak, ak_public = tpm.attestation_key()
        values = tpm.read_pcrs()
        quote, signature = tpm.quote(ak, qualifying_data(nonce, user_data), more_banks={"sha1": issuer.ALL_PCRS})
        tpm.flush(ak)
    banks = [(selected.alg, selected.indices) for selected in tpm2.parse_attest(quote).pcr_selection]
    assert banks == [(tpm2.ALG_SHA256, issuer.ALL_PCRS), (tpm2.HASH_IDS["sha1"], ())]
    evidence = Evidence("tpm", ak_public, quote, signature, {"sha256": values}, user_data, event_log=log)
    return evidence, nonce


def test_a_second_empty_bank_in_the_quote_is_not_a_bank_the_log_is_compared_with(booted):
    # It raised KeyError (gRPC INTERNAL in the join service): the log's sha256 bank is compared, the empty sha1 not.
    swtpm, log, _evidence, _nonce = booted
    evidence, nonce = _evidence_quoting_sha1_too(swtpm, log)
    assert Verifier(_policy(evidence)).verify(evidence.to_json(), nonce).to_result()["verified"] is True
    mismatched = evidence._replace(event_log=firmware_log(command_line="init=/bin/sh", locality=None))
    with pytest.raises(VerificationError, match=r"does not replay to the quoted PCR\(s\) sha256:9$"):
        Verifier(_policy(evidence)).verify(mismatched.to_json(), nonce)


def test_a_sha1_log_against_a_quote_whose_sha1_bank_is_empty_is_refused_as_uncovered(booted):
    swtpm, _log, _evidence, _nonce = booted
    evidence, nonce = _evidence_quoting_sha1_too(swtpm, firmware_log(banks=("sha1",), locality=None))
    with pytest.raises(
        VerificationError, match=r"the event log has no bank the quote covers \(it has sha1\)"
    ) as refused:
        Verifier(_policy(evidence)).verify(evidence.to_json(), nonce)
    assert refused.value.reason == "event-log-mismatch"


def test_a_sha1_format_log_is_quoted_in_its_bank_and_replayed_against_it(sha1_swtpm):
    # Older firmware (GCE's Debian 10 shielded VMs) writes this format and extends the sha1 bank.
    log = sha1_log()
    _boot(sha1_swtpm, log)
    nonce, warnings = os.urandom(32), []
    with issuer.Tpm(sha1_swtpm.tcti) as tpm:
        evidence = issuer.issue_evidence(
            tpm, nonce, EphemeralKey.generate().public_bytes(), event_log=log, warnings=warnings
        )
    replayed = el.parse(log).replay()["sha1"]
    assert warnings == [] and evidence.event_log == log
    assert evidence.pcrs["sha1"] == replayed and set(evidence.pcrs["sha256"]) == set(issuer.ALL_PCRS)
    assert Verifier(_policy(evidence)).verify(evidence.to_json(), nonce).to_result()["verified"] is True
    other_boot = evidence._replace(event_log=sha1_log(command_line="init=/bin/sh"))
    with pytest.raises(VerificationError, match=r"does not replay to the quoted PCR\(s\) sha1:9$") as refused:
        Verifier(_policy(evidence)).verify(other_boot.to_json(), nonce)
    assert refused.value.reason == "event-log-mismatch"


def test_a_sha1_format_log_on_a_tpm_without_a_sha1_bank_is_left_out_with_a_warning(swtpm):
    log = sha1_log()
    _boot(swtpm, log)
    nonce, warnings = os.urandom(32), []
    with issuer.Tpm(swtpm.tcti) as tpm:
        evidence = issuer.issue_evidence(
            tpm, nonce, EphemeralKey.generate().public_bytes(), event_log=log, warnings=warnings
        )
    assert evidence.event_log is None and list(evidence.pcrs) == ["sha256"]
    assert warnings == [
        "the event log is in the sha1 bank only, which this TPM has not allocated: no quote can cover it, so the "
        "evidence goes without it (its PCRs are checked as quoted)"
    ]
    assert Verifier(_policy(evidence)).verify(evidence.to_json(), nonce).to_result()["verified"] is True


def test_a_log_the_node_cannot_use_is_left_out_with_a_warning_and_none_sends_none(tmp_path, swtpm):
    path = tmp_path / "binary_bios_measurements"
    path.write_bytes(firmware_log()[:40])
    assert node.event_log_for_evidence(str(path)) == (
        None,
        [
            f"event log {path}: event 0 (the Spec ID event) data is truncated: 37 bytes needed at offset 32, 8 left: "
            "the evidence goes without the event log (its PCRs are checked as quoted)"
        ],
    )
    path.write_bytes(firmware_log() + bytes(el.MAX_EVENT_LOG_BYTES + 1 - len(firmware_log())))
    log, warnings = node.event_log_for_evidence(str(path))
    assert log is None and warnings[0].startswith(f"event log {path} is larger than {el.MAX_EVENT_LOG_BYTES} bytes")
    with pytest.raises(EvidenceError, match="cannot read the event log .*absent: No such file"):
        node.event_log_for_evidence(str(tmp_path / "absent"))
    path.write_bytes(sha1_log())
    assert node.event_log_for_evidence(str(path)) == (sha1_log(), [])
    assert node.event_log_for_evidence(str(path), "none") == (None, [])
    # What tpm_evidence returns: evidence without the log, and the warning, on a real TPM.
    path.write_bytes(firmware_log()[:40])
    produced = node.produce_evidence(swtpm.tcti, os.urandom(32).hex(), "x25519", False, str(path), None, False)
    assert "event_log" not in produced["evidence"] and "goes without the event log" in produced["warnings"][0]
    produced = node.produce_evidence(swtpm.tcti, os.urandom(32).hex(), "x25519", False, None, None, False, "none")
    assert "event_log" not in produced["evidence"] and produced["warnings"] == []


def test_a_log_of_another_boot_is_refused(booted):
    swtpm, log, evidence, nonce = booted
    document = evidence._replace(event_log=firmware_log(command_line="init=/bin/sh", locality=None)).to_json()
    with pytest.raises(VerificationError, match=r"does not replay to the quoted PCR\(s\) sha256:9$") as refused:
        Verifier(_policy(evidence)).verify(document, nonce)
    assert refused.value.reason == "event-log-mismatch"


def test_a_malformed_log_is_refused_as_malformed_naming_the_field(booted):
    swtpm, log, evidence, nonce = booted
    document = evidence._replace(event_log=log[:-3]).to_json()
    message = r"^evidence field 'event_log': event 17 \(offset \d+\) data is truncated: 29 bytes needed"
    with pytest.raises(VerificationError, match=message) as refused:
        Verifier(_policy(evidence)).verify(document, nonce)
    assert refused.value.reason == "malformed"


@pytest.fixture
def golden_policy(start_swtpm):
    """The policy of a golden boot (its PCRs and its event log), made on a TPM of its own."""
    tpm = start_swtpm("lab")
    golden_log = firmware_log(locality=None)
    _boot(tpm, golden_log)
    golden, _nonce = _evidence(tpm, golden_log)
    tpm.stop()
    return golden, golden_log


def _booted_with(start_swtpm, log):
    tpm = start_swtpm("lab")
    _boot(tpm, log)
    return _evidence(tpm, log)


def test_a_changed_command_line_is_refused_naming_pcr_9_loadoptions_and_both_digests(start_swtpm, golden_policy):
    golden, golden_log = golden_policy
    changed_log = firmware_log(command_line=COMMAND_LINE + " init=/bin/sh", locality=None)
    evidence, nonce = _booted_with(start_swtpm, changed_log)
    with pytest.raises(VerificationError) as refused:
        Verifier(_policy(golden, golden_log)).verify(evidence.to_json(), nonce)
    assert refused.value.reason == "pcr-policy"
    assert str(refused.value).startswith(
        "PCR(s) 9 do not match the measurement policy: PCR 9: EV_EVENT_TAG LOADED_IMAGE::LoadOptions digest changed "
        "(PCR 9 is "
    )
    [mismatch] = refused.value.mismatches
    old = hashlib.sha256(COMMAND_LINE.encode("utf-16-le") + b"\0\0").hexdigest()
    new = hashlib.sha256((COMMAND_LINE + " init=/bin/sh").encode("utf-16-le") + b"\0\0").hexdigest()
    assert mismatch["events"] == [
        {
            "pcr": 9,
            "change": "changed",
            "type": "EV_EVENT_TAG",
            "description": "LOADED_IMAGE::LoadOptions",
            "old_digest": old,
            "new_digest": new,
            "summary": "PCR 9: EV_EVENT_TAG LOADED_IMAGE::LoadOptions digest changed",
        }
    ]


def test_a_changed_kernel_names_pcr_4_and_a_warn_only_pcr_is_explained_too(start_swtpm, golden_policy):
    golden, golden_log = golden_policy
    changed_log = firmware_log(kernel=b"another kernel", command_line="quiet", locality=None)
    evidence, nonce = _booted_with(start_swtpm, changed_log)
    with pytest.raises(VerificationError) as refused:
        Verifier(_policy(golden, golden_log, warn_only=(9,))).verify(evidence.to_json(), nonce)
    assert str(refused.value).startswith(
        "PCR(s) 4 do not match the measurement policy: PCR 4: EV_EFI_BOOT_SERVICES_APPLICATION \\EFI\\debian\\vmlinuz "
        "digest changed (PCR 4 is "
    )
    [warning] = refused.value.warnings
    assert [e["summary"] for e in warning["events"]] == ["PCR 9: EV_EVENT_TAG LOADED_IMAGE::LoadOptions digest changed"]


def test_without_a_golden_log_a_failing_pcr_names_no_events(start_swtpm, golden_policy):
    golden, _golden_log = golden_policy
    evidence, nonce = _booted_with(start_swtpm, firmware_log(command_line="quiet", locality=None))
    with pytest.raises(VerificationError) as refused:
        Verifier(_policy(golden)).verify(evidence.to_json(), nonce)
    assert str(refused.value).startswith("PCR(s) 9 do not match the measurement policy (PCR 9 is ")
    assert "events" not in refused.value.mismatches[0]


def test_evidence_without_a_log_is_verified_by_its_pcrs_alone(booted, start_swtpm):
    swtpm, log, evidence, nonce = booted
    bare = evidence._replace(event_log=None)
    assert "event_log" not in bare.to_document()
    assert Verifier(_policy(evidence, log)).verify(bare.to_json(), nonce).to_result()["verified"] is True


# ---- the policy's golden event log ----------------------------------------------------------------------


def test_a_policy_with_a_golden_log_round_trips():
    log = firmware_log()
    policy = MeasurementPolicy(
        "sha256", {9: PcrRule(9, (bytes(32),))}, "pcrs-only", el.golden_events(el.parse(log), "sha256", {9})
    )
    again = parse_policy(dump_policy(policy))
    assert again == policy
    assert again.to_document()["event_log"][0] == {
        "pcr": 9,
        "type": "EV_EVENT_TAG",
        "description": "LOADED_IMAGE::LoadOptions",
        "digest": hashlib.sha256(COMMAND_LINE.encode("utf-16-le") + b"\0\0").hexdigest(),
    }


GOOD_GOLDEN = {"pcr": 8, "type": "EV_IPL", "description": "kernel_cmdline: ro", "digest": "ab" * 32}
BAD_GOLDEN_LOGS = [
    ("a mapping", {"0": GOOD_GOLDEN}, "'event_log' must be a list of at most 1024 events"),
    ("too many", [GOOD_GOLDEN] * (el.MAX_EVENTS + 1), "'event_log' must be a list of at most 1024 events"),
    ("an extra key", [dict(GOOD_GOLDEN, bank="sha256")], "entry 1: must be a mapping of exactly pcr, type"),
    ("no digest", [{k: v for k, v in GOOD_GOLDEN.items() if k != "digest"}], "entry 1: must be a mapping of exactly"),
    ("unknown type", [dict(GOOD_GOLDEN, type="EV_KERNEL")], "entry 1: type 'EV_KERNEL' is not a TCG event type name"),
    ("PCR 24", [dict(GOOD_GOLDEN, pcr=24)], "PCR index 24 is not 0..23"),
    ("sha1 digest", [dict(GOOD_GOLDEN, digest="ab" * 20)], "is not a 32-byte hex digest"),
    ("long description", [dict(GOOD_GOLDEN, description="x" * 161)], "description must be text of at most 160"),
]


@pytest.mark.parametrize("event_log, message", [c[1:] for c in BAD_GOLDEN_LOGS], ids=[c[0] for c in BAD_GOLDEN_LOGS])
def test_a_bad_golden_log_in_a_policy_is_refused(event_log, message):
    document = {"version": 1, "pcrs": {"8": {"allowed": ["ab" * 32]}}, "event_log": event_log}
    with pytest.raises(PolicyError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_policy(json.dumps(document))


def test_an_unknown_event_type_by_number_is_a_valid_golden_type():
    document = {
        "version": 1,
        "pcrs": {"8": {"allowed": ["ab" * 32]}},
        "event_log": [dict(GOOD_GOLDEN, type="EV_0x7fff0000")],
    }
    assert parse_policy(json.dumps(document)).event_log[0].type == "EV_0x7fff0000"


# ---- the node: reading and enrolling its log ----------------------------------------------------------------


def test_the_node_reads_a_log_and_refuses_a_missing_or_malformed_one(tmp_path):
    path = tmp_path / "binary_bios_measurements"
    path.write_bytes(firmware_log())
    assert node.read_event_log(str(path)) == firmware_log()
    with pytest.raises(EvidenceError, match=r"cannot read the event log .*/absent: No such file"):
        node.read_event_log(str(tmp_path / "absent"))
    path.write_bytes(firmware_log()[:40])
    message = r"event log .*binary_bios_measurements: event 0 \(the Spec ID event\) data is truncated"
    with pytest.raises(EvidenceError, match=message):
        node.read_event_log(str(path))
    path.write_bytes(firmware_log() + bytes(el.MAX_EVENT_LOG_BYTES + 1 - len(firmware_log())))
    with pytest.raises(EvidenceError, match=f"^event log {path} is larger than {el.MAX_EVENT_LOG_BYTES} bytes$"):
        node.read_event_log(str(path))


def test_without_a_path_the_node_reads_the_firmware_log_only_where_there_is_one(monkeypatch, tmp_path):
    monkeypatch.setattr(el, "DEFAULT_PATH", str(tmp_path / "absent"))
    assert node.read_event_log(None) is None
    (tmp_path / "firmware").write_bytes(firmware_log())
    monkeypatch.setattr(el, "DEFAULT_PATH", str(tmp_path / "firmware"))
    assert node.read_event_log(None) == firmware_log()
    # Not readable by this user (securityfs gives root alone): no log, as on a node without one.
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    assert node.read_event_log(None) is None


def test_measurements_enrol_the_golden_log_beside_the_pcrs(swtpm, tmp_path):
    log = ipl_log({8: ["kernel_cmdline: ro quiet"], 9: ["/boot/vmlinuz", "/boot/initrd"]})
    _boot(swtpm, log)
    path = tmp_path / "log"
    path.write_bytes(log)
    document = node.read_measurements(swtpm.tcti, [8, 9, 15], "sha256", "pcrs-only", [], str(path))
    assert document["event_log"] == [
        {
            "pcr": 8,
            "type": "EV_IPL",
            "description": "kernel_cmdline: ro quiet",
            "digest": hashlib.sha256(b"kernel_cmdline: ro quiet").hexdigest(),
        },
        {
            "pcr": 9,
            "type": "EV_IPL",
            "description": "/boot/vmlinuz",
            "digest": hashlib.sha256(b"/boot/vmlinuz").hexdigest(),
        },
        {
            "pcr": 9,
            "type": "EV_IPL",
            "description": "/boot/initrd",
            "digest": hashlib.sha256(b"/boot/initrd").hexdigest(),
        },
    ]
    assert parse_policy(json.dumps(document)).event_log[0].pcr == 8
    only_8 = node.read_measurements(swtpm.tcti, [8], "sha256", "pcrs-only", [], str(path))
    assert [e["pcr"] for e in only_8["event_log"]] == [8]


def test_measurements_refuse_a_log_that_does_not_explain_the_pcrs(swtpm, tmp_path):
    _boot(swtpm, ipl_log({8: ["kernel_cmdline: ro quiet"]}))
    path = tmp_path / "log"
    path.write_bytes(ipl_log({8: ["kernel_cmdline: ro"]}))
    with pytest.raises(EvidenceError, match=r"does not replay to this node's sha256 PCR\(s\) 8: not enrolled"):
        node.read_measurements(swtpm.tcti, [8, 9], "sha256", "pcrs-only", [], str(path))


def test_the_evidence_document_carries_the_log_in_base64(booted):
    swtpm, log, evidence, nonce = booted
    assert base64.b64decode(evidence.to_document()["event_log"]) == log
