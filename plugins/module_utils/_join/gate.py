# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The join service's front door: TCP connections are accepted here, per client, before gRPC sees them.

gRPC's server caps connections only globally (``grpc.max_allowed_incoming_connections``): one client holding all of
them (plain connects, or TLS connections that send nothing after the HTTP/2 preface) keeps every node out. So the
service's public address belongs to this gate, which

- refuses a connection beyond ``per_client`` open ones from the same client (an IPv4 address, or an IPv6 prefix, a /64
  by default; IPv4-mapped addresses count as IPv4) and beyond ``per_network`` from its network (a /24, an IPv6 /48);
- at ``max_connections`` in all, closes the oldest idle connection (no call in progress) of the client holding the
  most, and refuses the new one only when no connection is idle;
- closes a connection that sends no byte within ``handshake_timeout``, one that has made no RPC within
  ``first_rpc_timeout`` (TLS and the HTTP/2 preface alone do not hold a place, nor do streams whose request message
  never arrives), and one with no call in progress for ``idle_timeout`` after its last RPC;
- splices each admitted connection, bytes unchanged (TLS ends in gRPC), to the gRPC server on loopback, and tells the
  servicer which real client each upstream connection carries (``client_peer``), for the per-client rate limits.

Refusals are counted and logged at most once per ``LOG_INTERVAL``, not once per connection.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections import Counter
from dataclasses import dataclass, field

from .limits import IPV6_PREFIX, network_key, peer_key
from .log import StructuredLog

PER_CLIENT = 32
PER_NETWORK = 128
IDLE_TIMEOUT = 15.0
HANDSHAKE_TIMEOUT = 5.0
FIRST_RPC_TIMEOUT = 10.0
LOG_INTERVAL = 10.0
BACKLOG = 4096
CHUNK = 64 * 1024
SWEEP_INTERVAL = 0.5


def grpc_style_peer(address: tuple) -> str:
    """A socket's peer address in gRPC's spelling: 'ipv4:10.0.0.5:4711', 'ipv6:%5B2001:db8::1%5D:4711'."""
    host, port = address[0], address[1]
    if ":" in host:
        return f"ipv6:%5B{host}%5D:{port}"
    return f"ipv4:{host}:{port}"


@dataclass(eq=False)
class _Connection:
    client: str
    network: str
    peer: str
    accepted: float
    rpc_seen: bool = False
    # Calls in progress on this connection, and when the last one ended (or the connection was accepted).
    calls: int = 0
    last_active: float = 0.0
    evicted: bool = False
    writers: list = field(default_factory=list)

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


