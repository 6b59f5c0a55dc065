"""TicketIssuer without gRPC: the challenges that wait for their activation proof."""

from __future__ import annotations

import os

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import tpm2
from ansible_collections.confidential.kubernetes.plugins.module_utils._join import issuance
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.config import (
    PolicyWatcher,
    load_root_secrets,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.crypto import Checked, CheckRequest, Refusal
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.issuance import TicketIssuer
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.nonces import MacNonces
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.pki import ClusterPki
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.registry import (
    BindingMirror,
    EnrolmentWatcher,
    NodeRegistry,
)

from join_harness import API_SERVER, DISK_UUID, K8S_VERSION, Clock, FakeApi

TTL = issuance.PENDING_TTL


@pytest.fixture
def waiting(join_lab, monkeypatch):
    """An issuer whose clocks the test moves, at most 2 challenges waiting, and a way to pass step 1 for the lab's TPM."""
    monkeypatch.setattr(issuance, "MAX_PENDING", 2)
    join_lab.write_policy("pcrs-only")
    identity = join_lab.enrol(join_lab.swtpm.tcti, "worker-1")
    monotonic, wall = Clock(), Clock()
    api = FakeApi()
    policy = PolicyWatcher(str(join_lab.policy_file), join_lab.log, interval=0)
    registry = NodeRegistry(
        EnrolmentWatcher(str(join_lab.enrolment_file), join_lab.log, interval=0),
        BindingMirror(str(join_lab.dir / "disk-bindings.json")),
        [],
        None,
    )
    nonces = MacNonces(ttl=60, clock=wall)
    issuer = TicketIssuer(
        load_root_secrets(str(join_lab.secrets_file)),
        ClusterPki.load(str(join_lab.pki_dir)),
        policy.current,
        [],
        api.minter(),
        nonces,
        registry,
        api.bindings(),
        API_SERVER,
        K8S_VERSION,
        "verifier",
        clock=monotonic,
    )

    def challenge(client: str | None = None, connection: str = "") -> bytes:
        nonce = issuer.issue_nonce()
        check = CheckRequest(policy.current(), "join", b"", nonce, "", False, DISK_UUID, b"")
        issuer.accept(
            check,
            Checked(1, [], b"", identity, None, b"", os.urandom(32), tpm2.Credential(b"blob", b"seed")),
            client if client is not None else nonce.hex(),
            connection,
        )
        return nonce

    def advance(seconds: float) -> None:
        monotonic.now += seconds
        wall.now += seconds

    return issuer, challenge, advance


def test_challenges_waiting_are_capped_and_expired_ones_make_room(waiting):
    issuer, challenge, advance = waiting
    first = challenge()
    advance(TTL / 2)
    second = challenge()
    with pytest.raises(Refusal) as refused:
        challenge()
    assert (refused.value.code, refused.value.reason, issuer.pending()) == ("RESOURCE_EXHAUSTED", "busy", 2)
    advance(TTL / 2 + 1)
    third = challenge()
    assert issuer.pending() == 2
    for nonce, reason in (
        (first, "activation-unknown"),
        (second, "credential-activation"),
        (third, "credential-activation"),
    ):
        with pytest.raises(Refusal) as refused:
            issuer.take(nonce, b"not the proof")
        assert refused.value.reason == reason
    assert issuer.pending() == 0


def test_one_challenge_per_ek_and_client_the_new_one_replaces_the_old(waiting):
    issuer, challenge, _advance = waiting
    old = challenge("10.0.0.1")
    new = challenge("10.0.0.1")
    other_client = challenge("10.0.0.2")
    assert issuer.pending() == 2
    with pytest.raises(Refusal) as refused:
        issuer.take(old, b"not the proof")
    assert refused.value.reason == "activation-unknown"
    for nonce in (new, other_client):
        with pytest.raises(Refusal) as refused:
            issuer.take(nonce, b"not the proof")
        assert refused.value.reason == "credential-activation"


def test_a_neighbour_behind_the_same_address_cannot_replace_a_nodes_challenge(waiting):
    """Issue 36: behind one NAT (or /64) a forged step 1 naming the node's EK replaced the node's challenge between its
    steps. The slot is the connection's: only the node's own connection replaces it."""
    issuer, challenge, _advance = waiting
    node = challenge("10.0.0.1", "ipv4:10.0.0.1:40000")
    neighbour = challenge("10.0.0.1", "ipv4:10.0.0.1:40001")
    assert issuer.pending() == 2
    for nonce in (node, neighbour):
        with pytest.raises(Refusal) as refused:
            issuer.take(nonce, b"not the proof")
        assert refused.value.reason == "credential-activation"
    retried = challenge("10.0.0.1", "ipv4:10.0.0.1:40000")
    challenge("10.0.0.1", "ipv4:10.0.0.1:40000")
    assert issuer.pending() == 1
    with pytest.raises(Refusal) as refused:
        issuer.take(retried, b"not the proof")
    assert refused.value.reason == "activation-unknown"


def test_challenges_of_one_ek_are_capped_and_none_is_displaced(waiting, monkeypatch):
    issuer, challenge, _advance = waiting
    monkeypatch.setattr(issuance, "MAX_PENDING", 100)
    monkeypatch.setattr(issuance, "MAX_PENDING_PER_EK", 2)
    first, second = challenge("10.0.0.1"), challenge("10.0.0.2")
    with pytest.raises(Refusal) as refused:
        challenge("10.0.0.3")
    assert refused.value.reason == "busy" and "of this TPM" in str(refused.value)
    assert issuer.pending() == 2
    for nonce in (first, second):
        with pytest.raises(Refusal) as refused:
            issuer.take(nonce, b"not the proof")
        assert refused.value.reason == "credential-activation"


def test_challenges_of_one_client_are_capped(waiting, monkeypatch):
    issuer, challenge, _advance = waiting
    monkeypatch.setattr(issuance, "MAX_PENDING", 100)
    monkeypatch.setattr(issuance, "MAX_PENDING_PER_CLIENT", 3)
    # Another EK each time, as a software key naming several EKs would: the client's cap holds.
    for index in range(3):
        issuer._by_slot.clear()
        challenge("10.0.0.9")
        assert issuer.pending() == index + 1
    issuer._by_slot.clear()
    with pytest.raises(Refusal) as refused:
        challenge("10.0.0.9")
    assert (refused.value.code, refused.value.reason) == ("RESOURCE_EXHAUSTED", "busy") and "of this client" in str(
        refused.value
    )
    challenge("10.0.0.10")
    assert issuer.pending() == 4


def test_step_1_does_not_use_the_nonce(waiting):
    issuer, challenge, _advance = waiting
    nonce = challenge()
    assert issuer._nonces.used() == 0
    with pytest.raises(Refusal):
        issuer.take(nonce, b"not the proof")
    assert issuer._nonces.used() == 0
