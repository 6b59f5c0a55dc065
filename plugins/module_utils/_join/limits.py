# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Per-peer rate limits of the join service: one token bucket per client address and kind of request.

A peer is an IPv4 address or an IPv6 prefix (a /64 by default); IPv4-mapped IPv6 addresses count as
their IPv4 address. Buckets of peers idle for a minute are dropped, and at most ``max_peers`` are kept (the longest
idle go first), so a spray of source addresses cannot grow the table without bound.
"""

from __future__ import annotations

import ipaddress
import time
import urllib.parse
from collections import Counter, OrderedDict

MAX_PEERS = 65_536
IDLE_SECONDS = 60.0
# One host usually owns a whole /64.
IPV6_PREFIX = 64
# The second level: clients of one network share its caps.
NETWORK_IPV4_PREFIX = 24
NETWORK_IPV6_PREFIX = 48


def peer_key(peer: str, ipv6_prefix: int = IPV6_PREFIX) -> str:
    """'ipv4:10.0.0.5:4711' -> '10.0.0.5'; 'ipv6:%5B2001:db8::1%5D:4711' (gRPC's form) or 'ipv6:[2001:db8::1]:4711'
    -> '2001:db8::/64' (``ipv6_prefix``); anything else as given."""
    kind, dummy, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rsplit(":", 1)[0]
    if kind == "ipv6":
        # gRPC percent-encodes the brackets; the port follows the closing one.
        host = urllib.parse.unquote(rest).rsplit(":", 1)[0]
        if not (host.startswith("[") and host.endswith("]")):
            return peer
        try:
            address = ipaddress.IPv6Address(host[1:-1].split("%", 1)[0])
        except ValueError:
            return peer
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network(f"{address}/{ipv6_prefix}", strict=False))
    return peer


def network_key(client: str) -> str:
    """The network a client key belongs to, for the second-level caps: an IPv4 address's /24, an IPv6 prefix's /48
    (a key that is neither is its own network)."""
    try:
        if "/" in client:
            network = ipaddress.IPv6Network(client, strict=False)
            return str(network.supernet(new_prefix=min(network.prefixlen, NETWORK_IPV6_PREFIX)))
        return str(ipaddress.IPv4Network(f"{client}/{NETWORK_IPV4_PREFIX}", strict=False))
    except ValueError:
        return client


class PeerLimiter:
    """``rate`` requests per second with bursts of ``burst`` for each peer (``clock`` is a seam for tests)."""

    def __init__(
        self,
        rate: float,
        burst: float,
        clock=time.monotonic,
        max_peers: int = MAX_PEERS,
        ipv6_prefix: int = IPV6_PREFIX,
    ):
        self.rate = rate
        self.ipv6_prefix = ipv6_prefix
        self.burst = burst
        self._clock = clock
        self._max_peers = max_peers
        self._buckets: OrderedDict[str, list[float]] = OrderedDict()
        self.refused = 0

    def allow(self, peer: str) -> bool:
        now = self._clock()
        key = peer_key(peer, self.ipv6_prefix)
        bucket = self._buckets.pop(key, None)
        if bucket is None:
            bucket = [self.burst, now]
        tokens = min(self.burst, bucket[0] + (now - bucket[1]) * self.rate)
        allowed = tokens >= 1.0
        bucket[0], bucket[1] = (tokens - 1.0 if allowed else tokens), now
        # Most recently seen last: the oldest entries are the idle ones.
        self._buckets[key] = bucket
        self._prune(now)
        if not allowed:
            self.refused += 1
        return allowed

    def _prune(self, now: float) -> None:
        while self._buckets:
            key, oldest = next(iter(self._buckets.items()))
            if len(self._buckets) <= self._max_peers and now - oldest[1] < IDLE_SECONDS:
                break
            del self._buckets[key]


class CallLimits:
    """Calls in progress, per client key, per network (``network_key``) and in all: one address, or one /24, cannot take
    the server's whole ``max_concurrent_rpcs``. Used on the service's event loop only."""

    def __init__(self, per_client: int, per_network: int, total: int):
        self.per_client = per_client
        self.per_network = per_network
        self.total = total
        self._clients: Counter = Counter()
        self._networks: Counter = Counter()
        self._total = 0
        self.refused: Counter = Counter()

    def acquire(self, client: str) -> str | None:
        """Take a place for a call of ``client``; None when taken (pair with ``release``), else the cap it met."""
        network = network_key(client)
        if self._clients[client] >= self.per_client:
            refused = "client"
        elif self._networks[network] >= self.per_network:
            refused = "network"
        elif self._total >= self.total:
            refused = "total"
        else:
            self._clients[client] += 1
            self._networks[network] += 1
            self._total += 1
            return None
        self.refused[refused] += 1
        return refused

    def release(self, client: str) -> None:
        network = network_key(client)
        for counter, key in ((self._clients, client), (self._networks, network)):
            counter[key] -= 1
            if counter[key] <= 0:
                del counter[key]
        self._total -= 1

    def in_progress(self, client: str | None = None) -> int:
        return self._total if client is None else self._clients[client]
