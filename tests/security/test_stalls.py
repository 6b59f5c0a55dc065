"""One address cannot stall the join service (issue 36, item 6), against the real service (gRPC over TLS behind its
gate, real swtpms), on loopback, where 127.0.0.0/8 gives the attackers many source addresses.

- Streams that send HEADERS and never a body, 8 connections x 32 from one address: before, they filled gRPC's 256
  calls in progress (``max_concurrent_rpcs``) and every other client got RESOURCE_EXHAUSTED for 30 minutes, unseen by
  the gate and the rate limits.
- 32 addresses each holding 32 connections that made one Health call: before, they kept the gate's global cap (1,024)
  full for ``connection_idle_timeout`` (120 s) and every new connection was refused.
- Step 1 with forged evidence (a software key claiming TPM attributes, ``forge.py``) naming an enrolled EK from 256
  addresses: before, one challenge per EK and address filled the pending table and every join got ``busy``.

Genuine nodes join meanwhile from another network (127.0.200.1, through a relay bound there); their p99 goes to the
suite's summary line.
"""

from __future__ import annotations

import asyncio
import collections
import json
import statistics
import threading
import time

import grpc
from grpc import aio

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import issuer
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.seal import EphemeralKey
from ansible_collections.confidential.kubernetes.plugins.module_utils._join import issuance
from ansible_collections.confidential.kubernetes.plugins.module_utils._join import joinservice_pb2 as pb2
from ansible_collections.confidential.kubernetes.plugins.module_utils._join import joinservice_pb2_grpc as pb2_grpc
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.client import JoinError

from forge import SoftwareQuoter, SourceRelay, _pump
from join_harness import OTHER_DISK_UUID, bound_user_data, join_request, join_with_client, make_csr, wait_for

GENUINE = "127.0.200.1"
GENUINE_JOINS = 6
STALL_CONNECTIONS = 8
STREAMS_PER_CONNECTION = 32
HEALTH_ADDRESSES = [f"127.0.{network}.7" for network in range(1, 33)]
HEALTH_CONNECTIONS = 32
NONCE_PATH = "/confidential.kubernetes.join.v1.JoinService/GetNonce"


def _p99_ms(latencies: list[float]) -> int:
    ordered = sorted(latencies)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000)


def _genuine_joins(join_lab, service, relay: SourceRelay) -> tuple[list[float], list[str]]:
    """Whole joins (nonce, evidence, both steps, activation) from GENUINE, one attempt each."""
    endpoint, service.endpoint = service.endpoint, f"127.0.0.1:{relay.port}"
    latencies, failures = [], []
    try:
        for _i in range(GENUINE_JOINS):
            started = time.monotonic()
            try:
                join_with_client(join_lab, service, "worker-1", attempts=1, timeout=20)
                latencies.append(time.monotonic() - started)
            except JoinError as exc:
                failures.append(f"{exc.reason}: {exc}")
    finally:
        service.endpoint = endpoint
    return latencies, failures


def _figures(name: str, flood_figures: dict, latencies: list[float], what: str) -> None:
    flood_figures.setdefault("step1", {})[name] = (
        f"{what}; {len(latencies)}/{GENUINE_JOINS} genuine joins meanwhile, "
        f"p50 {round(statistics.median(latencies) * 1000)} ms, p99 {_p99_ms(latencies)} ms"
    )


