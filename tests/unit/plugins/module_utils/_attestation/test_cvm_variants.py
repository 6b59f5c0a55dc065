# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""SEV-SNP and TDX behind the variant door: JSON evidence documents of the real Milan report and the real GCE TDX
quote verified through Verifier (their report data are fixed values: the raw report-data mode), lab-made reports and
quotes bound to the nonce and user data, the policy's per-variant sections, and the refusals."""

from __future__ import annotations

import base64
import datetime
import json
import re
from dataclasses import replace

import pytest
import test_sev_snp as snp_tests
import test_tdx as tdx_tests

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import tdx, variants
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.evidence import (
    EvidenceError,
    parse_evidence,
    report_data,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import (
    PolicyError,
    dump_policy,
    parse_policy,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.verifier import (
    VerificationError,
    Verifier,
)

NONCE = snp_tests.NONCE
USER_DATA = snp_tests.USER_DATA


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _snp_document(report: bytes, certificate: bytes, user_data: bytes = USER_DATA) -> str:
    return json.dumps(
        {
            "version": 1,
            "variant": "sev-snp",
            "user_data": _b64(user_data),
            "report": _b64(report),
            "certificate": _b64(certificate),
        }
    )


def _policy(section_name: str, section: dict):
    return parse_policy(json.dumps({"version": 1, section_name: section}))


def _at(moment: datetime.datetime):
    return lambda: moment


def test_the_variants_are_registered_behind_the_door():
    assert variants.names() == ("tpm", "sev-snp", "tdx")


def test_the_real_milan_report_verifies_through_the_verifier_from_a_json_document():
    real = {"report": snp_tests._read("attestation.bin"), "vcek": snp_tests._read("vcek.testcer")}
    section = {
        "chain": snp_tests._read("ask_ark_milan.pem").decode(),
        "product": "Milan",
        "measurements": [snp_tests.REAL_MEASUREMENT],
        **snp_tests.REAL_POLICY,
    }
    verifier = Verifier(_policy("sev-snp", section), now=_at(snp_tests.INSIDE_VCEK_VALIDITY))
    document = _snp_document(real["report"], real["vcek"])
    result = verifier.verify(document, NONCE, report_data=snp_tests.REAL_REPORT_DATA)
    assert result.variant == "sev-snp" and result.identity.hex() == snp_tests.REAL_CHIP_ID
    assert result.measurements["measurement"].hex() == snp_tests.REAL_MEASUREMENT
    assert result.to_result()["verified"] is True
    # Its report data is a fixed value, not this nonce's binding.
    with pytest.raises(VerificationError) as refused:
        verifier.verify(document, NONCE)
    assert refused.value.reason == "snp-report-data"
    # A Genoa root pinned for a Milan report.
    section["chain"] = snp_tests._read("ask_ark_genoa.pem").decode()
    genoa = Verifier(_policy("sev-snp", section), now=_at(snp_tests.INSIDE_VCEK_VALIDITY))
    with pytest.raises(VerificationError) as refused:
        genoa.verify(document, NONCE, report_data=snp_tests.REAL_REPORT_DATA)
    assert refused.value.reason == "snp-chain"


def test_a_lab_snp_report_binds_the_nonce_and_user_data_and_a_policy_difference_is_refused(lab_snp):
    real_report = snp_tests._read("attestation.bin")
    report = lab_snp.sign(snp_tests._lab_report(real_report))
    assert report[0x50:0x90] == report_data(NONCE, USER_DATA)
    pem = b"".join(c.public_bytes(snp_tests._PEM) for c in (lab_snp.chain.ask, lab_snp.chain.ark)).decode()
    section = {"chain": pem, "product": "Milan", "measurements": [snp_tests.LAB_MEASUREMENT.hex()]}
    verifier = Verifier(_policy("sev-snp", section), now=_at(snp_tests.INSIDE_VCEK_VALIDITY))
    document = _snp_document(report, lab_snp.certificate())
    assert verifier.verify(document, NONCE).identity == snp_tests.LAB_CHIP_ID
    with pytest.raises(VerificationError) as refused:
        verifier.verify(document, bytes(32))
    assert refused.value.reason == "snp-report-data"
    with pytest.raises(VerificationError) as refused:
        verifier.verify(_snp_document(report, lab_snp.certificate(), b"another key"), NONCE)
    assert refused.value.reason == "snp-report-data"
    section["minimum_tcb"] = {"snp": 200}
    strict = Verifier(_policy("sev-snp", section), now=_at(snp_tests.INSIDE_VCEK_VALIDITY))
    with pytest.raises(VerificationError) as refused:
        strict.verify(document, NONCE)
    assert refused.value.reason == "snp-tcb" and refused.value.mismatches[0]["field"] == "reported_tcb.snp"


@pytest.fixture(scope="module")
def lab_snp():
    return snp_tests._lab("Milan")


def test_the_real_gce_tdx_quote_and_its_ccel_verify_through_the_verifier_from_a_json_document():
    quote, log = tdx_tests._read("ccel/cos-113-tdx-quote.dat"), tdx_tests._read("ccel/ccel_data.dat")
    log = log.rstrip(b"\xff")  # the CCEL area without its padding: what a node sends
    document = {
        "version": 1,
        "variant": "tdx",
        "user_data": _b64(USER_DATA),
        "quote": _b64(quote),
        "event_log": _b64(log),
    }
    verifier = Verifier(_policy("tdx", {"event_log": "required"}), now=_at(tdx_tests.GCE_TIME))
    result = verifier.verify(json.dumps(document), NONCE, report_data=tdx_tests._read("ccel/nonce.dat"))
    assert result.variant == "tdx" and set(result.measurements) >= {"MRTD", "RTMR0", "RTMR3"}
    with pytest.raises(VerificationError) as refused:
        verifier.verify(json.dumps(document), NONCE)
    assert refused.value.reason == "tdx-report-data"
    flipped, event = tdx_tests._flip_event_digest(log, 5)
    with pytest.raises(VerificationError) as refused:
        verifier.verify(
            json.dumps(dict(document, event_log=_b64(flipped))), NONCE, report_data=tdx_tests._read("ccel/nonce.dat")
        )
    assert refused.value.reason == "tdx-rtmr-replay"
    without_log = {key: value for key, value in document.items() if key != "event_log"}
    with pytest.raises(VerificationError) as refused:
        verifier.verify(without_log, NONCE, report_data=tdx_tests._read("ccel/nonce.dat"))
    assert refused.value.reason == "tdx-rtmr-replay"


def test_a_lab_tdx_quote_binds_the_nonce_and_user_data():
    chain = tdx_tests.LabChain()
    quote = tdx_tests.lab_quote(chain, report_data=report_data(NONCE, USER_DATA))
    root = chain.root.public_bytes(tdx_tests.serialization.Encoding.PEM).decode()
    verifier = Verifier(_policy("tdx", {"root_ca": root}), now=_at(tdx_tests.LAB_TIME))
    document = {"version": 1, "variant": "tdx", "user_data": _b64(USER_DATA), "quote": _b64(quote)}
    assert verifier.verify(document, NONCE).to_result()["verified"] is True
    with pytest.raises(VerificationError) as refused:
        verifier.verify(document, bytes(32))
    assert refused.value.reason == "tdx-report-data"
    # Intel's root (the default) refuses the lab's chain.
    with pytest.raises(VerificationError) as refused:
        Verifier(_policy("tdx", {"event_log": "optional"}), now=_at(tdx_tests.LAB_TIME)).verify(document, NONCE)
    assert refused.value.reason.startswith("tdx-")


def test_an_unknown_variant_is_refused_naming_it():
    document = {"version": 1, "variant": "sgx", "user_data": _b64(USER_DATA), "quote": _b64(b"quote")}
    message = "evidence variant 'sgx' is not supported (known: tpm, sev-snp, tdx)"
    with pytest.raises(EvidenceError, match=re.escape(message)):
        parse_evidence(document)
    with pytest.raises(VerificationError) as refused:
        Verifier(_policy("tdx", {"event_log": "optional"})).verify(document, NONCE)
    assert refused.value.reason == "malformed" and str(refused.value) == message


def test_a_body_field_of_another_variant_is_refused_by_name():
    document = {"version": 1, "variant": "tdx", "user_data": _b64(USER_DATA), "quote": _b64(b"q"), "report": _b64(b"r")}
    with pytest.raises(EvidenceError, match=r"unknown field\(s\): report"):
        parse_evidence(document)
    with pytest.raises(EvidenceError, match=r"lacks field\(s\): certificate$"):
        parse_evidence(dict(document, variant="sev-snp"))


def test_a_policy_without_the_variants_section_refuses_its_evidence_and_tpm_has_no_raw_mode():
    tpm_only = parse_policy(json.dumps({"version": 1, "pcrs": {"15": {"allowed": ["00" * 32]}}}))
    document = {"version": 1, "variant": "tdx", "user_data": _b64(USER_DATA), "quote": _b64(b"q")}
    with pytest.raises(VerificationError) as refused:
        Verifier(tpm_only).verify(document, NONCE)
    assert refused.value.reason == "policy" and "no 'tdx' section" in str(refused.value)
    # A section that does not read is refused when the policy is read, naming the section and the field.
    with pytest.raises(PolicyError, match="policy 'tdx' section: .*mrtd"):
        _policy("tdx", {"mrtd": "zz"})
    with pytest.raises(PolicyError, match="policy 'sev-snp' section: .*chain"):
        _policy("sev-snp", {"product": "Milan", "measurements": ["00" * 48]})
    # A policy made in code is checked when its variant's checks are made.
    made = replace(tpm_only, variant_sections={"tdx": {"mrtd": "zz"}})
    with pytest.raises(VerificationError) as refused:
        Verifier(made).verify(document, NONCE)
    assert refused.value.reason == "tdx-policy-invalid"


def test_the_variant_sections_survive_a_round_trip_of_the_policy():
    policy = parse_policy(
        json.dumps({"version": 1, "pcrs": {"15": {"allowed": ["00" * 32]}}, "tdx": {"event_log": "required"}})
    )
    assert parse_policy(dump_policy(policy)).variant_sections == {"tdx": {"event_log": "required"}}
    assert tdx.TdxPolicy.from_dict(policy.variant_sections["tdx"]).event_log == "required"


def _run_verify_evidence(args: dict) -> dict:
    from types import SimpleNamespace

    from ansible.parsing.dataloader import DataLoader

    from ansible_collections.confidential.kubernetes.plugins.action.verify_evidence import ActionModule

    task = SimpleNamespace(
        args=args,
        async_val=0,
        check_mode=False,
        diff=False,
        action="confidential.kubernetes.verify_evidence",
        no_log=False,
    )
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir=None), has_native_async=False)
    return ActionModule(task, connection, None, DataLoader(), None, None).run(task_vars={})


