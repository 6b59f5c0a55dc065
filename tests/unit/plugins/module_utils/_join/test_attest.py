"""Continuous attestation over real gRPC and TLS with real swtpms: the Attest RPC, its judgement, the record it keeps
and the quarantine the join service honours (the Kubernetes side against the real API server: test_attest_api.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import subprocess
import time

import grpc
import pytest
from join_harness import DISK_UUID, FakeApi, assert_refused, join_with_client, make_csr, wait_for
from tpm2_pytss.constants import TPM2_SU

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import issuer
from ansible_collections.confidential.kubernetes.plugins.module_utils._join import attest_handler
from ansible_collections.confidential.kubernetes.plugins.module_utils._join import joinservice_pb2 as pb2
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.attest import (
    ATTEST_USER_DATA_PREFIX,
    AttestationRecord,
    ClockInfo,
    attest_user_data,
    judge_clock,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.attest_client import (
    attest_once,
    attestation_evidence,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.attest_state import (
    ApiAttestationRecords,
    NodeActions,
    QuarantineMirror,
    record_name,
    record_of,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.config import ConfigError
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.enforcement import (
    Enforcer,
    LeaseElection,
    release,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.log import StructuredLog
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.client import JoinError, request_ticket
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.nonces import MacNonces
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.request import ek_identity

INTERVAL = 0.2
QUIET = dict(attestation_interval=INTERVAL, attestation_grace=3600.0, worker_processes=0)


def _ek(tcti: str) -> str:
    with issuer.Tpm(tcti) as tpm:
        _certificate, handle, ek_public = tpm.endorsement_key()
        tpm.flush(handle)
    return ek_identity(ek_public)


def _lock(tcti: str, service) -> None:
    """What the node lock does after the join: mark PCR 15 with the cluster ID."""
    with issuer.Tpm(tcti) as tpm:
        tpm.pcr_event(15, service.issuer.cluster_id)


def _joined(join_lab, service, tcti=None, node_name="worker-1"):
    tcti = tcti or join_lab.swtpm.tcti
    join_with_client(join_lab, service, node_name=node_name, tcti=tcti)
    _lock(tcti, service)
    time.sleep(INTERVAL)


def _record(join_lab, ek: str):
    configmap = join_lab.api.configmaps.get(record_name(ek))
    return record_of(configmap) if configmap is not None else None


def _attest(join_lab, service, tcti=None):
    return attest_once(service.endpoint, join_lab.ca_pem, tcti or join_lab.swtpm.tcti)


def _refused_attest(join_lab, service, reason: str, tcti=None) -> JoinError:
    with pytest.raises(JoinError) as err:
        _attest(join_lab, service, tcti)
    assert err.value.reason == reason, err.value
    return err.value


def _power_cycle(swtpm) -> None:
    """The TPM's power cycle (resetCount + 1, PCRs reset), as a reboot leaves it."""
    subprocess.run(["swtpm_ioctl", "-i", "--unix", f"{swtpm.socket}.ctrl"], check=True)
    with issuer.Tpm(swtpm.tcti) as tpm:
        tpm.esapi.startup(TPM2_SU.CLEAR)


def _rejoin(join_lab, service, tcti=None):
    return request_ticket(
        [service.endpoint],
        join_lab.ca_pem,
        tcti or join_lab.swtpm.tcti,
        "worker-1",
        disk_uuid=DISK_UUID,
        kubelet_csr_pem=make_csr("worker-1"),
        flow="rejoin",
        attempts=1,
    )


def test_the_join_records_the_proven_ak_and_a_member_passes(join_lab):
    service = join_lab.start(**QUIET)
    _joined(join_lab, service)
    ek = _ek(join_lab.swtpm.tcti)
    enrolled = _record(join_lab, ek)
    assert enrolled.result == "enrolled" and enrolled.node_name == "worker-1" and len(enrolled.ak_name) == 68

    assert _attest(join_lab, service) == int(INTERVAL)
    passed = _record(join_lab, ek)
    assert passed.result == "passed" and passed.passed_at > enrolled.passed_at
    assert passed.clock.reset_count == enrolled.clock.reset_count and passed.clock.clock >= enrolled.clock.clock
    assert any(e["event"] == "attest" and e["result"] == "passed" for e in join_lab.logs())