class _Stalls:
    """STALL_CONNECTIONS connections from ``source``, each with STREAMS_PER_CONNECTION calls whose headers are sent and
    whose request message never is (a request-streaming call whose iterator never yields: gRPC's own client sends the
    HEADERS frame and waits)."""

    def __init__(self, join_lab, relay: SourceRelay):
        self.outcomes: dict[str, int] = {}
        self._never = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._done = asyncio.run_coroutine_threadsafe(self._stall(join_lab.ca_pem, relay.port), self._loop)

    async def _stall(self, ca_pem: bytes, port: int) -> None:
        self._never = asyncio.Event()

        async def nothing():
            await self._never.wait()
            for message in ():  # an async generator that never yields
                yield message

        channels = [
            aio.secure_channel(
                f"127.0.0.1:{port}",
                grpc.ssl_channel_credentials(ca_pem),
                options=[("grpc.use_local_subchannel_pool", 1), ("grpc.ssl_target_name_override", "127.0.0.1")],
            )
            for _i in range(STALL_CONNECTIONS)
        ]
        calls = []
        for channel in channels:
            await channel.channel_ready()
            method = channel.stream_unary(NONCE_PATH, request_serializer=bytes, response_deserializer=bytes)
            calls += [method(nothing(), timeout=40) for _i in range(STREAMS_PER_CONNECTION)]
        results = await asyncio.gather(*calls, return_exceptions=True)
        for result in results:
            name = result.code().name if isinstance(result, grpc.RpcError) else type(result).__name__
            self.outcomes[name] = self.outcomes.get(name, 0) + 1
        for channel in channels:
            await channel.close()

    def close(self) -> None:
        self._loop.call_soon_threadsafe(lambda: self._never.set() if self._never else None)
        try:
            self._done.result(timeout=45)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)


def test_streams_without_a_body_from_one_address_leave_genuine_joins_served(join_lab, attack, flood_figures):
    service = join_lab.start("pcrs-only", first_rpc_timeout=60.0)
    attacker = SourceRelay("127.0.0.9", ("127.0.0.1", service.port))
    genuine = SourceRelay(GENUINE, ("127.0.0.1", service.port))
    stalls = _Stalls(join_lab, attacker)
    try:
        # The attacker's streams are open (the admission saw their headers) before the genuine nodes come.
        assert wait_for(
            lambda: (
                sum(service.calls.limits.refused.values()) + service.calls.limits.in_progress()
                >= STALL_CONNECTIONS * STREAMS_PER_CONNECTION // 2
            ),
            timeout=20,
        ), dict(service.calls.limits.refused)
        latencies, failures = _genuine_joins(join_lab, service, genuine)
        held = service.calls.limits.in_progress()
        # The streams that got a place lose it once their message is late.
        released = wait_for(lambda: service.calls.limits.in_progress() == 0, timeout=15)
        left = service.calls.limits.in_progress()
    finally:
        stalls.close()
        attacker.close()
        genuine.close()
    attack.obtained("genuine joins lost to stalled streams", len(failures))
    assert failures == [] and len(latencies) == GENUINE_JOINS
    assert released, f"{left} calls without a request message kept their place"
    # One address held at most its share, and lost it once the request message did not come.
    assert service.calls.limits.refused["client"] >= STALL_CONNECTIONS * STREAMS_PER_CONNECTION - 16
    assert stalls.outcomes.get("DEADLINE_EXCEEDED", 0) + stalls.outcomes.get("RESOURCE_EXHAUSTED", 0) == (
        STALL_CONNECTIONS * STREAMS_PER_CONNECTION
    ), stalls.outcomes
    _figures(
        "stalled streams",
        flood_figures,
        latencies,
        f"{STALL_CONNECTIONS} x {STREAMS_PER_CONNECTION} streams without a body from one address "
        f"({stalls.outcomes}; {held} of them held during the joins)",
    )


def _connect_with_health(source: str, port: int, ca_pem: bytes, count: int) -> list:
    """``count`` channels (connections) from ``source``, each after one Health call, kept open."""
    channels = []
    relay = SourceRelay(source, ("127.0.0.1", port))
    for _i in range(count):
        channel = grpc.secure_channel(
            f"127.0.0.1:{relay.port}",
            grpc.ssl_channel_credentials(ca_pem),
            options=[("grpc.use_local_subchannel_pool", 1), ("grpc.ssl_target_name_override", "127.0.0.1")],
        )
        try:
            pb2_grpc.JoinServiceStub(channel).Health(pb2.HealthRequest(), timeout=10)
        except grpc.RpcError:
            pass
        channels.append(channel)
    return [relay, channels]


