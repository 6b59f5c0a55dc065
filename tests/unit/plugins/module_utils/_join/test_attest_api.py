"""Continuous attestation's state in a real API server 1.20 (tests/control_plane.py): the Node condition, the taint,
the cordon and the Event of the acting service, the records every service shares, and the Lease another service takes
over when the first stops renewing. Real gRPC over TLS and real swtpms, as test_attest.py."""

from __future__ import annotations

import json
import time

import pytest
from join_harness import join_with_client, wait_for

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import issuer
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.attest_client import attest_once
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.attest_state import (
    CONDITION,
    TAINT_KEY,
    ApiAttestationRecords,
    AttestationStateError,
    NodeActions,
    record_name,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.client import JoinError
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.enforcement import LEASE_NAME, release
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.kubeapi import ClusterApi
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.request import ek_identity

INTERVAL = 0.5


@pytest.fixture
def real_api_lab(join_lab, kube_control_plane, nodes_deleted_after):
    """The join lab's services on the real API server, a Node ``worker-1`` registered, no record or Lease left over."""
    cluster = kube_control_plane
    cluster.kubectl(
        "delete", "configmaps", "-n", "kube-system", "-l", "confidential.kubernetes/attestation", check=False
    )
    cluster.kubectl("delete", "lease", "-n", "kube-system", LEASE_NAME, "--ignore-not-found", check=False)
    cluster.kubectl("delete", "events", "-n", "default", "--all", check=False)
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "worker-1"}}
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(node).encode())

    def start(**settings):
        api = ClusterApi.from_kubeconfig(str(cluster.admin_kubeconfig))
        merged = dict(attestation_interval=INTERVAL, attestation_grace=3600.0, worker_processes=0)
        merged.update(settings)
        return join_lab.start(api=api, **merged)

    join_lab.start_real = start
    join_lab.cluster = cluster
    yield join_lab


def _node(lab) -> dict:
    return json.loads(lab.cluster.kubectl("get", "node", "worker-1", "-o", "json").stdout)


def _condition(lab) -> dict | None:
    return next((c for c in _node(lab)["status"].get("conditions", []) if c["type"] == CONDITION), None)


def _record(lab, ek: str) -> dict:
    found = lab.cluster.kubectl("get", "configmap", "-n", "kube-system", record_name(ek), "-o", "json", check=False)
    return json.loads(found.stdout)["data"] if found.returncode == 0 else {}


def _ek(tcti: str) -> str:
    with issuer.Tpm(tcti) as tpm:
        _certificate, handle, ek_public = tpm.endorsement_key()
        tpm.flush(handle)
    return ek_identity(ek_public)


def _joined(lab, service) -> str:
    join_with_client(lab, service)
    with issuer.Tpm(lab.swtpm.tcti) as tpm:
        tpm.pcr_event(15, service.issuer.cluster_id)
    time.sleep(INTERVAL)
    return _ek(lab.swtpm.tcti)


def test_a_passing_node_gets_the_condition_and_a_tampered_one_is_tainted_cordoned_and_named(real_api_lab):
    lab = real_api_lab
    service = lab.start_real()
    ek = _joined(lab, service)
    attest_once(service.endpoint, lab.ca_pem, lab.swtpm.tcti)
    condition = _condition(lab)
    assert condition["status"] == "True" and condition["reason"] == "Attested" and condition["lastHeartbeatTime"]
    assert _record(lab, ek)["result"] == "passed"
    assert not _node(lab)["spec"].get("taints")

    time.sleep(INTERVAL)
    with issuer.Tpm(lab.swtpm.tcti) as tpm:
        tpm.pcr_event(8, b"a changed boot component")
    with pytest.raises(JoinError) as err:
        attest_once(service.endpoint, lab.ca_pem, lab.swtpm.tcti)
    assert err.value.reason == "pcr-policy"

    def enforced() -> bool:
        spec = _node(lab)["spec"]
        return bool(spec.get("unschedulable")) and any(t["key"] == TAINT_KEY for t in spec.get("taints", []))

    assert wait_for(enforced, 10), _node(lab)["spec"]
    taint = next(t for t in _node(lab)["spec"]["taints"] if t["key"] == TAINT_KEY)
    assert (taint["value"], taint["effect"]) == ("failed", "NoExecute")
    assert _condition(lab)["status"] == "False"
    events = json.loads(
        lab.cluster.kubectl(
            "get", "events", "-n", "default", "--field-selector", "involvedObject.name=worker-1", "-o", "json"
        ).stdout
    )["items"]
    assert any("PCR 8" in event["message"] and event["type"] == "Warning" for event in events), events
    record = _record(lab, ek)
    assert record["quarantined_at"] and record["result"] == "failed"
    assert json.loads(record["mismatches"])[0]["pcr"] == 8


def test_a_silent_node_is_quarantined_and_released_only_after_a_fresh_pass(real_api_lab):
    lab = real_api_lab
    service = lab.start_real(attestation_grace=1.5)
    ek = _joined(lab, service)
    assert wait_for(lambda: bool(_record(lab, ek).get("quarantined_at")), 10)
    assert any(t["key"] == TAINT_KEY for t in _node(lab)["spec"].get("taints", []))

    async def release_now():
        api = ClusterApi.from_kubeconfig(str(lab.cluster.admin_kubeconfig))
        try:
            return await release(ApiAttestationRecords(api), NodeActions(api), ek)
        finally:
            api.close()

    import asyncio  # pylint: disable=import-outside-toplevel

    with pytest.raises(AttestationStateError, match="has not passed an attestation since it was quarantined"):
        asyncio.run(release_now())
    attest_once(service.endpoint, lab.ca_pem, lab.swtpm.tcti)
    assert _record(lab, ek)["quarantined_at"], "a silent node is not trusted back by itself"
    asyncio.run(release_now())
    assert not _record(lab, ek)["quarantined_at"]
    spec = _node(lab)["spec"]
    assert not spec.get("unschedulable") and not any(t["key"] == TAINT_KEY for t in spec.get("taints", []))
    assert _condition(lab)["status"] == "True"


def test_a_second_service_takes_the_lease_when_the_first_stops_renewing(real_api_lab):
    lab = real_api_lab
    first = lab.start_real()

    def holder() -> str:
        found = lab.cluster.kubectl("get", "lease", "-n", "kube-system", LEASE_NAME, "-o", "json", check=False)
        return json.loads(found.stdout)["spec"]["holderIdentity"] if found.returncode == 0 else ""

    assert wait_for(lambda: holder() == first.enforcer.election.holder, 10)
    second = lab.start_real()
    time.sleep(4 * INTERVAL)
    assert holder() == first.enforcer.election.holder
    first.stop_now()
    # The Lease lasts two intervals; the second service looks every interval.
    assert wait_for(lambda: holder() == second.enforcer.election.holder, 10)