def test_worker_processes_judge_as_the_event_loop_does(join_lab):
    """The verification runs in a worker process by default: the same verdicts come back from there."""
    service = join_lab.start(attestation_interval=INTERVAL, attestation_grace=3600.0, worker_processes=1)
    _joined(join_lab, service)
    ek = _ek(join_lab.swtpm.tcti)
    _attest(join_lab, service)
    assert _record(join_lab, ek).result == "passed"
    time.sleep(INTERVAL)
    with issuer.Tpm(join_lab.swtpm.tcti) as tpm:
        tpm.pcr_event(8, b"a changed boot component")
    _refused_attest(join_lab, service, "pcr-policy")
    assert [m["pcr"] for m in _record(join_lab, ek).mismatches] == [8]


def test_a_member_whose_pcr8_was_extended_fails_is_quarantined_and_gets_no_rejoin(join_lab):
    service = join_lab.start(**QUIET)
    _joined(join_lab, service)
    ek = _ek(join_lab.swtpm.tcti)
    _attest(join_lab, service)
    time.sleep(INTERVAL)
    with issuer.Tpm(join_lab.swtpm.tcti) as tpm:
        tpm.pcr_event(8, b"a changed boot component")

    refused = _refused_attest(join_lab, service, "pcr-policy")
    assert "PCR(s) 8" in str(refused)
    failed = _record(join_lab, ek)
    assert failed.result == "failed" and failed.reason == "pcr-policy"
    assert [m["pcr"] for m in failed.mismatches] == [8]
    # The acting service (it took the Lease) quarantines the EK within an interval.
    assert wait_for(lambda: _record(join_lab, ek).quarantined, 5), _record(join_lab, ek)
    assert "PCR 8" in _record(join_lab, ek).quarantine_reason
    assert join_lab.api.others["leases"]["confidential-attestation"]["spec"]["holderIdentity"]
    events = list(join_lab.api.others["events"].values())
    assert events and "PCR 8" in events[0]["message"] and events[0]["involvedObject"]["name"] == "worker-1"

    # Its rejoin fails the policy first; a quarantined node whose measurements pass is refused too (below).
    with pytest.raises(JoinError) as err:
        _rejoin(join_lab, service)
    assert err.value.reason in ("pcr-policy", "quarantined"), err.value


def test_silence_past_the_grace_quarantines(join_lab):
    service = join_lab.start(attestation_interval=INTERVAL, attestation_grace=1.0, worker_processes=0)
    _joined(join_lab, service)
    ek = _ek(join_lab.swtpm.tcti)
    assert not _record(join_lab, ek).quarantined
    assert wait_for(lambda: _record(join_lab, ek).quarantined, 6)
    silent = _record(join_lab, ek)
    assert silent.reason == "silent" and silent.result == "failed"
    # Attesting again passes, and the node stays quarantined until released.
    _attest(join_lab, service)
    assert _record(join_lab, ek).result == "passed" and _record(join_lab, ek).quarantined
    # Its measurements pass, and still no rejoin ticket (no disk key) until released.
    with pytest.raises(JoinError) as err:
        _rejoin(join_lab, service)
    assert err.value.reason == "quarantined", err.value
    assert "quarantined since" in str(err.value)


def test_a_quarantine_holds_through_a_restart_while_the_api_is_away(join_lab):
    """A service that starts while the API is away (a power cut: every control plane boots again) has not listed the
    records yet: it refuses the quarantined EK from its mirror, and forgets it only when the API released it."""
    service = join_lab.start(attestation_interval=INTERVAL, attestation_grace=1.0, worker_processes=0)
    _joined(join_lab, service)
    ek = _ek(join_lab.swtpm.tcti)
    assert wait_for(lambda: _record(join_lab, ek).quarantined, 6)
    _attest(join_lab, service)
    mirror = join_lab.dir / "attestation-quarantine.json"
    assert wait_for(lambda: mirror.exists() and ek in mirror.read_text(), 5)
    assert mirror.stat().st_mode & 0o777 == 0o600
    service.stop_now()

    join_lab.api.fail_bindings = True
    restarted = join_lab.start(None, **QUIET)
    with pytest.raises(JoinError) as err:
        _rejoin(join_lab, restarted)
    assert err.value.reason == "quarantined", err.value

    # The API answers again, still quarantining the node; then an operator releases it after its fresh pass.
    join_lab.api.fail_bindings = False
    assert [r["ek"] for r in json.loads(mirror.read_text())["records"]] == [ek]
    released = asyncio.run(release(ApiAttestationRecords(join_lab.api), NodeActions(join_lab.api), ek))
    assert not released.quarantined
    assert wait_for(lambda: json.loads(mirror.read_text())["records"] == [], 5)
    _rejoin(join_lab, restarted)


