"""The lower items of issue 25 (item 5), each against the real service (gRPC over TLS, real swtpm): a token whose node's
Node object existed already is retired too; malformed requests are rate-limited and sampled in the log; the grant is
checked again at step 2."""

from __future__ import annotations

import collections
import datetime
import time

import grpc

from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.seal import EphemeralKey
from ansible_collections.confidential.kubernetes.plugins.module_utils._join import joinservice_pb2 as pb2

from join_harness import activate, assert_refused, join_request, join_with_client, wait_for


def test_a_token_is_retired_when_its_node_existed_already(join_lab, attack):
    """The node's name was a member before (its Node object stayed): the token used to live its whole 15 minutes."""
    service = join_lab.start("pcrs-only")
    api = service.minter
    api.register_node("worker-1", datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=3))
    token = join_with_client(join_lab, service).bootstrap_token
    time.sleep(0.3)
    assert api.authenticates(token), "the kubelet has not reported yet: the token stays"
    api.report_ready("worker-1")
    wait_for(lambda: not api.authenticates(token), timeout=5)
    attack.obtained("bootstrap tokens left valid after their node registered", int(api.authenticates(token)))


def test_a_malformed_request_flood_is_rate_limited_and_sampled_in_the_log(join_lab, attack):
    """3,000 requests that are no protobuf message: each used to be answered and logged (3,000 lines in 4 s)."""
    service = join_lab.start("pcrs-only", ticket_rate=5.0, ticket_burst=20.0)
    stub, channel = join_lab.stub(service)
    raw = channel.unary_unary("/confidential.kubernetes.join.v1.JoinService/IssueJoinTicket")
    outcomes: collections.Counter = collections.Counter()
    started = time.monotonic()
    with channel:
        for _call in range(3000):
            try:
                raw(b"\xff" * 64, timeout=10)
            except grpc.RpcError as exc:
                outcomes[exc.code().name] += 1
        seconds = time.monotonic() - started
        # The service still answers a well-formed call (GetNonce has its own bucket).
        assert len(stub.GetNonce(pb2.GetNonceRequest()).nonce) == 32
    lines = [entry for entry in join_lab.logs() if entry.get("reason") == "malformed"]
    # The bucket (rate 5/s, burst 20) answers at most its burst and its rate over the flood's time, whatever the
    # machine's speed (a loaded machine took about 13 s and answered 85).
    answered = outcomes["INVALID_ARGUMENT"]
    assert answered <= 20 + 5 * (seconds + 1) and outcomes["RESOURCE_EXHAUSTED"] >= 3000 - answered - 10, dict(outcomes)
    attack.obtained("log lines written for the malformed flood beyond one per 10 s", max(0, len(lines) - 2))


def test_grant_is_checked_again_at_step_2(join_lab, attack):
    """A control plane removed from the enrolment between step 1 and step 2 gets no control-plane PKI."""
    join_lab.enrol(join_lab.swtpm.tcti, "cp-1", control_plane=True)
    service = join_lab.start("pcrs-only")
    stub, channel = join_lab.stub(service)
    with channel:
        nonce = stub.GetNonce(pb2.GetNonceRequest()).nonce
        challenge = stub.IssueJoinTicket(
            join_request(join_lab.swtpm.tcti, nonce, EphemeralKey.generate().public_bytes(), "cp-1", True)
        )
        join_lab.enrol(join_lab.swtpm.tcti, "cp-1", control_plane=False)
        error = assert_refused(
            lambda: activate(stub, join_lab.swtpm.tcti, challenge, nonce),
            grpc.StatusCode.PERMISSION_DENIED,
            "role-not-granted",
        )
    assert "checked again at activation" in error.details()
    attack.obtained("tickets issued to a node whose grant was withdrawn", len(service.minter.tokens))
