"""Protocol attacks on the join service (real gRPC over TLS, real swtpm) and on the controller's init path.

Every attack asserts the specific refusal (gRPC status, reason, message) and, through the ``attack``
ledger, that the attacker obtained nothing: no bootstrap token minted for it, no sealed payload it
can open, no cluster secret generated or sealed. The summary line counts them:
``protocol attacks: N attacks, N refused, 0 secrets obtained``.
"""

from __future__ import annotations

import base64
import json
import os
import time
from types import SimpleNamespace

import grpc
import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import controller, issuer
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.nonces import NonceStore
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import dump_policy
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto import seal
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.seal import X25519, EphemeralKey, SealError
from ansible_collections.confidential.kubernetes.plugins.module_utils._join import credential
from ansible_collections.confidential.kubernetes.plugins.module_utils._join import joinservice_pb2 as pb2
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.client import JoinError, open_ticket, request_ticket

from join_harness import (DISK_UUID, Clock, assert_refused, document_json, evidence_for, join_request, join_with_client, make_csr,
                          policy_from_swtpm)


def _tokens(attack, service) -> None:
    attack.obtained("bootstrap token(s) minted", len(service.minter.tokens))


def _opened_by(keys, envelope: bytes, flow: str, nonce: bytes, verifier_id: str) -> int:
    """How many of the attacker's keys open the envelope."""
    opened = 0
    for key in keys:
        try:
            key.open(envelope, flow, nonce, verifier_id)
            opened += 1
        except SealError:
            pass
    return opened


# --- join service -----------------------------------------------------------------------------------------------


def test_replayed_nonce(join_lab, attack):
    service = join_lab.start("pcrs-only")
    stub, channel = join_lab.stub(service)
    with channel:
        nonce = stub.GetNonce(pb2.GetNonceRequest()).nonce
        request = join_request(evidence_for(join_lab.swtpm.tcti, nonce, EphemeralKey.generate().public_bytes()), nonce)
        stub.IssueJoinTicket(request)
        issued = len(service.minter.tokens)
        error = assert_refused(lambda: stub.IssueJoinTicket(request), grpc.StatusCode.FAILED_PRECONDITION, "nonce-reused")
    assert "replayed evidence" in error.details()
    attack.obtained("bootstrap token(s) minted for the replay", len(service.minter.tokens) - issued)


def test_expired_nonce(join_lab, attack):
    clock = Clock()
    service = join_lab.start("pcrs-only", nonces=NonceStore(ttl=60, clock=clock))
    stub, channel = join_lab.stub(service)
    with channel:
        nonce = stub.GetNonce(pb2.GetNonceRequest()).nonce
        request = join_request(evidence_for(join_lab.swtpm.tcti, nonce, EphemeralKey.generate().public_bytes()), nonce)
        clock.now += 61
        error = assert_refused(lambda: stub.IssueJoinTicket(request), grpc.StatusCode.FAILED_PRECONDITION, "nonce-stale")
    assert "expired" in error.details()
    _tokens(attack, service)


def test_nonce_not_issued_by_the_service(join_lab, attack):
    service = join_lab.start("pcrs-only")
    stub, channel = join_lab.stub(service)
    nonce = os.urandom(32)
    with channel:
        request = join_request(evidence_for(join_lab.swtpm.tcti, nonce, EphemeralKey.generate().public_bytes()), nonce)
        assert_refused(lambda: stub.IssueJoinTicket(request), grpc.StatusCode.FAILED_PRECONDITION, "nonce-unknown")
    _tokens(attack, service)


def test_relayed_evidence_at_level_1(join_lab, attack):
    """A third party forwards a genuine node's evidence and nonce first: the ticket is sealed to the node's ephemeral key."""
    service = join_lab.start("pcrs-only")
    stub, channel = join_lab.stub(service)
    node_key = EphemeralKey.generate()
    with channel:
        nonce = stub.GetNonce(pb2.GetNonceRequest()).nonce
        request = join_request(evidence_for(join_lab.swtpm.tcti, nonce, node_key.public_bytes()), nonce)
        relayed = stub.IssueJoinTicket(request)
        relay_keys = [EphemeralKey.generate(), EphemeralKey.generate(X25519)]
        attack.obtained("tickets opened by the relay", _opened_by(relay_keys, relayed.sealed_ticket, "join", nonce, service.issuer.verifier_id))
        # The genuine node's own request now finds its nonce used.
        assert_refused(lambda: stub.IssueJoinTicket(request), grpc.StatusCode.FAILED_PRECONDITION, "nonce-reused")
    # Only the node's key opens it: the relay was refused everything but ciphertext.
    assert json.loads(node_key.open(relayed.sealed_ticket, "join", nonce, service.issuer.verifier_id))["version"] == 1