@pytest.mark.parametrize(
    "content, complaint",
    [
        ("{", "is not JSON"),
        ('{"version": 2, "records": []}', "is not version 1"),
        ('{"version": 1}', "has no list of records"),
        ('{"version": 1, "records": [{"ek": "aa"}]}', "record 0"),
    ],
)
def test_an_unreadable_quarantine_mirror_is_refused_by_name(tmp_path, content, complaint):
    path = tmp_path / "attestation-quarantine.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=complaint) as err:
        QuarantineMirror(str(path))
    assert str(path) in str(err.value)


def test_the_quarantine_mirror_keeps_only_quarantined_records(tmp_path):
    path = tmp_path / "attestation-quarantine.json"
    mirror = QuarantineMirror(str(path))
    kept = AttestationRecord("aa" * 32, "worker-1", "000b" + "11" * 32, ClockInfo(5, 1, 0, True))
    quarantined = dataclasses.replace(kept, ek="bb" * 32, quarantined_at="2026-12-02T18:00:00.000000Z")
    assert mirror.replace([kept, quarantined]) and not mirror.replace([quarantined])
    again = QuarantineMirror(str(path))
    assert again.get("bb" * 32) == quarantined and again.get("aa" * 32) is None
    # A record in the mirror that is not quarantined is not this service's writing: refused.
    document = json.loads(path.read_text())
    document["records"].append(kept.to_document())
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match="record 1 is not quarantined"):
        QuarantineMirror(str(path))


def test_evidence_for_another_nodes_ek_is_refused_and_changes_nobody(join_lab, other_swtpm):
    join_lab.enrol(join_lab.swtpm.tcti, "worker-1")
    join_lab.enrol(other_swtpm.tcti, "worker-2")
    service = join_lab.start(**QUIET)
    _joined(join_lab, service)
    _joined(join_lab, service, other_swtpm.tcti, "worker-2")
    victim = _ek(join_lab.swtpm.tcti)
    before = _record(join_lab, victim)
    stub, channel = join_lab.stub(service)
    with issuer.Tpm(join_lab.swtpm.tcti) as tpm:
        victim_ek = tpm.endorsement_key()[2]
    # The other TPM quotes (with its own AK) bad PCRs in the victim's name: the AK is not the victim's.
    with issuer.Tpm(other_swtpm.tcti) as tpm:
        tpm.pcr_event(8, b"tampered")
    nonce = stub.GetNonce(pb2.GetNonceRequest()).nonce
    with issuer.Tpm(other_swtpm.tcti) as tpm:
        evidence = issuer.issue_evidence(tpm, nonce, attest_user_data(victim))
    forged = evidence._replace(ek_public=victim_ek, ek_certificate=None).to_json().encode()
    assert_refused(
        lambda: stub.Attest(pb2.AttestRequest(evidence=forged, nonce=nonce)),
        grpc.StatusCode.PERMISSION_DENIED,
        "ak-unknown",
    )
    # Its own EK with a quote naming the victim is not bound either.
    nonce = stub.GetNonce(pb2.GetNonceRequest()).nonce
    with issuer.Tpm(other_swtpm.tcti) as tpm:
        evidence = issuer.issue_evidence(tpm, nonce, attest_user_data(victim)).to_json().encode()
    assert_refused(
        lambda: stub.Attest(pb2.AttestRequest(evidence=evidence, nonce=nonce)),
        grpc.StatusCode.PERMISSION_DENIED,
        "request-binding",
    )
    channel.close()
    time.sleep(3 * INTERVAL)
    assert _record(join_lab, victim) == before
    assert not any(r.quarantined for r in map(record_of, join_lab.api.configmaps.values()) if r is not None)