class ConnectionGate:
    """Accepts on the public address and forwards to ``upstream_port`` on 127.0.0.1 (``clock`` is a seam for tests)."""

    def __init__(
        self,
        upstream_port: int,
        log: StructuredLog,
        per_client: int = PER_CLIENT,
        max_connections: int = 1024,
        ipv6_prefix: int = IPV6_PREFIX,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
        first_rpc_timeout: float = FIRST_RPC_TIMEOUT,
        clock=time.monotonic,
        per_network: int = PER_NETWORK,
        idle_timeout: float = IDLE_TIMEOUT,
    ):
        self.upstream_port = upstream_port
        self.per_client = per_client
        self.per_network = per_network
        self.idle_timeout = idle_timeout
        self.max_connections = max_connections
        self.ipv6_prefix = ipv6_prefix
        self.handshake_timeout = handshake_timeout
        self.first_rpc_timeout = first_rpc_timeout
        self._log = log
        self._clock = clock
        self._open: Counter = Counter()
        self._open_network: Counter = Counter()
        self._total = 0
        # Upstream local port -> the client connection it carries.
        self._by_upstream: dict[int, _Connection] = {}
        self._live: set[_Connection] = set()
        self.refused: Counter = Counter()
        self._logged = 0.0
        self._server: asyncio.base_events.Server | None = None
        self._sweeper: asyncio.Task | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (port 0: any); the port it listens on."""
        host = host.strip("[]")
        if host == "::":
            # Both address families on one socket, as gRPC listens on [::] (asyncio's own would be IPv6 only).
            listener = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("::", port))
            self._server = await asyncio.start_server(self._accept, sock=listener, backlog=BACKLOG)
        else:
            self._server = await asyncio.start_server(self._accept, host, port, backlog=BACKLOG, reuse_address=True)
        self._sweeper = asyncio.ensure_future(self._sweep())
        return self._server.sockets[0].getsockname()[1]

    async def stop_accepting(self) -> None:
        """No new connection; those open go on (joins in flight finish)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()

    async def close(self) -> None:
        await self.stop_accepting()
        for connection in list(self._live):
            connection.close()

    def _upstream(self, grpc_peer: str) -> _Connection | None:
        if grpc_peer.startswith("ipv4:127.0.0.1:"):
            return self._by_upstream.get(int(grpc_peer.rsplit(":", 1)[1]))
        return None

    def client_peer(self, grpc_peer: str) -> str:
        """The real client behind the servicer's ``context.peer()``, its connection marked as having made an RPC. A peer
        the gate did not forward (a local process on the loopback port) is its own client."""
        connection = self._upstream(grpc_peer)
        if connection is None:
            return grpc_peer
        connection.rpc_seen = True
        return connection.peer

    def call_started(self, grpc_peer: str) -> str:
        """A call opened on the connection behind ``grpc_peer`` (its request message not yet read, so it is no RPC yet);
        returns the real client's peer. Pair with ``call_ended``."""
        connection = self._upstream(grpc_peer)
        if connection is None:
            return grpc_peer
        connection.calls += 1
        return connection.peer

    def call_ended(self, grpc_peer: str) -> None:
        connection = self._upstream(grpc_peer)
        if connection is not None:
            connection.calls = max(0, connection.calls - 1)
            connection.last_active = self._clock()

    @property
    def open_connections(self) -> int:
        return self._total

    def _refuse(self, writer: asyncio.StreamWriter, client: str, reason: str) -> None:
        self.refused[reason] += 1
        writer.transport.abort()
        now = self._clock()
        if now - self._logged >= LOG_INTERVAL:
            self._logged = now
            self._log.warning(
                "connection",
                result="refused",
                reason=reason,
                client=client,
                open_from_client=self._open[client],
                open_total=self._total,
                per_client=self.per_client,
                refused_total=dict(self.refused),
            )

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        address = writer.get_extra_info("peername")
        peer = grpc_style_peer(address)
        client = peer_key(peer, self.ipv6_prefix)
        network = network_key(client)
        if self._open[client] >= self.per_client:
            self._refuse(writer, client, "client-connection-limit")
            return
        if self._open_network[network] >= self.per_network:
            self._refuse(writer, client, "network-connection-limit")
            return
        if self._total >= self.max_connections and not self._evict_idle():
            self._refuse(writer, client, "connection-limit")
            return
        self._open[client] += 1
        self._open_network[network] += 1
        self._total += 1
        now = self._clock()
        connection = _Connection(client, network, peer, now, last_active=now, writers=[writer])
        self._live.add(connection)
        try:
            await self._serve(connection, reader, writer)
        finally:
            self._live.discard(connection)
            self._open[client] -= 1
            if self._open[client] <= 0:
                del self._open[client]
            self._open_network[network] -= 1
            if self._open_network[network] <= 0:
                del self._open_network[network]
            self._total -= 1
            connection.close()

    def _evict_idle(self) -> bool:
        """At the global cap: close the oldest idle connection (no call in progress) of the client holding the most, so
        that no set of clients keeps the service full with connections it does not use. False when none is idle."""
        idle = [connection for connection in self._live if connection.calls == 0 and not connection.evicted]
        if not idle:
            return False
        victim = min(idle, key=lambda connection: (-self._open[connection.client], connection.last_active))
        victim.evicted = True
        self.refused["evicted-idle"] += 1
        victim.close()
        return True

    async def _serve(self, connection: _Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            first = await asyncio.wait_for(reader.read(CHUNK), self.handshake_timeout)
        except (asyncio.TimeoutError, OSError):
            self.refused["handshake-timeout"] += 1
            return
        if not first:
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError as exc:
            self._log.error("connection", result="error", reason="upstream", msg=str(exc))
            return
        connection.writers.append(upstream_writer)
        local_port = upstream_writer.get_extra_info("sockname")[1]
        upstream_writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._by_upstream[local_port] = connection
        try:
            upstream_writer.write(first)
            await asyncio.gather(_pump(reader, upstream_writer), _pump(upstream_reader, writer))
        finally:
            self._by_upstream.pop(local_port, None)

    async def _sweep(self) -> None:
        """Close connections that made no RPC within ``first_rpc_timeout`` of their accept, and those with no call in
        progress for ``idle_timeout`` after their last one."""
        while True:
            await asyncio.sleep(SWEEP_INTERVAL)
            now = self._clock()
            for connection in list(self._live):
                if connection.evicted:
                    continue
                if not connection.rpc_seen and connection.accepted < now - self.first_rpc_timeout:
                    reason = "first-rpc-timeout"
                elif connection.rpc_seen and connection.calls == 0 and connection.last_active < now - self.idle_timeout:
                    reason = "idle-timeout"
                else:
                    continue
                self.refused[reason] += 1
                # Marked, so that a connection still closing is not counted twice.
                connection.evicted = True
                connection.close()


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while True:
            chunk = await source.read(CHUNK)
            if not chunk:
                break
            sink.write(chunk)
            await sink.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        sink.close()