def test_relayed_evidence_at_level_2(join_lab, other_swtpm, attack):
    """At AK trust level 2 the ticket is also wrapped to a credential only the node's TPM can activate: the relay's TPM cannot."""
    service = join_lab.start("ek-certificate")
    stub, channel = join_lab.stub(service)
    node_key = EphemeralKey.generate()
    with channel:
        nonce = stub.GetNonce(pb2.GetNonceRequest()).nonce
        relayed = stub.IssueJoinTicket(join_request(evidence_for(join_lab.swtpm.tcti, nonce, node_key.public_bytes()), nonce))
    opened = 0
    for relay_key in (EphemeralKey.generate(), node_key):  # even with the node's ephemeral key, the relay's TPM is not the node's
        with pytest.raises(JoinError) as err:
            open_ticket(relay_key, relayed.sealed_ticket, relayed.credential_blob, relayed.credential_encrypted_seed, "join", nonce,
                        service.issuer.verifier_id, other_swtpm.tcti)
        assert err.value.reason == "credential-activation"
    with pytest.raises(credential.CredentialWrapError):
        credential.unwrap(relayed.sealed_ticket, os.urandom(32), nonce)
    attack.obtained("tickets opened by the relay", opened)


def test_ak_and_quote_from_another_tpm_with_the_genuine_ek(join_lab, other_swtpm, attack):
    """EK (and certificate) of the genuine TPM, AK and quote of another: the service answers, but nobody can open it."""
    service = join_lab.start("ek-certificate")
    stub, channel = join_lab.stub(service)
    key = EphemeralKey.generate()
    with channel:
        nonce = stub.GetNonce(pb2.GetNonceRequest()).nonce
        with issuer.Tpm(join_lab.swtpm.tcti) as tpm:
            genuine = issuer.issue_evidence(tpm, nonce, key.public_bytes()).to_document()
        with issuer.Tpm(other_swtpm.tcti) as tpm:
            mixed = issuer.issue_evidence(tpm, nonce, key.public_bytes()).to_document()
        mixed["ek_public"], mixed["ek_certificate"] = genuine["ek_public"], genuine["ek_certificate"]
        response = stub.IssueJoinTicket(join_request(document_json(mixed), nonce))
    for tcti in (other_swtpm.tcti, join_lab.swtpm.tcti):
        with pytest.raises(JoinError) as err:
            open_ticket(key, response.sealed_ticket, response.credential_blob, response.credential_encrypted_seed, "join", nonce,
                        service.issuer.verifier_id, tcti)
        assert err.value.reason == "credential-activation"
    attack.obtained("tickets opened", 0)


def test_swapped_ephemeral_key(join_lab, attack):
    service = join_lab.start("pcrs-only")
    stub, channel = join_lab.stub(service)
    with channel:
        nonce = stub.GetNonce(pb2.GetNonceRequest()).nonce
        with issuer.Tpm(join_lab.swtpm.tcti) as tpm:
            document = issuer.issue_evidence(tpm, nonce, EphemeralKey.generate().public_bytes()).to_document()
        document["user_data"] = base64.b64encode(EphemeralKey.generate().public_bytes()).decode()
        error = assert_refused(lambda: stub.IssueJoinTicket(join_request(document_json(document), nonce)), grpc.StatusCode.PERMISSION_DENIED,
                               "nonce")
    assert "not bound to this nonce and ephemeral key" in error.details()
    _tokens(attack, service)


def test_downgraded_hpke_suite_in_the_evidence(join_lab, attack):
    """A man in the middle swaps the node's ML-KEM hybrid key for a classic X25519 key of its own: the quote does not bind it."""
    service = join_lab.start("pcrs-only")
    stub, channel = join_lab.stub(service)
    with channel:
        nonce = stub.GetNonce(pb2.GetNonceRequest()).nonce
        with issuer.Tpm(join_lab.swtpm.tcti) as tpm:
            document = issuer.issue_evidence(tpm, nonce, EphemeralKey.generate().public_bytes()).to_document()
        document["user_data"] = base64.b64encode(EphemeralKey.generate(X25519).public_bytes()).decode()
        assert_refused(lambda: stub.IssueJoinTicket(join_request(document_json(document), nonce)), grpc.StatusCode.PERMISSION_DENIED, "nonce")
    _tokens(attack, service)