def test_a_replayed_quote_and_an_old_nonce_are_refused(join_lab):
    nonces = MacNonces(ttl=1.0)
    service = join_lab.start(nonces=nonces, **QUIET)
    _joined(join_lab, service)
    ek = _ek(join_lab.swtpm.tcti)
    stub, channel = join_lab.stub(service)
    nonce = stub.GetNonce(pb2.GetNonceRequest()).nonce
    request = pb2.AttestRequest(evidence=attestation_evidence(join_lab.swtpm.tcti, nonce), nonce=nonce)
    assert stub.Attest(request).result == "passed"
    passed = _record(join_lab, ek)
    time.sleep(INTERVAL)
    assert_refused(lambda: stub.Attest(request), grpc.StatusCode.FAILED_PRECONDITION, "nonce-reused")

    old = stub.GetNonce(pb2.GetNonceRequest()).nonce
    late = pb2.AttestRequest(evidence=attestation_evidence(join_lab.swtpm.tcti, old), nonce=old)
    time.sleep(1.2)
    assert_refused(lambda: stub.Attest(late), grpc.StatusCode.FAILED_PRECONDITION, "nonce-stale")
    channel.close()
    assert _record(join_lab, ek) == passed


def test_evidence_not_bound_to_an_attestation_is_refused(join_lab):
    """A join's evidence (user_data an ephemeral key and a request digest) is no attestation."""
    service = join_lab.start(**QUIET)
    _joined(join_lab, service)
    stub, channel = join_lab.stub(service)
    nonce = stub.GetNonce(pb2.GetNonceRequest()).nonce
    with issuer.Tpm(join_lab.swtpm.tcti) as tpm:
        evidence = issuer.issue_evidence(tpm, nonce, ATTEST_USER_DATA_PREFIX + b"\0" * 32).to_json().encode()
    assert_refused(
        lambda: stub.Attest(pb2.AttestRequest(evidence=evidence, nonce=nonce)),
        grpc.StatusCode.PERMISSION_DENIED,
        "request-binding",
    )
    channel.close()


def test_a_clock_going_backwards_is_refused(join_lab):
    service = join_lab.start(**QUIET)
    _joined(join_lab, service)
    ek = _ek(join_lab.swtpm.tcti)
    _attest(join_lab, service)
    time.sleep(INTERVAL)
    # The last accepted quote as a rolled-back TPM state would leave it: a clock far ahead of the TPM's now.
    configmap = join_lab.api.configmaps[record_name(ek)]
    configmap["data"]["clock"] = str(10**12)
    ahead = record_of(configmap)
    _refused_attest(join_lab, service, "clock-backwards")
    assert _record(join_lab, ek) == ahead and not ahead.quarantined


def test_a_tpm_reset_without_a_rejoin_fails_and_a_rejoin_records_the_new_counters(join_lab):
    service = join_lab.start(**QUIET)
    _joined(join_lab, service)
    ek = _ek(join_lab.swtpm.tcti)
    _attest(join_lab, service)
    before = _record(join_lab, ek)
    # A power cycle of the TPM (resetCount + 1); the node marks PCR 15 again by itself, without a rejoin.
    _power_cycle(join_lab.swtpm)
    _lock(join_lab.swtpm.tcti, service)
    time.sleep(INTERVAL)
    _refused_attest(join_lab, service, "tpm-reset")
    failed = _record(join_lab, ek)
    assert failed.result == "failed" and failed.clock.reset_count == before.clock.reset_count + 1


def test_a_rebooted_member_that_rejoined_passes(join_lab):
    service = join_lab.start(**QUIET)
    _joined(join_lab, service)
    ek = _ek(join_lab.swtpm.tcti)
    _power_cycle(join_lab.swtpm)
    _rejoin(join_lab, service)
    _lock(join_lab.swtpm.tcti, service)
    time.sleep(INTERVAL)
    _attest(join_lab, service)
    assert _record(join_lab, ek).result == "passed"


def test_a_second_evidence_within_half_an_interval_is_refused(join_lab):
    service = join_lab.start(attestation_interval=30.0, attestation_grace=3600.0, worker_processes=0)
    join_with_client(join_lab, service)
    _lock(join_lab.swtpm.tcti, service)
    _refused_attest(join_lab, service, "attest-too-soon")


def test_an_unknown_tpm_is_refused(join_lab, other_swtpm):
    service = join_lab.start(**QUIET)
    _refused_attest(join_lab, service, "not-a-member", other_swtpm.tcti)
    assert not any(name.startswith("confidential-kubernetes-attest-") for name in join_lab.api.configmaps)


@pytest.mark.parametrize(
    ("name", "now", "expected"),
    [
        ("same boot, clock forward", ClockInfo(2000, 3, 0, True), None),
        ("same boot, clock unchanged", ClockInfo(1000, 3, 0, True), None),
        ("TPM reset", ClockInfo(5, 4, 0, False), "tpm-reset"),
        ("TPM restart", ClockInfo(2000, 3, 1, True), "tpm-reset"),
        ("reset counter lower", ClockInfo(2000, 2, 0, True), "tpm-reset"),
        ("clock backwards", ClockInfo(999, 3, 0, True), "clock-backwards"),
    ],
)
def test_judge_clock(name, now, expected):
    verdict = judge_clock(ClockInfo(1000, 3, 0, True), now)
    assert (verdict[0] if verdict else None) == expected, name


