"""The connection gate on loopback, in front of a plain TCP upstream: caps per client and per network, eviction of idle
connections at the global cap, the idle timeout after the last call (issue 36)."""

from __future__ import annotations

import asyncio
import io

from ansible_collections.confidential.kubernetes.plugins.module_utils._join.gate import ConnectionGate
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.log import StructuredLog


async def _upstream() -> tuple[asyncio.base_events.Server, int]:
    async def swallow(reader, writer) -> None:
        while await reader.read(65536):
            pass
        writer.close()

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _connect(port: int, source: str):
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    writer.write(b"x")
    await writer.drain()
    return reader, writer


async def _closed(reader: asyncio.StreamReader, timeout: float = 2.0) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), timeout) == b""
    except asyncio.TimeoutError:
        return False
    except OSError:
        return True


def _gate(upstream_port: int, **settings) -> ConnectionGate:
    return ConnectionGate(upstream_port, StructuredLog(io.StringIO()), **settings)


def test_at_the_global_cap_the_biggest_holders_oldest_idle_connection_makes_room():
    async def scenario() -> None:
        upstream, upstream_port = await _upstream()
        gate = _gate(upstream_port, per_client=8, max_connections=4)
        port = await gate.start("127.0.0.1", 0)
        try:
            held = [await _connect(port, "127.0.0.2") for _i in range(3)]
            other = await _connect(port, "127.0.1.2")
            await asyncio.sleep(0.2)
            assert gate.open_connections == 4
            # One of 127.0.0.2's connections has a call in progress: it is not idle.
            busy = next(iter(c for c in gate._live if c.client == "127.0.0.2"))
            busy.calls = 1
            newcomer = await _connect(port, "127.0.2.2")
            await asyncio.sleep(0.2)
            assert gate.refused["evicted-idle"] == 1 and gate.refused["connection-limit"] == 0
            closed = [await _closed(reader, 0.5) for reader, _writer in held]
            assert sum(closed) == 1 and not await _closed(other[0], 0.2) and not await _closed(newcomer[0], 0.2)
            # Nothing idle left to take: the next one is refused.
            for connection in gate._live:
                connection.calls = 1
            refused = await _connect(port, "127.0.3.2")
            assert await _closed(refused[0]) and gate.refused["connection-limit"] == 1
        finally:
            await gate.close()
            upstream.close()

    asyncio.run(scenario())


def test_a_network_holds_at_most_its_share():
    async def scenario() -> None:
        upstream, upstream_port = await _upstream()
        gate = _gate(upstream_port, per_client=2, per_network=3)
        port = await gate.start("127.0.0.1", 0)
        try:
            kept = [await _connect(port, source) for source in ("127.0.5.1", "127.0.5.1", "127.0.5.2")]
            refused = await _connect(port, "127.0.5.3")
            elsewhere = await _connect(port, "127.0.6.1")
            assert await _closed(refused[0]) and gate.refused["network-connection-limit"] == 1
            closed = [await _closed(reader, 0.2) for reader, _writer in kept + [elsewhere]]
            assert not any(closed)
        finally:
            await gate.close()
            upstream.close()

    asyncio.run(scenario())


def test_a_connection_is_closed_when_idle_after_its_last_call():
    async def scenario() -> None:
        upstream, upstream_port = await _upstream()
        gate = _gate(upstream_port, idle_timeout=0.5, first_rpc_timeout=30.0)
        port = await gate.start("127.0.0.1", 0)
        try:
            idle, busy = await _connect(port, "127.0.0.7"), await _connect(port, "127.0.0.8")
            await asyncio.sleep(0.2)
            for connection in gate._live:
                connection.rpc_seen = True
                connection.calls = 1 if connection.client == "127.0.0.8" else 0
                connection.last_active = gate._clock()
            assert await _closed(idle[0], 3.0) and gate.refused["idle-timeout"] == 1
            assert not await _closed(busy[0], 0.5)
        finally:
            await gate.close()
            upstream.close()

    asyncio.run(scenario())


def test_a_call_whose_message_never_came_is_no_rpc():
    """Streams that sent headers only: their connection is closed at first_rpc_timeout as one that made no RPC."""

    async def scenario() -> None:
        upstream, upstream_port = await _upstream()
        gate = _gate(upstream_port, first_rpc_timeout=0.5)
        port = await gate.start("127.0.0.1", 0)
        try:
            stalled, served = await _connect(port, "127.0.0.7"), await _connect(port, "127.0.0.8")
            await asyncio.sleep(0.2)
            for local_port, connection in gate._by_upstream.items():
                peer = f"ipv4:127.0.0.1:{local_port}"
                assert gate.call_started(peer) == connection.peer
                if connection.client == "127.0.0.8":
                    gate.client_peer(peer)
            assert await _closed(stalled[0], 3.0) and gate.refused["first-rpc-timeout"] == 1
            assert not await _closed(served[0], 0.5)
        finally:
            await gate.close()
            upstream.close()

    asyncio.run(scenario())
