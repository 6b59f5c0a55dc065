# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The join service's front door: TCP connections are accepted here, per client, before gRPC sees them.

gRPC's server caps connections only globally (``grpc.max_allowed_incoming_connections``): one client holding all of
them (plain connects, or TLS connections that send nothing after the HTTP/2 preface) keeps every node out. So the
service's public address belongs to this gate, which

- refuses a connection beyond ``per_client`` open ones from the same client (an IPv4 address, or an IPv6 prefix, a /64
  by default; IPv4-mapped addresses count as IPv4) and beyond ``max_connections`` in all (the backstop);
- closes a connection that sends no byte within ``handshake_timeout``, and one that has made no RPC within
  ``first_rpc_timeout`` (TLS and the HTTP/2 preface alone do not hold a place);
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

from .limits import IPV6_PREFIX, peer_key
from .log import StructuredLog

PER_CLIENT = 32
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
    peer: str
    accepted: float
    rpc_seen: bool = False
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
    ):
        self.upstream_port = upstream_port
        self.per_client = per_client
        self.max_connections = max_connections
        self.ipv6_prefix = ipv6_prefix
        self.handshake_timeout = handshake_timeout
        self.first_rpc_timeout = first_rpc_timeout
        self._log = log
        self._clock = clock
        self._open: Counter = Counter()
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

    def client_peer(self, grpc_peer: str) -> str:
        """The real client behind the servicer's ``context.peer()``, its connection marked as having made an RPC. A peer
        the gate did not forward (a local process on the loopback port) is its own client."""
        if grpc_peer.startswith("ipv4:127.0.0.1:"):
            connection = self._by_upstream.get(int(grpc_peer.rsplit(":", 1)[1]))
            if connection is not None:
                connection.rpc_seen = True
                return connection.peer
        return grpc_peer

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
        if self._total >= self.max_connections:
            self._refuse(writer, client, "connection-limit")
            return
        if self._open[client] >= self.per_client:
            self._refuse(writer, client, "client-connection-limit")
            return
        self._open[client] += 1
        self._total += 1
        connection = _Connection(client, peer, self._clock(), writers=[writer])
        self._live.add(connection)
        try:
            await self._serve(connection, reader, writer)
        finally:
            self._live.discard(connection)
            self._open[client] -= 1
            if self._open[client] <= 0:
                del self._open[client]
            self._total -= 1
            connection.close()

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
        """Close connections that made no RPC within ``first_rpc_timeout`` of their accept."""
        while True:
            await asyncio.sleep(SWEEP_INTERVAL)
            deadline = self._clock() - self.first_rpc_timeout
            for connection in list(self._live):
                if not connection.rpc_seen and connection.accepted < deadline:
                    self.refused["first-rpc-timeout"] += 1
                    connection.close()
                    # Marked, so that a connection still closing is not counted twice.
                    connection.rpc_seen = True


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