def test_a_record_reads_back_what_it_wrote_and_an_unreadable_one_counts_for_nothing():
    record = AttestationRecord(
        "ab" * 32, "worker-1", "000b" + "cd" * 32, ClockInfo(12, 1, 0, True), mismatches=[{"pcr": 8}], enforced=True
    )
    document = {"metadata": {"name": record_name(record.ek)}, "data": record.to_document()}
    assert record_of(document) == record
    for field, value in (("result", "maybe"), ("clock", "-1"), ("mismatches", "{"), ("ek", "")):
        broken = {"metadata": document["metadata"], "data": dict(document["data"], **{field: value})}
        assert record_of(broken) is None, field


def _enforcer(api, action: str):
    records = ApiAttestationRecords(api)
    election = LeaseElection(api, "cp-test", 10)
    return Enforcer(records, NodeActions(api), election, 1.0, 3.0, action, StructuredLog(io.StringIO()))


def _failed_record(ek: str, node_name: str, control_plane: bool) -> AttestationRecord:
    return AttestationRecord(
        ek,
        node_name,
        "000b" + "cd" * 32,
        ClockInfo(1, 1, 0, True),
        result="failed",
        reason="pcr-policy",
        mismatches=[{"pcr": 8, "actual": "00"}],
        control_plane=control_plane,
    )


def _store(api, record: AttestationRecord) -> None:
    asyncio.run(ApiAttestationRecords(api).update(record.ek, lambda current: record))


def test_the_last_control_plane_serving_is_reported_not_quarantined():
    api = FakeApi()
    _store(api, _failed_record("aa" * 32, "cp-0", True))
    assert asyncio.run(_enforcer(api, "quarantine").enforce_once()) == ["cp-0"]
    record = asyncio.run(ApiAttestationRecords(api).get("aa" * 32))[0]
    assert record.enforced and not record.quarantined
    assert "PCR 8" in next(iter(api.others["events"].values()))["message"]


def test_a_failing_control_plane_beside_another_is_quarantined_and_taint_quarantines_nobody():
    api = FakeApi()
    _store(api, _failed_record("aa" * 32, "cp-0", True))
    _store(api, dataclasses.replace(_failed_record("bb" * 32, "cp-1", True), result="passed", reason=""))
    _store(api, _failed_record("cc" * 32, "worker-0", False))
    assert sorted(asyncio.run(_enforcer(api, "quarantine").enforce_once())) == ["cp-0", "worker-0"]
    records = {r.node_name: r for r in asyncio.run(ApiAttestationRecords(api).list())}
    assert records["cp-0"].quarantined and records["worker-0"].quarantined and not records["cp-1"].quarantined
    # Acted on once: a second pass does nothing.
    assert asyncio.run(_enforcer(api, "quarantine").enforce_once()) == []

    tainting = FakeApi()
    _store(tainting, _failed_record("cc" * 32, "worker-0", False))
    assert asyncio.run(_enforcer(tainting, "taint").enforce_once()) == ["worker-0"]
    record = asyncio.run(ApiAttestationRecords(tainting).get("cc" * 32))[0]
    assert record.enforced and not record.quarantined


def test_a_rejoin_while_the_api_is_away_records_its_counters_once_it_is_back(join_lab, monkeypatch):
    monkeypatch.setattr(attest_handler, "ENROL_RETRY_DELAY", 0.2)
    service = join_lab.start(**QUIET)
    _joined(join_lab, service)
    ek = _ek(join_lab.swtpm.tcti)
    before = _record(join_lab, ek)
    _power_cycle(join_lab.swtpm)
    join_lab.api.fail_bindings = True
    _rejoin(join_lab, service)
    assert _record(join_lab, ek) == before
    join_lab.api.fail_bindings = False
    assert wait_for(lambda: _record(join_lab, ek).clock.reset_count == before.clock.reset_count + 1, 5)
    _lock(join_lab.swtpm.tcti, service)
    time.sleep(INTERVAL)
    _attest(join_lab, service)
    assert _record(join_lab, ek).result == "passed"