def test_downgraded_hpke_suite_in_the_response(join_lab, attack):
    """A man in the middle relabels the sealed ticket as X25519: the node's key refuses a suite other than its own."""
    service = join_lab.start("pcrs-only")
    stub, channel = join_lab.stub(service)
    node_key = EphemeralKey.generate()
    with channel:
        nonce = stub.GetNonce(pb2.GetNonceRequest()).nonce
        response = stub.IssueJoinTicket(join_request(evidence_for(join_lab.swtpm.tcti, nonce, node_key.public_bytes()), nonce))
    envelope = json.loads(response.sealed_ticket)
    assert envelope["suite"] == seal.MLKEM768_X25519.name
    envelope["suite"] = X25519.name
    with pytest.raises(SealError, match="downgrade refused"):
        node_key.open(json.dumps(envelope).encode(), "join", nonce, service.issuer.verifier_id)
    # Re-sealing a payload of the attacker's choosing to a classic key of its own gets it nothing from the service either.
    attack.obtained("tickets opened by the man in the middle",
                    _opened_by([EphemeralKey.generate(X25519)], json.dumps(envelope).encode(), "join", nonce, service.issuer.verifier_id))


def test_ek_certificate_from_another_ca(join_lab, foreign_swtpm, attack):
    """A TPM whose EK certificate chains to a CA the cluster does not trust."""
    join_lab.policy_file.write_text(dump_policy(policy_from_swtpm(foreign_swtpm.tcti, "ek-certificate")))
    service = join_lab.start(None)
    stub, channel = join_lab.stub(service)
    with channel:
        nonce = stub.GetNonce(pb2.GetNonceRequest()).nonce
        request = join_request(evidence_for(foreign_swtpm.tcti, nonce, EphemeralKey.generate().public_bytes()), nonce)
        error = assert_refused(lambda: stub.IssueJoinTicket(request), grpc.StatusCode.PERMISSION_DENIED, "ek-certificate")
    assert "does not chain to the configured EK CA" in error.details()
    _tokens(attack, service)


def test_pcr15_marked_for_another_cluster(join_lab, attack):
    service = join_lab.start("pcrs-only")
    with issuer.Tpm(join_lab.swtpm.tcti) as tpm:
        tpm.pcr_event(15, os.urandom(32))
    with pytest.raises(JoinError) as err:
        join_with_client(join_lab, service)
    assert (err.value.code, err.value.reason) == ("PERMISSION_DENIED", "pcr-policy")
    assert "locked for another cluster" in str(err.value)
    _tokens(attack, service)


def test_rejoin_of_a_node_of_another_cluster(join_lab, attack):
    service = join_lab.start("pcrs-only")
    with issuer.Tpm(join_lab.swtpm.tcti) as tpm:
        tpm.pcr_event(15, os.urandom(32))
    with pytest.raises(JoinError) as err:
        request_ticket([service.endpoint], join_lab.ca_pem, join_lab.swtpm.tcti, "worker-1", disk_uuid=DISK_UUID, flow="rejoin")
    assert (err.value.code, err.value.reason) == ("PERMISSION_DENIED", "pcr-policy")
    attack.obtained("rejoin tickets", 0)


def test_csr_for_another_node_name(join_lab, attack):
    service = join_lab.start("pcrs-only")
    stub, channel = join_lab.stub(service)
    with channel:
        nonce = stub.GetNonce(pb2.GetNonceRequest()).nonce
        request = join_request(evidence_for(join_lab.swtpm.tcti, nonce, EphemeralKey.generate().public_bytes()), nonce,
                               node_name="worker-1", csr=make_csr("cp-1"))
        error = assert_refused(lambda: stub.IssueJoinTicket(request), grpc.StatusCode.PERMISSION_DENIED, "csr-subject")
    assert "system:node:cp-1" in error.details()
    _tokens(attack, service)


