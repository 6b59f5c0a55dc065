"""Step 1 of a join costs a TPM (issue 25, item 3), against the real service (gRPC over TLS, real swtpms).

Evidence signed by a software key that claims TPM attributes and names an enrolled node's EK (and carries its genuine EK
certificate) passes step 1: only the credential activation of step 2 needs the TPM. Before, each such request stayed a
pending challenge for the nonce lifetime (60 s), so eight addresses filled the 4,096-entry table in 31 s and genuine
joins got ``busy``; the challenge also told the caller the EK's granted name and role, and step 1 used the nonce up.
Now a challenge lives seconds, one per EK and client, at most 16 per client; the grant comes in the ticket only.
"""

from __future__ import annotations

import collections
import json
import statistics
import threading
import time

import grpc

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import issuer
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.seal import EphemeralKey
from ansible_collections.confidential.kubernetes.plugins.module_utils._join import issuance
from ansible_collections.confidential.kubernetes.plugins.module_utils._join import joinservice_pb2 as pb2
from ansible_collections.confidential.kubernetes.plugins.module_utils._join import joinservice_pb2_grpc as pb2_grpc
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.client import JoinError

from forge import SoftwareQuoter, SourceRelay
from join_harness import DISK_UUID, OTHER_DISK_UUID, bound_user_data, join_request, join_with_client, make_csr

ATTACKERS = [f"127.0.0.{last}" for last in range(11, 19)]
# A table the old rules let 8 addresses fill within seconds here (the real one, 4,096, took them 31 s).
TABLE = 256
WARM_UP_CHALLENGES = 300
WARM_UP_SECONDS = 15.0
GENUINE_JOINS = 8


def _genuine_template(tcti: str, nonce: bytes) -> dict:
    with issuer.Tpm(tcti) as tpm:
        return issuer.issue_evidence(tpm, nonce, b"template").to_document()


def test_software_key_flood_from_eight_addresses_leaves_genuine_joins_served(
    join_lab, start_swtpm, attack, flood_figures, monkeypatch
):
    monkeypatch.setattr(issuance, "MAX_PENDING", TABLE)
    second = start_swtpm("lab2")
    join_lab.enrol(join_lab.swtpm.tcti, "worker-1")
    join_lab.enrol(second.tcti, "worker-2")
    # The rate limits out of the way: what is measured is what step 1 leaves behind.
    service = join_lab.start(
        "ek-certificate", ticket_rate=1000.0, ticket_burst=1000.0, nonce_rate=1000.0, nonce_burst=1000.0
    )
    targets = [
        ("worker-1", DISK_UUID, _genuine_template(join_lab.swtpm.tcti, b"\0" * 32)),
        ("worker-2", OTHER_DISK_UUID, _genuine_template(second.tcti, b"\0" * 32)),
    ]
    relays = [SourceRelay(source, ("127.0.0.1", service.port)) for source in ATTACKERS]
    stop = threading.Event()
    outcomes: collections.Counter = collections.Counter()
    disclosed = []
    peak = [0]

    def attacker(relay: SourceRelay) -> None:
        forged = [(name, disk, SoftwareQuoter(template), make_csr(name)) for name, disk, template in targets]
        channel = grpc.secure_channel(
            f"127.0.0.1:{relay.port}",
            grpc.ssl_channel_credentials(join_lab.ca_pem),
            options=[("grpc.use_local_subchannel_pool", 1), ("grpc.ssl_target_name_override", "127.0.0.1")],
        )
        stub = pb2_grpc.JoinServiceStub(channel)
        index = 0
        with channel:
            while not stop.is_set():
                name, disk, quoter, csr = forged[index % len(forged)]
                index += 1
                try:
                    nonce = stub.GetNonce(pb2.GetNonceRequest(), timeout=10).nonce
                    key = EphemeralKey.generate().public_bytes()
                    evidence = json.dumps(
                        quoter.quote(nonce, bound_user_data(key, node_name=name, disk_uuid=disk, csr=csr))
                    ).encode()
                    challenge = stub.IssueJoinTicket(
                        join_request("", nonce, key, name, csr=csr, disk_uuid=disk, evidence=evidence), timeout=10
                    )
                    outcomes["challenged"] += 1
                    if challenge.node_name or challenge.control_plane:
                        disclosed.append(challenge.node_name)
                except grpc.RpcError as exc:
                    outcomes[exc.code().name] += 1

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], service.issuer.pending())
            time.sleep(0.05)

    threads = [threading.Thread(target=attacker, args=(relay,)) for relay in relays] + [threading.Thread(target=sample)]
    for thread in threads:
        thread.start()
    latencies, failures = [], []
    try:
        deadline = time.monotonic() + WARM_UP_SECONDS
        while outcomes["challenged"] < WARM_UP_CHALLENGES and time.monotonic() < deadline:
            time.sleep(0.1)
        assert outcomes["challenged"] > 0, f"the forged evidence did not pass step 1: {dict(outcomes)}"
        for index in range(GENUINE_JOINS):
            name, tpm = (("worker-1", join_lab.swtpm), ("worker-2", second))[index % 2]
            started = time.monotonic()
            try:
                join_with_client(join_lab, service, name, tcti=tpm.tcti, attempts=1)
                latencies.append(time.monotonic() - started)
            except JoinError as exc:
                failures.append(f"{exc.reason}: {exc}")
        during = sum(outcomes.values())
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        for relay in relays:
            relay.close()
    attack.obtained("grants disclosed to a caller without the TPM", len(disclosed))
    attack.obtained("genuine joins refused during the step-1 flood", len(failures))
    assert failures == [], failures
    assert sum(outcomes.values()) > during or not stop.is_set() or during > 0
    # One challenge per EK and client: 8 addresses naming 2 enrolled EKs hold at most 16, not the table.
    assert peak[0] <= len(ATTACKERS) * len(targets) + 2, f"{peak[0]} challenges waited at once"
    # No forged request ever got a token, and nothing the flood did used up a nonce.
    assert len(service.minter.tokens) == GENUINE_JOINS and service.issuer._nonces.used() == GENUINE_JOINS
    ordered = sorted(latencies)
    flood_figures.setdefault("step1", {})["step-1 flood"] = (
        f"{sum(outcomes.values())} forged step-1 requests from {len(ATTACKERS)} addresses ({dict(outcomes)}), at most {peak[0]} "
        f"challenges waiting; {len(latencies)}/{GENUINE_JOINS} genuine joins meanwhile, p50 {round(statistics.median(ordered) * 1000)} ms, "
        f"p99 {round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000)} ms"
    )