def test_the_verify_evidence_action_accepts_an_snp_document_bound_to_its_nonce(lab_snp):
    report = lab_snp.sign(snp_tests._lab_report(snp_tests._read("attestation.bin")))
    pem = b"".join(c.public_bytes(snp_tests._PEM) for c in (lab_snp.chain.ask, lab_snp.chain.ark)).decode()
    policy = {
        "version": 1,
        "sev-snp": {"chain": pem, "product": "Milan", "measurements": [snp_tests.LAB_MEASUREMENT.hex()]},
    }
    args = {
        "evidence": _snp_document(report, lab_snp.certificate()),
        "nonce": NONCE.hex(),
        "policy_content": policy,
    }
    result = _run_verify_evidence(args)
    assert result.get("failed") is not True, result
    assert result["verified"] is True and result["variant"] == "sev-snp"
    assert result["identity"] == snp_tests.LAB_CHIP_ID.hex()
    assert result["measurements"]["measurement"] == snp_tests.LAB_MEASUREMENT.hex()
    refused = _run_verify_evidence(dict(args, nonce="00" * 32))
    assert refused["failed"] is True and refused["reason"] == "snp-report-data"


@pytest.mark.parametrize("section", ["sgx", "tpm"])
def test_a_policy_section_of_no_variant_that_reads_one_is_refused(section):
    with pytest.raises(PolicyError, match=f"policy has unknown key\\(s\\): {section}"):
        parse_policy(json.dumps({"version": 1, section: {"event_log": "required"}}))


