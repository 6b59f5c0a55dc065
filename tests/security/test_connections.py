"""One client cannot hold every connection of the join service (issue 25, items 1 and the IPv6 limiter key).

Against the real service (gRPC over TLS behind its connection gate, real swtpms), on loopback: 1,100 plain TCP connects
from one address (127.0.0.2, then ::1) while genuine nodes join from 127.0.0.1, and TLS connections that send only the
HTTP/2 preface. Before the gate, 1,032 connects took the service's global cap and every genuine call failed UNAVAILABLE.
"""

from __future__ import annotations

import errno
import socket
import ssl
import statistics
import time
from concurrent import futures

import grpc
import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._join import joinservice_pb2 as pb2
from ansible_collections.confidential.kubernetes.plugins.module_utils._join import joinservice_pb2_grpc as pb2_grpc
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.client import JoinError
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.limits import peer_key

from join_harness import join_with_client, wait_for

FLOOD = 1_100
PER_CLIENT = 32
GENUINE_JOINS = 6
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def _hold(family: int, source: str, port: int, count: int) -> list[socket.socket]:
    """``count`` TCP connects from ``source`` to the service, kept open, sending nothing."""
    target = "::1" if family == socket.AF_INET6 else "127.0.0.1"
    held = []
    for _i in range(count):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.bind((source, 0))
        sock.settimeout(5)
        try:
            sock.connect((target, port))
        except OSError:
            sock.close()
            continue
        sock.setblocking(False)
        held.append(sock)
    return held