def test_idle_connections_of_many_addresses_leave_genuine_joins_served(join_lab, attack, flood_figures):
    service = join_lab.start("pcrs-only", health_rate=1000.0, health_burst=1000.0)
    genuine = SourceRelay(GENUINE, ("127.0.0.1", service.port))
    held = []
    try:
        started = time.monotonic()
        for source in HEALTH_ADDRESSES:
            held.append(_connect_with_health(source, service.port, join_lab.ca_pem, HEALTH_CONNECTIONS))
        seconds = time.monotonic() - started
        open_before = service.gate.open_connections
        latencies, failures = _genuine_joins(join_lab, service, genuine)
        refused = dict(service.gate.refused)
        # What the flood leaves is closed within seconds of its last call.
        closed = wait_for(lambda: service.gate.open_connections == 0, timeout=30)
    finally:
        for relay, channels in held:
            for channel in channels:
                channel.close()
            relay.close()
        genuine.close()
    attack.obtained("genuine joins lost to idle connections", len(failures))
    assert failures == [] and len(latencies) == GENUINE_JOINS, (failures, refused, open_before)
    assert closed, f"{service.gate.open_connections} connections stayed open ({refused})"
    _figures(
        "idle connections",
        flood_figures,
        latencies,
        f"{len(HEALTH_ADDRESSES)} addresses x {HEALTH_CONNECTIONS} connections with one Health call each in "
        f"{seconds:.1f} s ({open_before} open, {refused})",
    )


class _Relays:
    """One relay per source address, all on one event loop: a connection to ``port_of(source)`` on 127.0.0.1 reaches
    ``target`` from ``source``."""

    def __init__(self, sources: list[str], target: tuple[str, int]):
        self._loop = asyncio.new_event_loop()
        self._servers = {}
        for source in sources:
            self._servers[source] = self._loop.run_until_complete(
                asyncio.start_server(self._relay(source, target), "127.0.0.1", 0)
            )
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

    def port_of(self, source: str) -> int:
        return self._servers[source].sockets[0].getsockname()[1]

    @staticmethod
    def _relay(source: str, target: tuple[str, int]):
        async def relay(reader, writer) -> None:
            try:
                upstream_reader, upstream_writer = await asyncio.open_connection(*target, local_addr=(source, 0))
            except OSError:
                writer.close()
                return
            await asyncio.gather(_pump(reader, upstream_writer), _pump(upstream_reader, writer))

        return relay

    def close(self) -> None:
        for server in self._servers.values():
            self._loop.call_soon_threadsafe(server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)


STEP1_ADDRESSES = [f"127.1.{network}.1" for network in range(256)]
# The table the old rules let 256 addresses fill (one challenge per EK and address): the real one, 4,096, takes 256
# addresses naming 16 enrolled EKs each.
STEP1_TABLE = 256
STEP1_THREADS = 8


