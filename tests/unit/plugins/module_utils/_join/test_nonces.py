"""The join service's nonce store: the attestation NonceStore's rules, bounded, with amortised expiry."""

from __future__ import annotations

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.verifier import VerificationError
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.nonces import NonceLimitError, ServiceNonceStore


class Clock:
    def __init__(self):
        self.now = 5000.0

    def __call__(self):
        return self.now


def _reason(store, nonce):
    with pytest.raises(VerificationError) as err:
        store.consume(nonce)
    return err.value.reason


def test_single_use_and_expiry_as_in_the_attestation_store():
    clock = Clock()
    store = ServiceNonceStore(ttl=60, clock=clock)
    nonce = store.issue()
    store.consume(nonce)
    assert _reason(store, nonce) == "nonce-reused"
    late = store.issue()
    clock.now += 61
    assert _reason(store, late) == "nonce-stale"
    assert _reason(store, b"\x00" * 32) == "nonce-unknown"


def test_sweep_runs_at_most_once_a_second_and_forgets_after_two_lifetimes():
    clock = Clock()
    store = ServiceNonceStore(ttl=60, clock=clock)
    old = store.issue()
    clock.now += 121
    store.issue()  # sweeps: the old nonce is forgotten
    assert len(store._memory) == 1
    assert _reason(store, old) == "nonce-unknown"
    kept = store.issue()
    clock.now += 121.5
    store.issue()
    assert len(store._memory) == 1 and kept.hex() not in store._memory


def test_outstanding_nonces_are_bounded():
    store = ServiceNonceStore(ttl=60, max_outstanding=3)
    nonces = [store.issue() for _i in range(3)]
    with pytest.raises(NonceLimitError, match="limit 3"):
        store.issue()
    store.consume(nonces[0])  # consumed nonces still count until they expire: replays stay detectable
    with pytest.raises(NonceLimitError):
        store.issue()