def _snp_action_run(module: str, args: dict) -> dict:
    from types import SimpleNamespace

    from ansible.parsing.dataloader import DataLoader

    action = __import__(f"ansible_collections.confidential.kubernetes.plugins.action.{module}", fromlist=["x"])
    task = SimpleNamespace(
        args=args, async_val=0, check_mode=False, diff=False, action=f"confidential.kubernetes.{module}", no_log=False
    )
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir=None), has_native_async=False)
    return action.ActionModule(task, connection, None, DataLoader(), None, None).run(task_vars={})


def test_cvm_evidence_gets_no_join_ticket_and_no_hand_over_yet_and_one_failing_its_section_is_named(lab_snp, tmp_path):
    from ansible_collections.confidential.kubernetes.plugins.module_utils._join.crypto import (
        CheckRequest,
        JoinCrypto,
        Refusal,
    )

    report = lab_snp.sign(snp_tests._lab_report(snp_tests._read("attestation.bin")))
    pem = b"".join(c.public_bytes(snp_tests._PEM) for c in (lab_snp.chain.ask, lab_snp.chain.ark)).decode()
    section = {"chain": pem, "product": "Milan", "measurements": [snp_tests.LAB_MEASUREMENT.hex()]}
    document = _snp_document(report, lab_snp.certificate())
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(json.dumps({"version": 1, "sev-snp": section}))
    policy = parse_policy(policy_file.read_text())
    assert Verifier(policy).verify(document, NONCE).variant == "sev-snp"  # it does verify
    request = CheckRequest(policy, "join", document.encode(), NONCE, "", False, "", b"")
    with pytest.raises(Refusal) as refused:
        JoinCrypto(None, [], bytes(32), "test").check(request)
    assert refused.value.reason == "variant" and "TPM evidence only" in str(refused.value)
    # A report that fails its section is refused naming the field: its mismatches name fields, not PCRs (the join
    # service's PCR 15 explanation read a "pcr" key of them and raised KeyError, a gRPC INTERNAL).
    strict = parse_policy(json.dumps({"version": 1, "sev-snp": {**section, "minimum_tcb": {"snp": 200}}}))
    for flow in ("join", "rejoin"):
        with pytest.raises(Refusal) as refused:
            JoinCrypto(None, [], bytes(32), "test").check(
                CheckRequest(strict, flow, document.encode(), NONCE, "", False, "", b"")
            )
        assert refused.value.reason == "snp-tcb" and "reported_tcb.snp" in str(refused.value), flow
    from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import controller

    # The hand-over takes a nonce its ledger issued: a report bound to it.
    ledger = str(tmp_path / "ledger")
    nonce = controller.nonce_store(ledger).issue()
    bound = snp_tests._patched(
        snp_tests._lab_report(snp_tests._read("attestation.bin")), 0x50, report_data(nonce, USER_DATA)
    )
    secrets_file = tmp_path / "secrets.yml"
    args = {
        "evidence": _snp_document(lab_snp.sign(bound), lab_snp.certificate()),
        "nonce": nonce.hex(),
        "policy": str(policy_file),
        "secrets_file": str(secrets_file),
        "nonce_ledger": ledger,
    }
    result = _snp_action_run("seal_init_secrets", args)
    assert result["failed"] is True and result["reason"] == "variant", result
    assert not secrets_file.exists()  # no cluster secret was made for it


@pytest.mark.parametrize("variant", ["sev-snp", "tdx"])
def test_the_collection_does_not_make_cvm_evidence_and_says_so(variant):
    from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.issuer import issue_evidence

    with pytest.raises(EvidenceError, match="this collection only verifies it"):
        issue_evidence(b"the device", NONCE, USER_DATA, variant=variant)