def test_step1_from_256_addresses_naming_an_enrolled_ek_leaves_genuine_joins_served(
    join_lab, start_swtpm, attack, flood_figures, monkeypatch
):
    monkeypatch.setattr(issuance, "MAX_PENDING", STEP1_TABLE)
    second = start_swtpm("lab2")
    join_lab.enrol(join_lab.swtpm.tcti, "worker-1")
    join_lab.enrol(second.tcti, "worker-2")
    service = join_lab.start(
        "ek-certificate", ticket_rate=1000.0, ticket_burst=1000.0, nonce_rate=1000.0, nonce_burst=1000.0
    )
    with issuer.Tpm(second.tcti) as tpm:
        template = issuer.issue_evidence(tpm, b"\0" * 32, b"template").to_document()
    relays = _Relays(STEP1_ADDRESSES, ("127.0.0.1", service.port))
    genuine = SourceRelay(GENUINE, ("127.0.0.1", service.port))
    stop = threading.Event()
    outcomes: collections.Counter = collections.Counter()
    peak = [0]

    def attacker(sources: list[str]) -> None:
        quoter, csr = SoftwareQuoter(template), make_csr("worker-2")
        channels = [
            grpc.secure_channel(
                f"127.0.0.1:{relays.port_of(source)}",
                grpc.ssl_channel_credentials(join_lab.ca_pem),
                options=[("grpc.use_local_subchannel_pool", 1), ("grpc.ssl_target_name_override", "127.0.0.1")],
            )
            for source in sources
        ]
        index = 0
        while not stop.is_set():
            stub = pb2_grpc.JoinServiceStub(channels[index % len(channels)])
            index += 1
            try:
                nonce = stub.GetNonce(pb2.GetNonceRequest(), timeout=10).nonce
                key = EphemeralKey.generate().public_bytes()
                evidence = json.dumps(
                    quoter.quote(nonce, bound_user_data(key, node_name="worker-2", disk_uuid=OTHER_DISK_UUID, csr=csr))
                ).encode()
                stub.IssueJoinTicket(
                    join_request("", nonce, key, "worker-2", csr=csr, disk_uuid=OTHER_DISK_UUID, evidence=evidence),
                    timeout=10,
                )
                outcomes["challenged"] += 1
            except grpc.RpcError as exc:
                outcomes[exc.code().name] += 1
            peak[0] = max(peak[0], service.issuer.pending())
        for channel in channels:
            channel.close()

    share = len(STEP1_ADDRESSES) // STEP1_THREADS
    threads = [
        threading.Thread(target=attacker, args=(STEP1_ADDRESSES[i * share : (i + 1) * share],))
        for i in range(STEP1_THREADS)
    ]
    for thread in threads:
        thread.start()
    latencies, failures = [], []
    try:
        # Every address has had its step 1 before the genuine nodes come (or the EK's share is full).
        deadline = time.monotonic() + 30
        while sum(outcomes.values()) < len(STEP1_ADDRESSES) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert outcomes["challenged"] > 0, f"the forged evidence did not pass step 1: {dict(outcomes)}"
        endpoint, service.endpoint = service.endpoint, f"127.0.0.1:{genuine.port}"
        try:
            for _i in range(GENUINE_JOINS):
                started = time.monotonic()
                try:
                    join_with_client(join_lab, service, "worker-1", attempts=1, timeout=20)
                    latencies.append(time.monotonic() - started)
                except JoinError as exc:
                    failures.append(f"{exc.reason}: {exc}")
        finally:
            service.endpoint = endpoint
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        relays.close()
        genuine.close()
    attack.obtained("genuine joins refused during the step-1 fill", len(failures))
    assert failures == [], (failures, dict(outcomes), peak[0])
    # The named EK holds its share, not the table.
    assert peak[0] <= issuance.MAX_PENDING_PER_EK + 2, f"{peak[0]} challenges waited at once"
    assert len(service.minter.tokens) == GENUINE_JOINS
    _figures(
        "step-1 fill",
        flood_figures,
        latencies,
        f"{sum(outcomes.values())} forged step-1 requests from {len(STEP1_ADDRESSES)} addresses naming an enrolled EK "
        f"({dict(outcomes)}), at most {peak[0]} challenges waiting (table {STEP1_TABLE})",
    )


def test_health_is_rate_limited_per_client(join_lab, attack):
    """Health answers before any attestation (the policy's and the enrolment's digests, their load errors): it has a
    bucket of its own per client, apart from GetNonce's."""
    service = join_lab.start("pcrs-only", health_rate=0.01, health_burst=3)
    stub, channel = join_lab.stub(service)
    answered = 0
    with channel:
        for _call in range(6):
            try:
                stub.Health(pb2.HealthRequest(), timeout=10)
                answered += 1
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc.details()
                assert dict(exc.trailing_metadata())["confidential-kubernetes-reason"] == "rate-limit"
        assert len(stub.GetNonce(pb2.GetNonceRequest(), timeout=10).nonce) == 32
    attack.obtained("Health answers beyond the client's burst", max(0, answered - 3))
    assert answered == 3