def test_tampered_boot_measurement(join_lab, attack):
    service = join_lab.start("pcrs-only")
    with issuer.Tpm(join_lab.swtpm.tcti) as tpm:
        tpm.pcr_event(9, b"tampered kernel command line")
    with pytest.raises(JoinError) as err:
        join_with_client(join_lab, service, attempts=3, backoff=0.01)
    assert (err.value.code, err.value.reason) == ("PERMISSION_DENIED", "pcr-policy")
    assert "PCR(s) 9" in str(err.value)
    refusal = [entry for entry in join_lab.logs() if entry.get("result") == "refused"][0]
    assert refusal["reason"] == "pcr-policy" and refusal["mismatches"][0]["pcr"] == 9
    _tokens(attack, service)


# --- controller: the init path (seal_init_secrets action) ---------------------------------------------------------


class InitController:
    """The seal_init_secrets action as a play runs it, with the node's credential activation answered by a real swtpm."""

    def __init__(self, tmp_path, node_tpm, ek_ca_pem: bytes):
        self.dir = tmp_path
        self.ledger = str(tmp_path / "nonce-ledger.json")
        self.secrets_file = tmp_path / "controller" / "cluster-secrets.json"
        self.policy_file = tmp_path / "policy.json"
        self.ek_ca_file = tmp_path / "ek-ca.pem"
        self.ek_ca_file.write_bytes(ek_ca_pem)
        self.node_tpm = node_tpm

    def write_policy(self, tcti: str, ak_trust: str) -> None:
        self.policy_file.write_text(dump_policy(policy_from_swtpm(tcti, ak_trust)))

    def nonce(self, ttl: float = 60.0) -> bytes:
        return controller.nonce_store(self.ledger, ttl).issue()

    def seal(self, evidence: bytes, nonce: bytes, answering_tcti: str, nonce_ttl: float = 60.0) -> dict:
        from ansible.parsing.dataloader import DataLoader
        from ansible_collections.confidential.kubernetes.plugins.action.seal_init_secrets import ActionModule
        args = dict(evidence=evidence.decode(), nonce=nonce.hex(), ek_ca_file=str(self.ek_ca_file), nonce_ledger=self.ledger,
                    nonce_ttl=nonce_ttl, policy=str(self.policy_file), secrets_file=str(self.secrets_file))
        task = SimpleNamespace(args=args, async_val=0, check_mode=False, action="confidential.kubernetes.seal_init_secrets")
        action = ActionModule(task, SimpleNamespace(_shell=SimpleNamespace(tmpdir="/nonexistent")), None, DataLoader(), None, None)

        def execute_module(module_name, module_args, task_vars):
            """What the tpm_evidence module does on the task's host: activate the credential with that host's TPM."""
            assert module_name == "confidential.kubernetes.tpm_evidence"
            try:
                with issuer.Tpm(answering_tcti) as tpm:
                    secret = issuer.answer_challenge(tpm, base64.b64decode(module_args["credential"]["blob"]),
                                                     base64.b64decode(module_args["credential"]["encrypted_seed"]))
            except issuer.TpmError as exc:
                return {"failed": True, "msg": str(exc)}
            return {"activated_secret": base64.b64encode(secret).decode()}

        action._execute_module = execute_module
        return action.run(task_vars={"inventory_hostname": "cp-1"})


@pytest.fixture
def init_controller(tmp_path, swtpm):
    init = InitController(tmp_path, swtpm, swtpm.ca_pem)
    init.write_policy(swtpm.tcti, "ek-certificate")
    return init


def _init_refused(attack, init, result: dict, reason: str) -> None:
    assert result.get("failed") and result["reason"] == reason, result
    assert "no secret was sealed" in result["msg"]
    attack.obtained("sealed init secrets", int("sealed" in result))
    # Only an attested node makes the controller generate the cluster's secrets.
    attack.obtained("cluster secrets generated", int(init.secrets_file.exists()))


def test_init_genuine_node_is_sealed_its_secrets(init_controller, swtpm):
    """The control case of the init attacks: the same harness does hand a genuine node its secrets."""
    key = EphemeralKey.generate()
    nonce = init_controller.nonce()
    result = init_controller.seal(evidence_for(swtpm.tcti, nonce, key.public_bytes()), nonce, swtpm.tcti)
    assert not result.get("failed"), result
    assert result["attestation"]["ak_trust_level"] == 2 and init_controller.secrets_file.exists()
    payload = json.loads(key.open(base64.b64decode(result["sealed"]), "init", nonce, result["verifier_id"]))
    assert payload["cluster_config"] == {} and len(base64.b64decode(payload["master_key"])) == 32


