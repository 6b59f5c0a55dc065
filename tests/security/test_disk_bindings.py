"""Issue 25 item 4, against the real service (gRPC over TLS, real swtpms): the disk bindings in the cluster's API
outrank the enrolment. A host enrolled with another node's bound disk gets no key for it and the owner still rejoins;
unenrolling the owner frees nothing; one TPM starting first joins with two disks at two services binds one disk."""

from __future__ import annotations

import grpc
import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.seal import EphemeralKey
from ansible_collections.confidential.kubernetes.plugins.module_utils._join import joinservice_pb2 as pb2
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.client import JoinError, request_ticket

from join_harness import (
    DISK_UUID,
    OTHER_DISK_UUID,
    activate,
    assert_refused,
    join_request,
    join_with_client,
    told_only_the_log,
)


def _refused(join_lab, service, tcti, name, disk, flow="join"):
    with pytest.raises(JoinError) as err:
        if flow == "join":
            join_with_client(join_lab, service, node_name=name, tcti=tcti, disk_uuid=disk, attempts=1)
        else:
            request_ticket([service.endpoint], join_lab.ca_pem, tcti, name, disk_uuid=disk, flow="rejoin", attempts=1)
    assert (err.value.code, err.value.reason) == ("PERMISSION_DENIED", "disk-not-granted"), str(err.value)
    return str(err.value)


@pytest.mark.parametrize("flow", ["join", "rejoin"])
def test_new_host_enrolled_with_a_bound_disk(join_lab, other_swtpm, attack, flow):
    """worker-1 joined with its disk; a new host is enrolled (by hand, past the controller's check) with that disk."""
    join_lab.enrol(join_lab.swtpm.tcti, "worker-1")
    service = join_lab.start("pcrs-only")
    join_with_client(join_lab, service)
    minted = len(service.minter.tokens)
    join_lab.enrol(other_swtpm.tcti, "worker-9", disk_uuid=DISK_UUID)
    # The holder is named in the service's log, never to a caller that has proven no TPM (issue 36).
    assert told_only_the_log(
        join_lab, _refused(join_lab, service, other_swtpm.tcti, "worker-9", DISK_UUID, flow), "(worker-1)"
    )
    attack.obtained("disk keys issued to the newcomer", len(service.minter.tokens) - minted)
    # The owner still rejoins with its disk.
    ticket = request_ticket(
        [service.endpoint],
        join_lab.ca_pem,
        join_lab.swtpm.tcti,
        "worker-1",
        disk_uuid=DISK_UUID,
        flow="rejoin",
        attempts=1,
    )
    assert ticket.state_disk_key


def test_unenrolled_nodes_disk_stays_bound(join_lab, other_swtpm, attack):
    """worker-1 joined, then was unenrolled (not removed by remove_node.yml): its disk is nobody else's first disk.
    Enrolment IDs as the controller gives nodes enrolled without a disk."""
    join_lab.enrol(join_lab.swtpm.tcti, "worker-1", enrolment_id="01")
    join_lab.enrol(other_swtpm.tcti, "worker-2", enrolment_id="02")
    service = join_lab.start("pcrs-only")
    join_with_client(join_lab, service)
    minted = len(service.minter.tokens)
    join_lab.enrolments = {ek: e for ek, e in join_lab.enrolments.items() if e.node_name != "worker-1"}
    join_lab.write_enrolment()
    assert told_only_the_log(
        join_lab, _refused(join_lab, service, other_swtpm.tcti, "worker-2", DISK_UUID), "(worker-1)"
    )
    attack.obtained("disk keys issued for the unenrolled node's disk", len(service.minter.tokens) - minted)
    attack.obtained(
        "disk bindings taken over", sum(1 for b in service.issuer.registry.mirror.all() if b.node_name == "worker-2")
    )


def test_one_tpm_starting_first_joins_with_two_disks_at_two_services(join_lab, attack):
    """Both step 1s pass (nothing is bound yet); the activations race for the TPM's first disk in the shared API."""
    join_lab.enrol(join_lab.swtpm.tcti, "worker-1")
    first = join_lab.start("pcrs-only")
    second = join_lab.start(None, bindings_file=str(join_lab.dir / "disk-bindings-2.json"))
    # The race: the second service's watch has not delivered the first's binding yet when its activation comes.
    join_lab.api.withheld.add("configmaps")
    tcti = join_lab.swtpm.tcti
    started = []
    for service, disk in ((first, DISK_UUID), (second, OTHER_DISK_UUID)):
        stub, channel = join_lab.stub(service)
        nonce = stub.GetNonce(pb2.GetNonceRequest()).nonce
        started.append(
            (
                stub,
                channel,
                nonce,
                stub.IssueJoinTicket(join_request(tcti, nonce, EphemeralKey.generate().public_bytes(), disk_uuid=disk)),
            )
        )
    (stub, channel, nonce, challenge), (stub2, channel2, nonce2, challenge2) = started
    with channel, channel2:
        assert activate(stub, tcti, challenge, nonce).sealed_ticket
        error = assert_refused(
            lambda: activate(stub2, tcti, challenge2, nonce2), grpc.StatusCode.PERMISSION_DENIED, "disk-not-granted"
        )
    assert f"already claimed disk {DISK_UUID}" in error.details()
    # The binding objects (the activation also wrote the node's attestation record beside them).
    disks = {
        name: item["data"]["disk_uuid"]
        for name, item in join_lab.api.configmaps.items()
        if not name.startswith("confidential-kubernetes-attest-")
    }
    assert disks == {
        f"confidential-kubernetes-disk-{DISK_UUID}": DISK_UUID,
        f"confidential-kubernetes-ek-{first.issuer.registry.mirror.all()[0].ek}": DISK_UUID,
    }, disks
    attack.obtained("disks bound to one TPM beyond its first", len(set(disks.values())) - 1)
    attack.obtained("tickets issued for a second disk", len(join_lab.api.tokens) - 1)
