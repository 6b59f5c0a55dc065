"""The join service end to end: in-process gRPC over real TLS, real swtpm evidence, the real client."""

from __future__ import annotations

import base64
import datetime
import json
import os
import signal
import threading
import time

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

import hashlib

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import issuer
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import node_lock_mark
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto import derive
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto import seal
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.seal import EphemeralKey
from ansible_collections.confidential.kubernetes.plugins.module_utils._join import joinservice_pb2 as pb2
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.client import (
    JoinError,
    open_ticket,
    prove_activation,
    request_ticket,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.kubeapi import ApiUnavailable
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.nonces import MacNonces
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.protocol import (
    CONTROL_PLANE_FILES,
    JoinTicket,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import ca_cert_hash
from ansible_collections.confidential.kubernetes.plugins.module_utils._ticket import cluster_id_of

from join_harness import (
    API_SERVER,
    DISK_UUID,
    K8S_VERSION,
    Clock,
    FakeApi,
    activate,
    assert_refused,
    evidence_for,
    join_request,
    join_with_client,
    make_csr,
    wait_for,
)


def test_valid_join_returns_a_ticket_the_client_opens(join_lab):
    service = join_lab.start("pcrs-only")
    payload = join_with_client(join_lab, service)
    secrets = join_lab.secrets
    assert isinstance(payload, JoinTicket)
    assert payload.state_disk_key == derive.state_disk_key(secrets["master_key"], secrets["master_salt"], DISK_UUID)
    measurement_secret = derive.measurement_secret(secrets["master_key"], secrets["master_salt"])
    assert payload.measurement_secret == measurement_secret
    assert payload.cluster_id == derive.cluster_id(measurement_secret, secrets["measurement_salt"])
    # The node side derives the same cluster ID from the ticket.
    assert cluster_id_of(payload) == payload.cluster_id
    assert payload.api_server_endpoint == API_SERVER
    assert payload.kubernetes_version == K8S_VERSION
    assert payload.ca_cert_hashes == (ca_cert_hash(join_lab.ca_pem),)
    assert payload.ca_crt == join_lab.ca_pem.decode()
    assert payload.control_plane_files == ()
    assert (payload.node_name, payload.control_plane) == ("worker-1", False)
    assert [t for n, t in service.minter.tokens] == [payload.bootstrap_token]


def test_kubelet_certificate_chains_to_the_cluster_ca_with_the_node_identity(join_lab):
    join_lab.enrol(join_lab.swtpm.tcti, "worker-7")
    service = join_lab.start("pcrs-only")
    node_key = ec.generate_private_key(ec.SECP384R1())
    payload = join_with_client(join_lab, service, "worker-7", csr=make_csr("worker-7", node_key))
    certificate = x509.load_pem_x509_certificate(payload.kubelet_client_crt.encode())
    certificate.verify_directly_issued_by(join_lab.pki["ca_cert"])
    assert certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:node:worker-7"
    assert certificate.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:nodes"
    assert len(list(certificate.subject)) == 2
    assert certificate.public_key().public_numbers() == node_key.public_key().public_numbers()
    assert certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value == x509.ExtendedKeyUsage(
        [ExtendedKeyUsageOID.CLIENT_AUTH]
    )
    usage = certificate.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.digital_signature and usage.key_encipherment and not usage.key_cert_sign
    assert not certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    lifetime = certificate.not_valid_after_utc - datetime.datetime.now(datetime.timezone.utc)
    assert datetime.timedelta(days=364) < lifetime <= datetime.timedelta(days=365)


def test_control_plane_join_carries_the_pki_files_with_modes(join_lab):
    join_lab.enrol(join_lab.swtpm.tcti, "cp-2", control_plane=True)
    service = join_lab.start("pcrs-only")
    payload = join_with_client(join_lab, service, "cp-2", control_plane=True)
    files = payload.control_plane_files
    assert sorted(f.path for f in files) == sorted(
        [
            "ca.crt",
            "ca.key",
            "sa.key",
            "sa.pub",
            "front-proxy-ca.crt",
            "front-proxy-ca.key",
            "etcd/ca.crt",
            "etcd/ca.key",
        ]
    )
    for entry in files:
        assert entry.content == (join_lab.pki_dir / entry.path).read_bytes()
        assert entry.mode == (0o600 if entry.path.endswith(".key") else 0o644)
    # The new control plane runs a join service of its own.
    assert {name: getattr(payload.cluster_secrets, name) for name in join_lab.secrets} == join_lab.secrets


def test_tickets_meet_the_node_side_contract(join_lab, other_swtpm):
    """What the join_ticket module's node side (module_utils._ticket.join) accepts."""
    join_lab.enrol(join_lab.swtpm.tcti, "worker-1")
    join_lab.enrol(other_swtpm.tcti, "cp-2", control_plane=True)
    service = join_lab.start("pcrs-only")
    worker = join_with_client(join_lab, service, "worker-1")
    control_plane = join_with_client(join_lab, service, "cp-2", control_plane=True, tcti=other_swtpm.tcti)
    assert worker.cluster_secrets is None and worker.control_plane_files == ()
    assert {f.path for f in control_plane.control_plane_files} == CONTROL_PLANE_FILES
    for payload in (worker, control_plane):
        # What the node reads is what the node side's type accepts.
        assert JoinTicket.from_bytes(payload.to_bytes()) == payload
        assert cluster_id_of(payload) == payload.cluster_id


@pytest.mark.parametrize("ak_trust", ["pcrs-only", "ek-certificate"])
def test_nothing_is_issued_before_the_credential_is_activated(join_lab, ak_trust):
    """Both trust levels: step 1 answers a credential for the EK and AK only; the token is registered after the proof."""
    service = join_lab.start(ak_trust)
    stub, channel = join_lab.stub(service)
    key = EphemeralKey.generate()
    with channel:
        nonce = stub.GetNonce(pb2.GetNonceRequest()).nonce
        challenge = stub.IssueJoinTicket(join_request(join_lab.swtpm.tcti, nonce, key.public_bytes()))
        assert challenge.credential_blob and challenge.credential_encrypted_seed
        # The grant is disclosed in the ticket only.
        assert (challenge.node_name, challenge.control_plane) == ("", False)
        assert service.minter.tokens == [] and service.issuer.pending() == 1 and service.issuer._nonces.used() == 0
        response = activate(stub, join_lab.swtpm.tcti, challenge, nonce)
    payload = open_ticket(key, response.sealed_ticket, "join", nonce, service.issuer.verifier_id)
    assert [t for n, t in service.minter.tokens] == [payload.bootstrap_token] and service.issuer.pending() == 0
    assert (payload.node_name, payload.control_plane) == ("worker-1", False) and service.issuer._nonces.used() == 1


def test_a_challenge_is_answered_once(join_lab):
    service = join_lab.start("pcrs-only")
    stub, channel = join_lab.stub(service)
    with channel:
        nonce = stub.GetNonce(pb2.GetNonceRequest()).nonce
        challenge = stub.IssueJoinTicket(
            join_request(join_lab.swtpm.tcti, nonce, EphemeralKey.generate().public_bytes())
        )
        proof = prove_activation(
            join_lab.swtpm.tcti, challenge.credential_blob, challenge.credential_encrypted_seed, nonce
        )
        stub.ActivateTicket(pb2.ActivateTicketRequest(nonce=nonce, activation_proof=proof))
        assert_refused(
            lambda: stub.ActivateTicket(pb2.ActivateTicketRequest(nonce=nonce, activation_proof=proof)),
            grpc.StatusCode.FAILED_PRECONDITION,
            "activation-unknown",
        )
    assert len(service.minter.tokens) == 1


def test_get_nonce_remembers_nothing_and_a_peer_over_its_rate_is_refused(join_lab):
    nonces = MacNonces(ttl=60)
    service = join_lab.start("pcrs-only", nonces=nonces, nonce_rate=1, nonce_burst=30)
    stub, channel = join_lab.stub(service)
    with channel:
        issued = {stub.GetNonce(pb2.GetNonceRequest()).nonce for _i in range(30)}
        assert len(issued) == 30 and nonces.used() == 0
        assert_refused(lambda: stub.GetNonce(pb2.GetNonceRequest()), grpc.StatusCode.RESOURCE_EXHAUSTED, "rate-limit")
    assert [e["reason"] for e in join_lab.logs() if e.get("result") == "refused"] == ["rate-limit"]


def test_malformed_evidence_is_an_invalid_argument(join_lab):
    service = join_lab.start("pcrs-only")
    stub, channel = join_lab.stub(service)
    with channel:
        nonce = stub.GetNonce(pb2.GetNonceRequest()).nonce
        request = join_request(join_lab.swtpm.tcti, nonce, b"", evidence=b"{not json")
        assert_refused(lambda: stub.IssueJoinTicket(request), grpc.StatusCode.INVALID_ARGUMENT, "malformed")
    assert service.minter.tokens == []


@pytest.mark.parametrize(
    "field, value, reason",
    [
        ("node_name", "Worker_1", "node-name"),
        ("disk_uuid", "not-a-uuid", "disk-uuid"),
        (
            "kubelet_csr",
            b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
            "csr-malformed",
        ),
    ],
    ids=["node name not DNS-1123", "disk UUID", "CSR garbage"],
)
def test_bad_request_fields_are_invalid_arguments(join_lab, field, value, reason):
    service = join_lab.start("pcrs-only")
    stub, channel = join_lab.stub(service)
    with channel:
        nonce = stub.GetNonce(pb2.GetNonceRequest()).nonce
        request = join_request(join_lab.swtpm.tcti, nonce, EphemeralKey.generate().public_bytes())
        setattr(request, field, value)
        assert_refused(lambda: stub.IssueJoinTicket(request), grpc.StatusCode.INVALID_ARGUMENT, reason)
    assert service.minter.tokens == []


def test_second_concurrent_control_plane_join_is_aborted(join_lab, other_swtpm):
    gate = threading.Event()
    join_lab.enrol(join_lab.swtpm.tcti, "cp-2", control_plane=True)
    join_lab.enrol(other_swtpm.tcti, "cp-3", control_plane=True)
    service = join_lab.start("pcrs-only", api=FakeApi(gate=gate, gated=("cp-2",)))
    first = {}
    worker = threading.Thread(
        target=lambda: first.update(payload=join_with_client(join_lab, service, "cp-2", control_plane=True))
    )
    worker.start()
    try:
        assert service.minter.entered.wait(10)
        with pytest.raises(JoinError) as err:
            join_with_client(join_lab, service, "cp-3", control_plane=True, tcti=other_swtpm.tcti, attempts=1)
        assert (err.value.code, err.value.reason) == ("ABORTED", "control-plane-busy")
        assert "another control-plane join is in progress" in str(err.value)
        # Workers are not serialised (a TPM enrolled as a control plane may ask for less).
        assert join_with_client(join_lab, service, "cp-3", tcti=other_swtpm.tcti).control_plane is False
    finally:
        gate.set()
        worker.join(30)
    assert first["payload"].control_plane_files
    # The slot is free again once the first response went out.
    assert join_with_client(join_lab, service, "cp-3", control_plane=True, tcti=other_swtpm.tcti).control_plane_files
    assert [node for node, token in service.minter.tokens] == ["cp-3", "cp-2", "cp-3"]


def test_aborted_control_plane_join_is_retried_by_the_client(join_lab, other_swtpm):
    gate = threading.Event()
    join_lab.enrol(join_lab.swtpm.tcti, "cp-2", control_plane=True)
    join_lab.enrol(other_swtpm.tcti, "cp-3", control_plane=True)
    service = join_lab.start("pcrs-only", api=FakeApi(gate=gate))
    worker = threading.Thread(target=lambda: join_with_client(join_lab, service, "cp-2", control_plane=True))
    worker.start()
    assert service.minter.entered.wait(10)
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        gate.set()
        time.sleep(0.2)

    payload = join_with_client(
        join_lab, service, "cp-3", control_plane=True, tcti=other_swtpm.tcti, attempts=5, backoff=0.05, sleep=sleep
    )
    worker.join(30)
    assert payload.control_plane_files and len(sleeps) >= 1


def test_health_reports_serving_and_what_is_loaded(join_lab):
    service = join_lab.start("pcrs-only")
    stub, channel = join_lab.stub(service)
    with channel:
        health = stub.Health(pb2.HealthRequest())
        assert health.status == "SERVING"
        assert health.policy_digest == hashlib.sha256(join_lab.policy_file.read_bytes()).hexdigest()
        assert health.enrolment_digest == hashlib.sha256(join_lab.enrolment_file.read_bytes()).hexdigest()
        assert (health.policy_error, health.enrolment_error) == ("", "")
        good = join_lab.policy_file.read_bytes()
        join_lab.policy_file.write_text(
            '{"version": 1, "hash_algorithm": "sha256", "pcrs": {"4": {"allowed": ["zz"]}}}'
        )
        rejected = stub.Health(pb2.HealthRequest())
        assert rejected.policy_digest == health.policy_digest
        assert rejected.policy_rejected_digest == hashlib.sha256(join_lab.policy_file.read_bytes()).hexdigest()
        assert "measurement policy" in rejected.policy_error and "PCR 4: 'zz' is not" in rejected.policy_error
        join_lab.policy_file.write_bytes(good + b"\n")
        recovered = stub.Health(pb2.HealthRequest())
        assert recovered.policy_digest == hashlib.sha256(good + b"\n").hexdigest() and recovered.policy_error == ""


def test_rejoin_gives_disk_key_and_measurement_secret_only(join_lab):
    join_lab.enrol(join_lab.swtpm.tcti, "worker-1", disk_uuid=DISK_UUID)
    service = join_lab.start("pcrs-only")
    payload = request_ticket(
        [service.endpoint], join_lab.ca_pem, join_lab.swtpm.tcti, "worker-1", disk_uuid=DISK_UUID.upper(), flow="rejoin"
    )
    assert sorted(json.loads(payload.to_bytes())) == [
        "cluster_id",
        "measurement_salt",
        "measurement_secret",
        "state_disk_key",
        "version",
    ]
    secrets = join_lab.secrets
    assert payload.state_disk_key == derive.state_disk_key(secrets["master_key"], secrets["master_salt"], DISK_UUID)
    assert service.minter.tokens == []
    # A member already re-marked for this cluster may rejoin too; a node of another cluster may not.
    with issuer.Tpm(join_lab.swtpm.tcti) as tpm:
        tpm.pcr_event(15, service.issuer.cluster_id)
        assert tpm.read_pcrs("sha256", (15,))[15] == node_lock_mark(service.issuer.cluster_id)
    assert request_ticket(
        [service.endpoint], join_lab.ca_pem, join_lab.swtpm.tcti, "worker-1", disk_uuid=DISK_UUID, flow="rejoin"
    )
    with pytest.raises(JoinError) as err:
        join_with_client(join_lab, service)
    assert err.value.reason == "pcr-policy" and "already a member of this cluster" in str(err.value)


def test_policy_file_replaced_by_garbage_keeps_the_old_policy_and_a_good_change_leaves_a_backup(join_lab):
    service = join_lab.start("pcrs-only", policy_check_interval=0)
    original = join_lab.policy_file.read_bytes()
    join_lab.policy_file.write_text("pcrs: [this is: not a policy")
    assert isinstance(join_with_client(join_lab, service, "worker-1"), JoinTicket)
    rejected = [e for e in join_lab.logs() if e["event"] == "policy-reload"]
    assert [(e["result"], e["reason"]) for e in rejected] == [("rejected", "malformed")]
    assert not os.path.exists(f"{join_lab.policy_file}.previous")
    # A good new policy that this node does not meet: it takes effect, and the old one is kept as the backup.
    with issuer.Tpm(join_lab.swtpm.tcti) as tpm:
        expected_pcr9 = tpm.read_pcrs("sha256", (9,))[9]
    join_lab.policy_file.write_text(original.decode().replace(expected_pcr9.hex(), "ab" * 32))
    with pytest.raises(JoinError) as err:
        join_with_client(join_lab, service, "worker-1")
    assert err.value.reason == "pcr-policy"
    assert open(f"{join_lab.policy_file}.previous", "rb").read() == original
    assert [e["result"] for e in join_lab.logs() if e["event"] == "policy-reload"] == ["rejected", "loaded"]


def test_client_gets_its_ticket_across_a_service_restart(join_lab):
    """The service dies while minting; a new one comes up on the same port; the client's retry gets the ticket."""
    gate = threading.Event()
    first = join_lab.start("pcrs-only", api=FakeApi(gate=gate))
    result, sleeps = {}, []

    def join():
        try:
            result["payload"] = join_with_client(
                join_lab,
                first,
                "worker-1",
                attempts=8,
                backoff=0.2,
                timeout=10,
                sleep=lambda seconds: (sleeps.append(seconds), time.sleep(seconds)),
            )
        except JoinError as exc:
            result["error"] = exc

    client = threading.Thread(target=join)
    client.start()
    assert first.minter.entered.wait(10)
    first.stop_now()
    second = join_lab.start(None, api=FakeApi(), port=first.port)
    gate.set()
    client.join(60)
    assert "error" not in result, result.get("error")
    assert sleeps, "the client never had to retry: the restart did not happen mid-join"
    # The token minted for the lost response was never delivered; the ticket carries the new service's token.
    assert len(first.minter.tokens) <= 1
    assert [t for n, t in second.minter.tokens] == [result["payload"].bootstrap_token]
    restarted = [e for e in join_lab.logs() if e["event"] == "start"]
    assert [e["port"] for e in restarted] == [first.port, first.port]


def test_graceful_shutdown_finishes_the_join_in_flight(join_lab, other_swtpm):
    service = join_lab.start("pcrs-only", api=FakeApi(delay=1.5), drain_delay=0.5)
    result = {}
    client = threading.Thread(
        target=lambda: result.update(payload=join_with_client(join_lab, service, "worker-1", attempts=1))
    )
    client.start()
    assert service.minter.entered.wait(10)
    stopper = threading.Thread(target=service.shutdown, args=(30,))
    stopper.start()
    assert service.draining.wait(5)
    stub, channel = join_lab.stub(service)
    with channel:
        assert stub.Health(pb2.HealthRequest()).status == "NOT_SERVING"
        with pytest.raises(grpc.RpcError) as err:
            stub.GetNonce(pb2.GetNonceRequest())
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    stopper.join(60)
    client.join(60)
    assert result["payload"].bootstrap_token == service.minter.tokens[0][1]
    assert [e["result"] for e in join_lab.logs() if e["event"] == "shutdown"] == ["draining", "stopped"]
    # A node arriving now finds nobody and says so.
    with pytest.raises(JoinError) as err:
        join_with_client(join_lab, service, "worker-2", tcti=other_swtpm.tcti, attempts=2, backoff=0.01)
    assert err.value.code == "UNAVAILABLE"


def test_no_secret_in_the_logs(join_lab, other_swtpm):
    join_lab.enrol(join_lab.swtpm.tcti, "worker-1")
    join_lab.enrol(other_swtpm.tcti, "cp-2", control_plane=True)
    service = join_lab.start("ek-certificate")
    payloads = [
        join_with_client(join_lab, service, "worker-1"),
        join_with_client(join_lab, service, "cp-2", control_plane=True, tcti=other_swtpm.tcti),
    ]
    with pytest.raises(JoinError):
        join_with_client(join_lab, service, "worker-3", csr=make_csr("worker-4"))
    text = join_lab.log_stream.getvalue()
    assert '"result": "issued"' in text and '"result": "refused"' in text
    forbidden = [value for name, value in join_lab.secrets.items()]
    for payload in payloads:
        forbidden += [
            payload.bootstrap_token,
            payload.bootstrap_token.split(".")[1],
            payload.state_disk_key,
            payload.measurement_secret,
        ]
        forbidden += [entry.content for entry in payload.control_plane_files if entry.path.endswith(".key")]
        secrets = payload.cluster_secrets
        forbidden += [secrets.master_key, secrets.master_salt, secrets.measurement_salt] if secrets else []
    for value in forbidden:
        raw = value.encode() if isinstance(value, str) else value
        for form in (raw, raw.hex().encode(), base64.b64encode(raw), raw[:16].hex().encode()):
            assert form.decode(errors="replace") not in text


def test_client_tries_the_next_endpoint_when_one_is_down(join_lab):
    service = join_lab.start("pcrs-only")
    sleeps = []
    payload = request_ticket(
        ["127.0.0.1:1", service.endpoint],
        join_lab.ca_pem,
        join_lab.swtpm.tcti,
        "worker-1",
        disk_uuid=DISK_UUID,
        kubelet_csr_pem=make_csr("worker-1"),
        sleep=sleeps.append,
    )
    assert isinstance(payload, JoinTicket) and sleeps == []


def test_client_s_give_up_gives_the_time_it_waited_not_the_time_it_was_allowed(join_lab):
    now = [1000.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    with pytest.raises(JoinError) as err:
        request_ticket(
            ["127.0.0.1:1"],
            join_lab.ca_pem,
            join_lab.swtpm.tcti,
            "worker-1",
            disk_uuid=DISK_UUID,
            kubelet_csr_pem=make_csr("worker-1"),
            attempts=3,
            backoff=2.0,
            sleep=sleep,
            clock=lambda: now[0],
        )
    # Two back-offs of 1-2 s and 2-4 s: the message says how long, and the budget it had.
    waited = now[0] - 1000.0
    assert 3.0 <= waited <= 6.0
    assert f"after 3 attempt(s) in {waited:.1f} s (of 300 s allowed) over 127.0.0.1:1" in str(err.value)


def test_client_gives_up_after_bounded_attempts_with_growing_backoff(join_lab):
    sleeps = []
    with pytest.raises(JoinError) as err:
        request_ticket(
            ["127.0.0.1:1"],
            join_lab.ca_pem,
            join_lab.swtpm.tcti,
            "worker-1",
            disk_uuid=DISK_UUID,
            kubelet_csr_pem=make_csr("worker-1"),
            attempts=4,
            backoff=1.0,
            sleep=sleeps.append,
        )
    assert err.value.code == "UNAVAILABLE" and "after 4 attempt(s)" in str(err.value)
    # The message names where it asked and what to check next.
    assert "over 127.0.0.1:1; last failure:" in str(err.value)
    assert "systemctl status confidential-joinservice" in str(err.value) and "join_attempts" in str(err.value)
    assert len(sleeps) == 3
    for attempt, seconds in enumerate(sleeps):
        assert 0.5 * 2**attempt <= seconds <= 2**attempt


def test_client_stops_at_the_total_time_budget(join_lab):
    now = [0.0]

    def sleep(seconds):
        now[0] += seconds

    with pytest.raises(JoinError):
        request_ticket(
            ["127.0.0.1:1"],
            join_lab.ca_pem,
            join_lab.swtpm.tcti,
            "worker-1",
            disk_uuid=DISK_UUID,
            kubelet_csr_pem=make_csr("worker-1"),
            attempts=100,
            backoff=10,
            total_timeout=25,
            sleep=sleep,
            clock=lambda: now[0],
        )
    assert now[0] <= 25


def test_client_does_not_retry_a_refusal(join_lab):
    service = join_lab.start("pcrs-only")
    sleeps = []
    with pytest.raises(JoinError) as err:
        join_with_client(join_lab, service, "worker-1", csr=make_csr("cp-1"), attempts=5, sleep=sleeps.append)
    assert (err.value.code, err.value.reason, sleeps) == ("PERMISSION_DENIED", "csr-subject", [])
    assert len([e for e in join_lab.logs() if e["event"] == "join"]) == 1


def test_client_gets_a_new_nonce_when_its_nonce_went_stale(join_lab):
    clock = Clock()

    class ExpiresOnce(MacNonces):
        expired = False

        def check(self, nonce):
            if not self.expired:
                self.expired = True
                clock.now += 61
            return super().check(nonce)

    service = join_lab.start("pcrs-only", nonces=ExpiresOnce(ttl=60, clock=clock))
    sleeps = []
    assert isinstance(join_with_client(join_lab, service, "worker-1", sleep=sleeps.append, backoff=0.01), JoinTicket)
    assert [e["reason"] for e in join_lab.logs() if e.get("result") == "refused"] == ["nonce-stale"]
    assert len(service.minter.tokens) == 1


def test_client_requires_the_cluster_ca(join_lab):
    with pytest.raises(JoinError) as err:
        request_ticket(["127.0.0.1:1"], None, join_lab.swtpm.tcti, "worker-1", disk_uuid=DISK_UUID, kubelet_csr_pem=b"")
    assert err.value.reason == "tls"


def test_client_refuses_a_service_whose_certificate_the_cluster_ca_did_not_issue(join_lab):
    from join_harness import make_ca

    service = join_lab.start("pcrs-only")
    other_ca = make_ca("someone-else")[0].public_bytes(serialization.Encoding.PEM)
    with pytest.raises(JoinError) as err:
        request_ticket(
            [service.endpoint],
            other_ca,
            join_lab.swtpm.tcti,
            "worker-1",
            disk_uuid=DISK_UUID,
            kubelet_csr_pem=make_csr("worker-1"),
            attempts=1,
        )
    assert err.value.code == "UNAVAILABLE"
    assert service.minter.tokens == []


def _daemon(join_lab, **overrides):
    import json
    import subprocess
    import sys
    from dataclasses import asdict

    settings = asdict(join_lab.config(0, **overrides))
    path = join_lab.dir / "joinservice.json"
    path.write_text(json.dumps(settings))
    collections = [p for p in sys.path if p.endswith("collections")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(collections))
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ansible_collections.confidential.kubernetes.plugins.module_utils._join.service",
            "--config",
            str(path),
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_daemon_serves_and_exits_0_on_sigterm(join_lab, kube_control_plane):
    import json
    import signal

    join_lab.write_policy("pcrs-only")
    join_lab.enrol(join_lab.swtpm.tcti, "worker-1")
    # The daemon's one API client talks to the real API server.
    process = _daemon(join_lab, admin_kubeconfig=str(kube_control_plane.admin_kubeconfig))
    try:
        started = json.loads(process.stderr.readline())
        assert (started["event"], started["result"]) == ("start", "serving"), started
        endpoint = f"127.0.0.1:{started['port']}"
        payload = request_ticket(
            [endpoint],
            join_lab.ca_pem,
            join_lab.swtpm.tcti,
            "worker-1",
            disk_uuid=DISK_UUID,
            kubelet_csr_pem=make_csr("worker-1"),
            attempts=1,
        )
        assert isinstance(payload, JoinTicket) and payload.bootstrap_token
    except JoinError:
        process.kill()
        raise
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0
    events = [json.loads(line) for line in process.stderr.read().splitlines()]
    assert [e["event"] for e in events][-3:] == ["signal", "shutdown", "shutdown"]


def test_daemon_refuses_to_start_with_secrets_readable_by_others(join_lab):
    import json

    join_lab.write_policy("pcrs-only")
    os.chmod(join_lab.secrets_file, 0o644)
    process = _daemon(join_lab)
    assert process.wait(30) == 2
    failure = json.loads(process.stderr.read().splitlines()[-1])
    assert failure["result"] == "failed" and "chmod 600" in failure["msg"]


@pytest.mark.parametrize(
    "key", [b"\x01" * 16, b"\xff" * (1184 + 32)], ids=["no suite of that length", "not an ML-KEM key"]
)
def test_evidence_bound_to_an_unusable_key_is_refused_before_any_token(join_lab, key):
    service = join_lab.start("pcrs-only")
    stub, channel = join_lab.stub(service)
    with channel:
        nonce = stub.GetNonce(pb2.GetNonceRequest()).nonce
        request = join_request(join_lab.swtpm.tcti, nonce, key)
        assert_refused(lambda: stub.IssueJoinTicket(request), grpc.StatusCode.INVALID_ARGUMENT, "ephemeral-key")
    assert service.minter.tokens == [] and service.issuer.pending() == 0


def test_user_data_without_a_request_digest_is_refused(join_lab):
    service = join_lab.start("pcrs-only")
    stub, channel = join_lab.stub(service)
    with channel:
        nonce = stub.GetNonce(pb2.GetNonceRequest()).nonce
        request = join_request(
            join_lab.swtpm.tcti, nonce, b"", evidence=evidence_for(join_lab.swtpm.tcti, nonce, b"\x01" * 32)
        )
        error = assert_refused(
            lambda: stub.IssueJoinTicket(request), grpc.StatusCode.PERMISSION_DENIED, "request-binding"
        )
    assert "request digest" in error.details() and service.minter.tokens == []


def test_token_registration_failure_is_retryable_and_leaves_nothing_usable(join_lab):
    class Failing(FakeApi):
        async def create(self, resource, body):
            if resource == "secrets":
                raise ApiUnavailable(f"the Kubernetes API at {self.host} did not answer creating secrets (refused)")
            return await super().create(resource, body)

    service = join_lab.start("pcrs-only", api=Failing())
    sleeps = []
    with pytest.raises(JoinError) as err:
        join_with_client(join_lab, service, attempts=2, backoff=0.01, sleep=sleeps.append)
    assert (err.value.code, err.value.reason, len(sleeps)) == ("UNAVAILABLE", "token-mint", 1)


def test_control_plane_slot_is_held_until_released(join_lab, other_swtpm):
    """The issuer without gRPC: the slot a control-plane join takes is free again only after release()."""
    from ansible_collections.confidential.kubernetes.plugins.module_utils._join.issuance import JoinRequest, Refusal

    join_lab.enrol(join_lab.swtpm.tcti, "cp-2", control_plane=True)
    join_lab.enrol(other_swtpm.tcti, "cp-3", control_plane=True)
    service = join_lab.start("pcrs-only")
    issuer_under_test = service.issuer

    def pending(tcti, node_name):
        nonce = issuer_under_test.issue_nonce()
        csr = make_csr(node_name)
        request = join_request(tcti, nonce, EphemeralKey.generate().public_bytes(), node_name, True, csr)
        challenge = issuer_under_test.begin_join(JoinRequest(request.evidence, nonce, node_name, True, csr, DISK_UUID))
        return issuer_under_test.take(
            nonce, prove_activation(tcti, challenge.credential_blob, challenge.credential_encrypted_seed, nonce)
        )

    first = issuer_under_test.prepare_join(pending(join_lab.swtpm.tcti, "cp-2"))
    with pytest.raises(Refusal) as err:
        issuer_under_test.prepare_join(pending(other_swtpm.tcti, "cp-3"))
    assert (err.value.code, err.value.reason) == ("ABORTED", "control-plane-busy")
    first.release()
    second = issuer_under_test.prepare_join(pending(other_swtpm.tcti, "cp-3"))
    first.release()  # a second release (e.g. the RPC's done callback) must not free someone else's slot
    with pytest.raises(Refusal):
        issuer_under_test.prepare_join(pending(join_lab.swtpm.tcti, "cp-2"))
    second.release()
    assert service.minter.tokens == []


@pytest.mark.parametrize(
    "body, problem",
    [(b"\xff\xff\xff", "Wire format was corrupt"), (b"\x1a\x02\xc3\x28", "bad UTF-8")],
    ids=["corrupt wire format", "node name not UTF-8"],
)
def test_request_that_is_no_protobuf_message_is_malformed(join_lab, body, problem):
    """Found by the security suite: grpc answered such a body with UNKNOWN 'Unexpected DecodeError', and nothing was logged."""
    service = join_lab.start("pcrs-only")
    stub, channel = join_lab.stub(service)
    with channel:
        raw_call = channel.unary_unary("/confidential.kubernetes.join.v1.JoinService/IssueJoinTicket")
        error = assert_refused(lambda: raw_call(body, timeout=10), grpc.StatusCode.INVALID_ARGUMENT, "malformed")
        assert "not a valid IssueJoinTicketRequest message" in error.details() and problem in error.details()
        assert stub.Health(pb2.HealthRequest()).status == "SERVING"
    refusal = [e for e in join_lab.logs() if e.get("result") == "refused"]
    assert [(e["event"], e["reason"]) for e in refusal] == [("join", "malformed")]
    assert service.minter.tokens == []


def test_refusal_quoting_a_huge_field_stays_a_refusal(join_lab):
    """Found by the security suite: a 58 KB node name in the refusal message exceeded the client's 16 KiB metadata limit,
    so the node got RESOURCE_EXHAUSTED 'Stream removed' instead of the reason."""
    service = join_lab.start("pcrs-only")
    stub, channel = join_lab.stub(service)
    with channel:
        nonce = stub.GetNonce(pb2.GetNonceRequest()).nonce
        request = join_request(join_lab.swtpm.tcti, nonce, EphemeralKey.generate().public_bytes())
        request.node_name = "X" * 60_000
        error = assert_refused(lambda: stub.IssueJoinTicket(request), grpc.StatusCode.INVALID_ARGUMENT, "node-name")
    assert len(error.details()) < 1200 and error.details().endswith("more characters)")
    assert len([e for e in join_lab.logs() if e.get("result") == "refused"][0]["msg"]) < 1200


def test_a_token_is_retired_once_its_node_registered_and_no_longer_authenticates(join_lab):
    service = join_lab.start("pcrs-only")
    token = join_with_client(join_lab, service).bootstrap_token
    api = service.minter
    assert api.authenticates(token) and list(service.issuer.live_tokens.values())[0].node_name == "worker-1"
    time.sleep(0.3)
    assert api.authenticates(token), "nothing registered yet: the token stays"
    api.register_node("worker-1")
    assert wait_for(lambda: not api.authenticates(token))
    assert api.retired == [token.split(".")[0]] and service.issuer.live_tokens == {}
    retired = [e for e in join_lab.logs() if e["event"] == "token"]
    assert [(e["result"], e["node_name"]) for e in retired] == [("retired", "worker-1")]
    assert token.split(".")[1] not in join_lab.log_stream.getvalue()


def test_tokens_left_by_an_earlier_service_are_adopted_and_retired(join_lab):
    first = join_lab.start("pcrs-only")
    token = join_with_client(join_lab, first).bootstrap_token
    first.stop_now()
    second = join_lab.start(None, api=first.minter)
    assert wait_for(lambda: token.split(".")[0] in second.issuer.live_tokens)
    first.minter.register_node("worker-1")
    assert wait_for(lambda: not first.minter.authenticates(token))


def test_first_disk_is_bound_in_the_api_and_mirrored_on_every_control_plane(join_lab, other_swtpm, tmp_path):
    join_lab.enrol(join_lab.swtpm.tcti, "worker-1")
    join_lab.enrol(other_swtpm.tcti, "worker-2")
    first = join_lab.start("pcrs-only")
    join_with_client(join_lab, first)
    binding = first.minter.configmaps[f"confidential-kubernetes-disk-{DISK_UUID}"]["data"]
    assert (binding["node_name"], binding["disk_uuid"]) == ("worker-1", DISK_UUID)
    # Another control plane (its own bindings file) on the same API learns it at start and refuses the disk to another TPM.
    second = join_lab.start(None, api=first.minter, bindings_file=str(tmp_path / "cp2-bindings.json"))
    assert wait_for(lambda: second.issuer.registry.mirror.get(DISK_UUID) is not None)
    with pytest.raises(JoinError) as err:
        join_with_client(join_lab, second, "worker-2", tcti=other_swtpm.tcti, disk_uuid=DISK_UUID)
    assert (err.value.code, err.value.reason) == ("PERMISSION_DENIED", "disk-not-granted")
    assert [n for n, t in first.minter.tokens] == ["worker-1"]


def test_a_binding_race_between_control_planes_is_settled_by_the_api(join_lab, other_swtpm, tmp_path):
    """The second service has not mirrored the binding yet: the API refuses its claim, and the node gets nothing."""
    join_lab.enrol(join_lab.swtpm.tcti, "worker-1")
    join_lab.enrol(other_swtpm.tcti, "worker-2")
    api = FakeApi()
    first = join_lab.start("pcrs-only", api=api)
    second = join_lab.start(None, api=api, bindings_file=str(tmp_path / "cp2-bindings.json"))
    # The second service's watch has not delivered the first's binding yet.
    api.withheld.add("configmaps")
    join_with_client(join_lab, first)
    assert second.issuer.registry.mirror.get(DISK_UUID) is None
    with pytest.raises(JoinError) as err:
        join_with_client(join_lab, second, "worker-2", tcti=other_swtpm.tcti, disk_uuid=DISK_UUID)
    assert err.value.reason == "disk-not-granted" and second.issuer.registry.mirror.get(DISK_UUID) is not None
    assert [n for n, t in api.tokens] == ["worker-1"]


def test_no_binding_is_made_while_the_api_is_unreachable(join_lab):
    api = FakeApi()
    api.fail_bindings = True
    service = join_lab.start("pcrs-only", api=api)
    with pytest.raises(JoinError) as err:
        join_with_client(join_lab, service, attempts=1)
    assert (err.value.code, err.value.reason) == ("UNAVAILABLE", "disk-binding")
    assert api.tokens == [] and service.issuer.registry.mirror.all() == []


def test_health_check_fails_with_the_services_load_error_and_passes_once_it_loaded(join_lab, capsys):
    from ansible_collections.confidential.kubernetes.plugins.module_utils._join import health

    service = join_lab.start("pcrs-only")
    ca = join_lab.dir / "ca.crt"
    ca.write_bytes(join_lab.ca_pem)
    argv = [
        "--endpoint",
        service.endpoint,
        "--ca",
        str(ca),
        "--timeout",
        "10",
        "--policy-file",
        str(join_lab.policy_file),
        "--enrolment-file",
        str(join_lab.enrolment_file),
    ]
    assert health.main(argv) == 0
    join_lab.policy_file.write_text(
        '{"version": 1, "hash_algorithm": "sha256", "ak_trust": "pcrs-only", "pcrs": {"99": {"allowed": []}}}'
    )
    assert health.main(argv) == 1
    error = capsys.readouterr().err
    assert "refused the policy file that was pushed" in error and "measurement policy" in error and "99" in error
    join_lab.write_policy("pcrs-only")
    assert health.main(argv) == 0


def test_joins_are_verified_signed_and_sealed_in_worker_processes_that_get_no_key_in_their_command_line_and_stop_with_it(
    join_lab,
):
    service = join_lab.start("pcrs-only", worker_processes=2)
    payload = join_with_client(join_lab, service, "worker-1")
    pids = service.workers.pids()
    assert len(pids) == 2 and os.getpid() not in pids
    assert [e["worker_processes"] for e in join_lab.logs() if e["event"] == "start"] == [2]
    x509.load_pem_x509_certificate(payload.kubelet_client_crt.encode()).verify_directly_issued_by(
        x509.load_pem_x509_certificate((join_lab.pki_dir / "ca.crt").read_bytes())
    )
    key_lines = [
        line for line in (join_lab.pki_dir / "ca.key").read_bytes().splitlines() if not line.startswith(b"-----")
    ]
    for pid in pids:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            command_line = handle.read()
        assert b"multiprocessing" in command_line
        assert not any(line in command_line for line in key_lines) and b"ca.key" not in command_line
    service.stop_now()
    assert all(_gone(pid) for pid in pids), "a worker outlived the service"


def test_without_worker_processes_the_event_loop_verifies_signs_seals_and_refuses(join_lab):
    service = join_lab.start("pcrs-only", worker_processes=0)
    payload = join_with_client(join_lab, service, "worker-1")
    assert service.workers.pids() == []
    assert [e["worker_processes"] for e in join_lab.logs() if e["event"] == "start"] == [0]
    x509.load_pem_x509_certificate(payload.kubelet_client_crt.encode()).verify_directly_issued_by(
        x509.load_pem_x509_certificate((join_lab.pki_dir / "ca.crt").read_bytes())
    )
    stub, channel = join_lab.stub(service)
    with channel:
        nonce = stub.GetNonce(pb2.GetNonceRequest()).nonce
        request = join_request(
            join_lab.swtpm.tcti, nonce, EphemeralKey.generate().public_bytes(), csr=make_csr("worker-2")
        )
        assert_refused(lambda: stub.IssueJoinTicket(request), grpc.StatusCode.PERMISSION_DENIED, "csr-subject")
    assert [t for n, t in service.minter.tokens] == [payload.bootstrap_token]


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(") ", 1)[1].startswith("Z")
    except OSError:
        return True


def test_a_dead_worker_costs_one_request_and_the_pool_is_started_again(join_lab):
    service = join_lab.start("pcrs-only", worker_processes=1)
    assert isinstance(join_with_client(join_lab, service, "worker-1"), JoinTicket)
    [pid] = service.workers.pids()
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: _gone(pid))
    outcomes = []
    for dummy in range(2):
        try:
            outcomes.append(type(join_with_client(join_lab, service, "worker-1", attempts=1)).__name__)
        except JoinError as exc:
            outcomes.append(exc.reason)
    assert outcomes in (["internal", "JoinTicket"], ["JoinTicket", "JoinTicket"]), outcomes
    assert service.workers.pids() and pid not in service.workers.pids()


@pytest.mark.parametrize(
    "flow,document,named",
    [
        (
            "rejoin",
            {
                "version": 1,
                "cluster_id": "00" * 32,
                "measurement_secret": "",
                "measurement_salt": "",
                "state_disk_key": "",
                "bootstrap_token": "abcdef.0123456789abcdef",
            },
            "unknown field\\(s\\): bootstrap_token",
        ),
        ("join", {"version": 1, "cluster_id": "00" * 32}, "lacks field\\(s\\): node_name, control_plane"),
        ("join", {"version": 2}, "not a version 1 join ticket"),
    ],
)
def test_the_client_refuses_a_ticket_that_is_not_its_flows_type(flow, document, named):
    """A ticket that opens but is not what the flow's type says never reaches the node's lock, disk or files."""
    key = EphemeralKey.generate()
    nonce = bytes(range(32))
    sealed = seal.seal(json.dumps(document).encode(), key.public_bytes(), flow, nonce, "joinservice")
    with pytest.raises(JoinError, match=named) as err:
        open_ticket(key, sealed, flow, nonce, "joinservice")
    assert err.value.reason == "ticket-open" and not err.value.retryable