def test_init_replayed_nonce(init_controller, swtpm, attack):
    key = EphemeralKey.generate()
    nonce = init_controller.nonce()
    evidence = evidence_for(swtpm.tcti, nonce, key.public_bytes())
    assert not init_controller.seal(evidence, nonce, swtpm.tcti).get("failed")
    replay = init_controller.seal(evidence, nonce, swtpm.tcti)
    assert replay.get("failed") and replay["reason"] == "nonce-reused", replay
    attack.obtained("sealed init secrets for the replay", int("sealed" in replay))


def test_init_expired_nonce(init_controller, swtpm, attack):
    issued = time.monotonic()
    nonce = init_controller.nonce(ttl=2.0)
    evidence = evidence_for(swtpm.tcti, nonce, EphemeralKey.generate().public_bytes())
    # Past its lifetime, but not yet forgotten (the ledger keeps a nonce for two lifetimes, to name a replay as such).
    time.sleep(max(0.0, 2.6 - (time.monotonic() - issued)))
    _init_refused(attack, init_controller, init_controller.seal(evidence, nonce, swtpm.tcti, nonce_ttl=2.0), "nonce-stale")


def test_init_relayed_evidence_at_level_2(init_controller, swtpm, other_swtpm, attack):
    """The relay is the host the controller talks to; the credential challenge goes to the relay's TPM, which cannot answer it."""
    nonce = init_controller.nonce()
    evidence = evidence_for(swtpm.tcti, nonce, EphemeralKey.generate().public_bytes())
    _init_refused(attack, init_controller, init_controller.seal(evidence, nonce, other_swtpm.tcti), "credential-activation")


def test_init_relayed_evidence_at_level_1(init_controller, swtpm, attack):
    init_controller.write_policy(swtpm.tcti, "pcrs-only")
    node_key = EphemeralKey.generate()
    nonce = init_controller.nonce()
    result = init_controller.seal(evidence_for(swtpm.tcti, nonce, node_key.public_bytes()), nonce, swtpm.tcti)
    sealed = base64.b64decode(result["sealed"])
    attack.obtained("init secrets opened by the relay",
                    _opened_by([EphemeralKey.generate(), EphemeralKey.generate(X25519)], sealed, "init", nonce, result["verifier_id"]))
    assert json.loads(node_key.open(sealed, "init", nonce, result["verifier_id"]))["master_key"]


@pytest.mark.parametrize("suite", ["MLKEM768_X25519", "X25519"], ids=["swapped ephemeral key", "downgraded to X25519"])
def test_init_swapped_ephemeral_key(init_controller, swtpm, attack, suite):
    nonce = init_controller.nonce()
    document = json.loads(evidence_for(swtpm.tcti, nonce, EphemeralKey.generate().public_bytes()))
    document["user_data"] = base64.b64encode(EphemeralKey.generate(getattr(seal, suite)).public_bytes()).decode()
    _init_refused(attack, init_controller, init_controller.seal(document_json(document), nonce, swtpm.tcti), "nonce")


def test_init_ek_certificate_from_another_ca(init_controller, foreign_swtpm, attack):
    init_controller.write_policy(foreign_swtpm.tcti, "ek-certificate")
    nonce = init_controller.nonce()
    evidence = evidence_for(foreign_swtpm.tcti, nonce, EphemeralKey.generate().public_bytes())
    _init_refused(attack, init_controller, init_controller.seal(evidence, nonce, foreign_swtpm.tcti), "ek-certificate")


def test_init_pcr15_marked_for_another_cluster(init_controller, swtpm, attack):
    with issuer.Tpm(swtpm.tcti) as tpm:
        tpm.pcr_event(15, os.urandom(32))
    nonce = init_controller.nonce()
    evidence = evidence_for(swtpm.tcti, nonce, EphemeralKey.generate().public_bytes())
    result = init_controller.seal(evidence, nonce, swtpm.tcti)
    _init_refused(attack, init_controller, result, "pcr-policy")
    assert [m["pcr"] for m in result["mismatches"]] == [15]
