"""The join service's stateless nonces: a MAC over issue time and random bytes; only used nonces are remembered."""

from __future__ import annotations

import struct
import threading

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.nonces import NonceLimitError
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.verifier import VerificationError
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.nonces import MacNonces


class Clock:
    def __init__(self):
        self.now = 1_700_000_000.0

    def __call__(self):
        return self.now


def _reason(call) -> str:
    with pytest.raises(VerificationError) as err:
        call()
    return err.value.reason


def test_layout_is_issue_time_random_and_mac():
    clock = Clock()
    nonce = MacNonces(clock=clock).issue()
    assert len(nonce) == 32 and struct.unpack(">Q", nonce[:8])[0] == int(clock.now * 1000)


def test_issuing_remembers_nothing():
    nonces = MacNonces()
    issued = {nonces.issue() for _i in range(10_000)}
    assert len(issued) == 10_000 and nonces.used() == 0


def test_a_nonce_is_used_once():
    nonces = MacNonces()
    nonce = nonces.issue()
    nonces.check(nonce)
    nonces.check(nonce)  # checking does not use it
    nonces.consume(nonce)
    assert nonces.used() == 1
    assert _reason(lambda: nonces.consume(nonce)) == "nonce-reused"
    assert _reason(lambda: nonces.check(nonce)) == "nonce-reused"


@pytest.mark.parametrize("tamper", ["issue time", "random bytes", "MAC", "length"])
def test_a_nonce_this_service_did_not_issue_is_unknown(tamper):
    nonces = MacNonces()
    nonce = bytearray(nonces.issue())
    if tamper == "issue time":
        nonce[7] ^= 1
    elif tamper == "random bytes":
        nonce[10] ^= 1
    elif tamper == "MAC":
        nonce[-1] ^= 1
    else:
        nonce = nonce[:31]
    assert _reason(lambda: nonces.consume(bytes(nonce))) == "nonce-unknown"


def test_another_service_or_a_restart_does_not_know_the_nonce():
    assert _reason(lambda: MacNonces().consume(MacNonces().issue())) == "nonce-unknown"


def test_expiry_and_used_nonces_are_forgotten_once_expired():
    clock = Clock()
    nonces = MacNonces(ttl=60, clock=clock)
    used, late = nonces.issue(), nonces.issue()
    nonces.consume(used)
    clock.now += 61
    assert _reason(lambda: nonces.consume(late)) == "nonce-stale"
    # Past its lifetime a used nonce is stale anyway: it is no longer remembered.
    assert nonces.used() == 0 and _reason(lambda: nonces.consume(used)) == "nonce-stale"


def test_racing_requests_use_a_nonce_exactly_once():
    nonces = MacNonces()
    nonce = nonces.issue()
    outcomes = []
    barrier = threading.Barrier(8)

    def use():
        barrier.wait()
        try:
            nonces.consume(nonce)
            outcomes.append("used")
        except VerificationError as exc:
            outcomes.append(exc.reason)

    threads = [threading.Thread(target=use) for _i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["nonce-reused"] * 7 + ["used"]


def test_used_nonces_are_capped():
    nonces = MacNonces(max_used=2)
    nonces.consume(nonces.issue())
    nonces.consume(nonces.issue())
    with pytest.raises(NonceLimitError):
        nonces.consume(nonces.issue())
