"""The nonce store: single use, expiry, a cap on remembered nonces, O(1) expiry, and the ledger shared by processes."""

from __future__ import annotations

import os
import threading

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.nonces import (
    COMPACT_AFTER,
    MAX_LEDGER_ENTRIES,
    MAX_OUTSTANDING,
    RECORD_BYTES,
    NonceLimitError,
    NonceStore,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.verifier import VerificationError


class Clock:
    def __init__(self):
        self.now = 5000.0

    def __call__(self):
        return self.now


def _reason(store, nonce):
    with pytest.raises(VerificationError) as err:
        store.consume(nonce)
    return err.value.reason


@pytest.fixture(params=["memory", "ledger"])
def make_store(request, tmp_path):
    def make(**options):
        if request.param == "ledger":
            options["path"] = str(tmp_path / "nonce-ledger")
        return NonceStore(**options)

    return make


def test_single_use_stale_and_unknown(make_store):
    clock = Clock()
    store = make_store(ttl=60, clock=clock)
    nonce = store.issue()
    assert len(nonce) == 32
    store.consume(nonce)
    assert _reason(store, nonce) == "nonce-reused"
    late = store.issue()
    clock.now += 61
    assert _reason(store, late) == "nonce-stale"
    assert _reason(store, os.urandom(32)) == "nonce-unknown"
    assert _reason(store, b"short") == "nonce-unknown"


def test_a_nonce_is_forgotten_two_lifetimes_after_its_issue_and_not_before(make_store):
    clock = Clock()
    store = make_store(ttl=60, clock=clock)
    first = store.issue()
    clock.now += 10
    second = store.issue()
    store.consume(second)
    clock.now += 110  # first: 120 s old, second: 110 s
    assert store.remembered() == 2
    clock.now += 0.5
    assert store.remembered() == 1
    assert _reason(store, first) == "nonce-unknown"
    assert _reason(store, second) == "nonce-reused"  # a replay is still named as one
    clock.now += 10
    assert store.remembered() == 0


def test_the_number_of_remembered_nonces_is_capped_until_they_expire(make_store):
    clock = Clock()
    store = make_store(ttl=60, clock=clock, max_outstanding=3)
    nonces = [store.issue() for _i in range(3)]
    with pytest.raises(NonceLimitError, match=r"3 nonces .* \(limit 3\)"):
        store.issue()
    store.consume(nonces[0])  # consumed nonces count until they expire: replays stay detectable
    with pytest.raises(NonceLimitError):
        store.issue()
    store.consume(nonces[1])  # a full store still consumes
    clock.now += 121
    assert len(store.issue()) == 32


def test_default_caps():
    assert NonceStore().max_outstanding == MAX_OUTSTANDING
    assert NonceStore(path="/nonexistent/ledger.json").max_outstanding == MAX_LEDGER_ENTRIES < MAX_OUTSTANDING


class CountingEntry(dict):
    """An entry that counts how often its issue time is read."""

    reads = 0

    def __getitem__(self, key):
        if key == "issued":
            CountingEntry.reads += 1
        return super().__getitem__(key)


def test_expiry_reads_only_the_expired_entries_and_one_more():
    clock = Clock()
    store = NonceStore(ttl=60, clock=clock)
    for index in range(2000):
        clock.now += 0.01 if index else 0
        store.issue()
    memory = store._memory.entries
    for key in list(memory):
        memory[key] = CountingEntry(memory[key])
    CountingEntry.reads = 0
    clock.now = 5000 + 120.205  # the first 21 nonces are now older than two lifetimes
    store.issue()
    assert 15 <= 2001 - len(memory) <= 25
    assert CountingEntry.reads == 2001 - len(memory) + 1
    CountingEntry.reads = 0
    store.issue()
    assert CountingEntry.reads <= 1


def test_ledger_keeps_single_use_across_restarts_and_is_private(tmp_path):
    path = str(tmp_path / "nonce-ledger")
    nonce = NonceStore(path=path).issue()
    NonceStore(path=path).consume(nonce)
    assert _reason(NonceStore(path=path), nonce) == "nonce-reused"
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"


def test_ledger_file_cuts_expired_records_once_they_are_many(tmp_path):
    path = tmp_path / "nonce-ledger"
    clock = Clock()
    store = NonceStore(ttl=60, path=str(path), clock=clock)
    few = [store.issue() for _i in range(5)]
    clock.now += 121
    store.issue()
    assert store.remembered() == 1
    assert _reason(store, few[0]) == "nonce-unknown"
    assert path.stat().st_size == 6 * RECORD_BYTES  # a few expired records stay until they are worth a rewrite
    many = [store.issue() for _i in range(COMPACT_AFTER)]
    clock.now += 121
    kept = store.issue()
    assert path.read_bytes().split() == [kept.hex().encode(), f"{clock.now:017.6f}".encode(), b"i"]
    assert _reason(store, many[-1]) == "nonce-unknown"
    store.consume(kept)


def test_ledger_issue_times_never_decrease_when_the_clock_steps_back(tmp_path):
    clock = Clock()
    store = NonceStore(ttl=60, path=str(tmp_path / "nonce-ledger"), clock=clock)
    first = store.issue()
    clock.now -= 100
    second = store.issue()
    clock.now += 30
    assert store.remembered() == 2
    store.consume(first)
    store.consume(second)  # issued "at" the first one's time: not stale 30 s later
    issued = [float(line.split()[1]) for line in (tmp_path / "nonce-ledger").read_bytes().splitlines()]
    assert issued == sorted(issued)


def test_ledger_record_cut_short_by_a_crash_is_dropped(tmp_path):
    path = tmp_path / "nonce-ledger"
    store = NonceStore(path=str(path))
    nonce = store.issue()
    with open(path, "ab") as handle:
        handle.write(b"0123abc")
    store.consume(nonce)
    assert path.stat().st_size == RECORD_BYTES
    assert _reason(store, nonce) == "nonce-reused"


@pytest.mark.parametrize(
    "content", ["not json", "[1, 2]", '{"ab": 1, "cd": {"issued": "yesterday", "used": false}}', "x" * RECORD_BYTES * 3]
)
def test_unreadable_ledger_starts_empty_and_refuses_its_nonces(tmp_path, content):
    path = tmp_path / "nonce-ledger"
    path.write_text(content)
    store = NonceStore(path=str(path))
    assert _reason(store, bytes.fromhex("ab" * 32)) == "nonce-unknown"
    assert len(store.issue()) == 32
    assert path.stat().st_size == RECORD_BYTES


def test_ledger_shared_by_concurrent_users_consumes_each_nonce_once(tmp_path):
    """Separate stores (as separate task processes have) on one ledger: flock serialises them."""
    path = str(tmp_path / "nonce-ledger")
    issued: list[bytes] = []
    lock = threading.Lock()

    def issue_some():
        store = NonceStore(path=path)
        mine = [store.issue() for _i in range(25)]
        with lock:
            issued.extend(mine)

    threads = [threading.Thread(target=issue_some) for _i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert os.stat(path).st_size == 100 * RECORD_BYTES and len(set(issued)) == 100
    outcomes: list[str] = []

    def consume_all():
        store = NonceStore(path=path)
        for nonce in issued:
            try:
                store.consume(nonce)
                outcome = "ok"
            except VerificationError as exc:
                outcome = exc.reason
            with lock:
                outcomes.append(outcome)

    threads = [threading.Thread(target=consume_all) for _i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes.count("ok") == 100
    assert outcomes.count("nonce-reused") == 200
