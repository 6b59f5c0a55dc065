"""Per-peer token buckets of the join service."""

from __future__ import annotations

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._join.limits import (
    CallLimits,
    PeerLimiter,
    network_key,
    peer_key,
)


@pytest.mark.parametrize(
    "peer, key",
    [
        ("ipv4:10.0.0.5:4711", "10.0.0.5"),
        ("ipv6:[2001:db8::1]:4711", "2001:db8::/64"),
        ("ipv6:[2001:db8::ffff:1]:1", "2001:db8::/64"),
        ("ipv6:[::ffff:127.0.0.1]:50000", "127.0.0.1"),
        ("ipv6:[fe80::1%eth0]:1", "fe80::/64"),
        # What gRPC reports (brackets percent-encoded): the port must not stay in the key.
        ("ipv6:%5B::1%5D:50312", "::/64"),
        ("ipv6:%5B2001:db8::7%5D:4711", "2001:db8::/64"),
        ("ipv6:%5B::ffff:10.0.0.5%5D:4711", "10.0.0.5"),
        ("ipv6:%5Bfe80::1%25eth0%5D:1", "fe80::/64"),
        ("unix:/run/x.sock", "unix:/run/x.sock"),
    ],
)
def test_peer_keys(peer, key):
    assert peer_key(peer) == key


def test_ipv6_prefix_is_configurable():
    assert peer_key("ipv6:%5B2001:db8:0:1::7%5D:4711", 48) == "2001:db8::/48"
    assert peer_key("ipv6:%5B2001:db8:0:1::7%5D:4711", 128) == "2001:db8:0:1::7/128"


def test_new_ipv6_connections_of_one_host_share_its_bucket():
    limiter = PeerLimiter(rate=0.001, burst=2)
    assert [limiter.allow(f"ipv6:%5B::1%5D:{port}") for port in range(50000, 50004)] == [True, True, False, False]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_burst_then_rate_per_peer():
    clock = Clock()
    limiter = PeerLimiter(rate=2, burst=3, clock=clock)
    assert [limiter.allow("ipv4:10.0.0.1:1") for _i in range(4)] == [True, True, True, False]
    # Another peer has its own bucket; a new port of the same address does not.
    assert limiter.allow("ipv4:10.0.0.2:1") and not limiter.allow("ipv4:10.0.0.1:2")
    clock.now += 0.5
    assert limiter.allow("ipv4:10.0.0.1:3") and not limiter.allow("ipv4:10.0.0.1:3")
    assert limiter.refused == 3


def test_idle_peers_are_forgotten_and_the_table_is_capped():
    clock = Clock()
    limiter = PeerLimiter(rate=1, burst=1, clock=clock, max_peers=100)
    for number in range(1000):
        limiter.allow(f"ipv4:10.0.{number // 256}.{number % 256}:1")
    assert len(limiter._buckets) == 100
    clock.now += 61
    limiter.allow("ipv4:192.0.2.1:1")
    assert len(limiter._buckets) == 1


@pytest.mark.parametrize(
    "client, network",
    [
        ("10.0.0.5", "10.0.0.0/24"),
        ("10.0.7.200", "10.0.7.0/24"),
        ("2001:db8:1:2::/64", "2001:db8:1::/48"),
        ("2001:db8::/32", "2001:db8::/32"),
        ("unix:/run/x.sock", "unix:/run/x.sock"),
    ],
)
def test_network_keys(client, network):
    assert network_key(client) == network


def test_calls_in_progress_are_capped_per_client_network_and_in_all():
    calls = CallLimits(per_client=2, per_network=3, total=4)
    assert [calls.acquire("10.0.0.1") for _i in range(3)] == [None, None, "client"]
    assert [calls.acquire("10.0.0.2") for _i in range(2)] == [None, "network"]
    assert [calls.acquire("10.0.1.1"), calls.acquire("10.0.2.1")] == [None, "total"]
    calls.release("10.0.0.1")
    assert calls.acquire("10.0.0.3") is None and calls.in_progress() == 4
    for client in ("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.1.1"):
        calls.release(client)
    assert calls.in_progress() == 0 and dict(calls.refused) == {"client": 1, "network": 1, "total": 1}