def _closed_by_service(sock: socket.socket) -> bool:
    """Whether the service closed (or reset) this connection."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _genuine_joins(join_lab, service, count: int) -> tuple[list[float], list[str]]:
    latencies, failures = [], []
    for _i in range(count):
        started = time.monotonic()
        try:
            join_with_client(join_lab, service, "worker-1", attempts=1)
            latencies.append(time.monotonic() - started)
        except JoinError as exc:
            failures.append(str(exc))
    return latencies, failures


def _p99_ms(latencies: list[float]) -> int:
    ordered = sorted(latencies)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000)


@pytest.mark.parametrize(
    "family, source, listen",
    [(socket.AF_INET, "127.0.0.2", "127.0.0.1:0"), (socket.AF_INET6, "::1", "[::]:0")],
    ids=["ipv4", "ipv6"],
)
def test_one_client_holding_connections_shuts_out_no_node(join_lab, attack, flood_figures, family, source, listen):
    # The handshake timeout outlasts the genuine joins on a loaded machine: the flood holds its share while they run.
    service = join_lab.start(
        "pcrs-only",
        listen=listen,
        max_connections_per_client=PER_CLIENT,
        handshake_timeout=20.0,
        first_rpc_timeout=60.0,
    )
    service.endpoint = f"127.0.0.1:{service.port}"
    started = time.monotonic()
    held = _hold(family, source, service.port, FLOOD)
    flood_seconds = time.monotonic() - started
    try:
        assert wait_for(lambda: service.gate.refused["client-connection-limit"] >= FLOOD - PER_CLIENT, timeout=20), (
            dict(service.gate.refused)
        )
        # The attacker's connections beyond its share were closed at once; its share stays open until the timeout.
        assert wait_for(lambda: sum(not _closed_by_service(sock) for sock in held) == PER_CLIENT, timeout=10), (
            flood_seconds,
            len(held),
            sum(not _closed_by_service(sock) for sock in held),
            dict(service.gate.refused),
        )
        latencies, failures = _genuine_joins(join_lab, service, GENUINE_JOINS)
        assert sum(not _closed_by_service(sock) for sock in held) >= PER_CLIENT - 1, (
            "the genuine joins ran after the flood"
        )
        # Connections that send nothing lose their place after handshake_timeout.
        assert wait_for(lambda: all(_closed_by_service(sock) for sock in held), timeout=40), (
            "idle connections were kept"
        )
    finally:
        for sock in held:
            sock.close()
    attack.obtained("genuine joins lost to the connection flood", len(failures))
    assert failures == [] and len(latencies) == GENUINE_JOINS
    flood_figures.setdefault("connections", {})[source] = {
        "connects": FLOOD,
        "seconds": round(flood_seconds, 2),
        "refused": dict(service.gate.refused),
        "joins": len(latencies),
        "p50_ms": round(statistics.median(latencies) * 1000),
        "p99_ms": _p99_ms(latencies),
    }


def test_tls_connections_that_make_no_rpc_are_closed(join_lab, attack):
    """TLS handshake and the HTTP/2 preface, then nothing: each connection is closed after first_rpc_timeout."""
    service = join_lab.start("pcrs-only", max_connections_per_client=PER_CLIENT, first_rpc_timeout=8.0)
    context = ssl.create_default_context(cadata=join_lab.ca_pem.decode())
    context.set_alpn_protocols(["h2"])
    context.check_hostname = False
    held = []
    try:
        for _i in range(PER_CLIENT):
            raw = socket.create_connection(("127.0.0.1", service.port), timeout=5, source_address=("127.0.0.3", 0))
            tls = context.wrap_socket(raw)
            tls.sendall(HTTP2_PREFACE)
            held.append(tls)
        refused_extra = socket.create_connection(
            ("127.0.0.1", service.port), timeout=5, source_address=("127.0.0.3", 0)
        )
        held.append(refused_extra)

        def all_closed() -> bool:
            for tls in held:
                tls.settimeout(0.05)
                try:
                    while tls.recv(65536):
                        pass
                except (socket.timeout, ssl.SSLWantReadError):
                    return False
                except OSError as exc:
                    if exc.errno not in (None, errno.ECONNRESET, errno.EPIPE) and not isinstance(exc, ssl.SSLError):
                        raise
            return True

        assert wait_for(all_closed, timeout=30), "TLS connections without an RPC kept their place"
    finally:
        for sock in held:
            sock.close()
    assert (
        service.gate.refused["first-rpc-timeout"] >= PER_CLIENT and service.gate.refused["client-connection-limit"] >= 1
    )
    wait_for(lambda: service.gate.open_connections == 0, timeout=5)
    attack.obtained("connections held without an RPC", service.gate.open_connections)
    # The node that comes next is served.
    stub, channel = join_lab.stub(service)
    with channel:
        assert len(stub.GetNonce(pb2.GetNonceRequest()).nonce) == 32


def test_ipv6_clients_are_limited_per_host_not_per_connection(join_lab, attack):
    """Each new IPv6 connection used to get a fresh allowance: gRPC spells the peer ipv6:%5B::1%5D:port."""
    service = join_lab.start("pcrs-only", listen="[::]:0", nonce_rate=0.01, nonce_burst=5)
    answered = 0
    for _connection in range(4):
        channel = grpc.secure_channel(
            f"[::1]:{service.port}",
            grpc.ssl_channel_credentials(join_lab.ca_pem),
            options=[("grpc.use_local_subchannel_pool", 1), ("grpc.ssl_target_name_override", "localhost")],
        )
        with channel:
            stub = pb2_grpc.JoinServiceStub(channel)
            for _call in range(5):
                try:
                    stub.GetNonce(pb2.GetNonceRequest())
                    answered += 1
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc.details()
    attack.obtained("nonces beyond the host's burst", max(0, answered - 5))
    assert answered == 5
    # From IPv4 the service still answers: the IPv6 host's bucket is its own.
    stub, channel = join_lab.stub(service)
    with channel:
        assert len(stub.GetNonce(pb2.GetNonceRequest()).nonce) == 32


def test_the_limiter_key_of_real_grpc_peer_strings_has_no_port():
    """What gRPC itself reports for IPv6 clients, three connections of one host: one key."""
    server = grpc.server(futures.ThreadPoolExecutor(2))
    handler = grpc.method_handlers_generic_handler(
        "ck.Peer", {"Peer": grpc.unary_unary_rpc_method_handler(lambda request, context: context.peer().encode())}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("[::1]:0")
    server.start()
    peers = []
    try:
        for _i in range(3):
            with grpc.insecure_channel(f"[::1]:{port}", options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
                peers.append(channel.unary_unary("/ck.Peer/Peer")(b"").decode())
    finally:
        server.stop(None)
    assert all(peer.startswith("ipv6:%5B::1%5D:") for peer in peers), peers
    assert len(set(peers)) == 3 and {peer_key(peer) for peer in peers} == {"::/64"}


def test_many_clients_within_the_global_cap_are_all_served(join_lab):
    """The per-client cap is not a global one: clients from several addresses each get their own share."""
    service = join_lab.start("pcrs-only", max_connections_per_client=4)
    held = []
    try:
        for last in range(10, 20):
            held += _hold(socket.AF_INET, f"127.0.0.{last}", service.port, 4)
        assert len(held) == 40
        time.sleep(0.3)
        assert sum(not _closed_by_service(sock) for sock in held) == 40
        # The kernel completes connects before the gate's event loop accepts them: on a loaded machine it lags.
        assert wait_for(lambda: service.gate.open_connections >= 40, timeout=5), service.gate.open_connections
    finally:
        for sock in held:
            sock.close()
