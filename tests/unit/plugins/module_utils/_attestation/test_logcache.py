"""The verifier's parsed-log cache: bounded in slots and bytes, one slot per node (attestation key), so that no node
can evict another node that still attests; and the TPM verifier uses it keyed by the AK that signed the quote."""

from __future__ import annotations

import os
import threading

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import eventlog as el
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import issuer, logcache, tpm2
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import tpm_variant
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import (
    MeasurementPolicy,
    PcrRule,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.verifier import (
    VerificationError,
    Verifier,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.seal import EphemeralKey
from eventlogs import extend_into, firmware_log, gce_like_events, gce_like_log


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Maker:
    """Counts what the cache had to make (a parse and replay, in the verifier)."""

    def __init__(self):
        self.made: list[bytes] = []

    def __call__(self, raw: bytes):
        self.made.append(raw)
        return ("parsed", raw)


def _log(number: int, size: int = 100) -> bytes:
    return number.to_bytes(4, "big") * (size // 4)


def test_a_node_sending_the_same_log_is_served_from_its_slot():
    cache, make = logcache.LogCache(), Maker()
    assert cache.get(b"node-a", _log(1), make) == ("parsed", _log(1))
    assert cache.get(b"node-a", _log(1), make) == ("parsed", _log(1))
    assert make.made == [_log(1)]


def test_an_entry_is_served_only_for_the_exact_bytes_it_was_made_from():
    cache, make = logcache.LogCache(), Maker()
    cache.get(b"node-a", _log(1), make)
    changed = _log(1)[:-1] + b"\xff"
    assert cache.get(b"node-a", changed, make) == ("parsed", changed)
    assert make.made == [_log(1), changed]


def test_a_node_sending_many_logs_replaces_only_its_own_slot():
    cache, make = logcache.LogCache(max_slots=4, max_bytes=10_000), Maker()
    cache.get(b"node-a", _log(1), make)
    for number in range(2, 200):
        cache.get(b"node-b", _log(number), make)
    assert len(cache) == 2 and cache.bytes == 200
    made = len(make.made)
    cache.get(b"node-a", _log(1), make)
    assert len(make.made) == made, "node-b's logs evicted node-a's entry"


def test_the_cache_holds_at_most_its_slots_and_a_new_node_does_not_evict_a_live_one():
    clock = Clock()
    cache, make = logcache.LogCache(max_slots=3, max_bytes=10_000, idle_seconds=60, clock=clock), Maker()
    for node in range(3):
        cache.get(b"node-%d" % node, _log(node), make)
    for newcomer in range(3, 50):
        # verified (made) every time, never cached: every slot is held by a node attesting within idle_seconds
        assert cache.get(b"node-%d" % newcomer, _log(newcomer), make) == ("parsed", _log(newcomer))
    assert len(cache) == 3
    assert all(b"node-%d" % node in cache for node in range(3))
    made = len(make.made)
    for node in range(3):
        cache.get(b"node-%d" % node, _log(node), make)
    assert len(make.made) == made


def test_the_cache_holds_at_most_its_bytes():
    clock = Clock()
    cache, make = logcache.LogCache(max_slots=100, max_bytes=1000, idle_seconds=60, clock=clock), Maker()
    for node in range(20):
        cache.get(b"node-%d" % node, _log(node, 300), make)
        assert cache.bytes <= 1000
    assert len(cache) == 3 and cache.bytes == 900
    # one log larger than the whole budget is verified but never cached, and evicts nobody
    cache.get(b"node-big", _log(99, 2000), make)
    assert len(cache) == 3 and b"node-big" not in cache


def test_a_node_that_stopped_attesting_gives_its_slot_to_a_new_node():
    clock = Clock()
    cache, make = logcache.LogCache(max_slots=2, max_bytes=10_000, idle_seconds=60, clock=clock), Maker()
    cache.get(b"node-a", _log(1), make)
    cache.get(b"node-b", _log(2), make)
    clock.now += 30
    cache.get(b"node-b", _log(2), make)  # node-b attests again; node-a does not
    clock.now += 40
    cache.get(b"node-c", _log(3), make)
    assert b"node-a" not in cache and b"node-b" in cache and b"node-c" in cache
    assert len(cache) == 2


def test_a_log_that_fails_to_parse_leaves_the_nodes_entry():
    cache, make = logcache.LogCache(), Maker()
    cache.get(b"node-a", _log(1), make)

    def refuse(raw: bytes):
        raise el.EventLogError("event 1 (offset 65) is truncated")

    with pytest.raises(el.EventLogError):
        cache.get(b"node-a", _log(2), refuse)
    made = len(make.made)
    cache.get(b"node-a", _log(1), make)
    assert len(make.made) == made


def test_threads_sharing_the_cache_keep_its_bounds_and_its_byte_count():
    cache = logcache.LogCache(max_slots=8, max_bytes=2_000, idle_seconds=0)
    errors = []

    def node(number: int) -> None:
        try:
            for attestation in range(300):
                raw = _log(number * 1000 + attestation % 7, 100 + 4 * (attestation % 5))
                assert cache.get(b"node-%d" % number, raw, lambda raw: ("parsed", raw)) == ("parsed", raw)
        except Exception as exc:  # noqa: BLE001 (reported below, in the main thread)
            errors.append(exc)

    threads = [threading.Thread(target=node, args=(number,)) for number in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(cache) <= 8 and cache.bytes <= 2_000
    assert cache.bytes == sum(len(raw) for raw, _value, _used in cache._slots.values())


def test_bounds_must_be_positive():
    with pytest.raises(ValueError, match="max_slots"):
        logcache.LogCache(max_slots=0)


def test_the_gce_shaped_log_has_the_size_and_event_mix_of_a_real_one():
    raw = gce_like_log()
    parsed = el.parse(raw)
    assert 30_000 <= len(raw) <= 40_000
    assert len(parsed.events) == len(gce_like_events()) == 105
    assert parsed.banks == ("sha1", "sha256")
    kinds = {event.type for event in parsed.events}
    assert {el.EV_EFI_VARIABLE_DRIVER_CONFIG, el.EV_EFI_VARIABLE_BOOT, el.EV_IPL, el.EV_EFI_VARIABLE_AUTHORITY} <= kinds


@pytest.fixture
def booted(swtpm, monkeypatch):
    """Evidence of a swtpm booted through a GCE-shaped log, a policy of its PCRs, and a fresh verifier cache."""
    log = gce_like_log()
    with issuer.Tpm(swtpm.tcti) as tpm:
        extend_into(tpm, log)
    nonce = os.urandom(32)
    with issuer.Tpm(swtpm.tcti) as tpm:
        evidence = issuer.issue_evidence(tpm, nonce, EphemeralKey.generate().public_bytes(), event_log=log)
    values = evidence.pcrs["sha256"]
    policy = MeasurementPolicy("sha256", {i: PcrRule(i, (values[i],)) for i in (0, 4, 7, 8)}, "pcrs-only")
    monkeypatch.setattr(tpm_variant, "PARSED_EVENT_LOGS", logcache.LogCache())
    parses = []
    real_parse = el.parse
    monkeypatch.setattr(el, "parse", lambda raw: parses.append(raw) or real_parse(raw))
    return evidence, nonce, policy, parses


def test_the_verifier_parses_a_nodes_log_once_in_the_slot_of_its_ak(booted):
    evidence, nonce, policy, parses = booted
    verifier = Verifier(policy)
    for _attestation in range(3):
        assert verifier.verify(evidence.to_json(), nonce).to_result()["verified"] is True
    assert len(parses) == 1
    assert tpm2.parse_public(evidence.ak_public).name in tpm_variant.PARSED_EVENT_LOGS


def test_a_verifier_cache_full_of_live_nodes_verifies_a_new_node_uncached_and_evicts_none(booted, monkeypatch):
    evidence, nonce, policy, parses = booted
    cache = logcache.LogCache(max_slots=1)
    cache.get(b"another node's AK", firmware_log(), lambda raw: ("parsed", raw))
    monkeypatch.setattr(tpm_variant, "PARSED_EVENT_LOGS", cache)
    verifier = Verifier(policy)
    for _attestation in range(2):
        assert verifier.verify(evidence.to_json(), nonce).to_result()["verified"] is True
    assert len(parses) == 2
    assert b"another node's AK" in cache and len(cache) == 1


def test_a_cached_log_does_not_vouch_for_a_quote_it_does_not_replay_to(booted):
    evidence, nonce, policy, parses = booted
    verifier = Verifier(policy)
    verifier.verify(evidence.to_json(), nonce)
    # the node's cached log with one GRUB command's digest changed: parsed anew, and refused as a mismatch
    log = evidence.event_log
    flipped = _flip(log, next(e for e in el.parse(log).events if e.pcr == 8))
    with pytest.raises(VerificationError) as refused:
        verifier.verify(evidence._replace(event_log=flipped).to_json(), nonce)
    assert refused.value.reason == "event-log-mismatch" and "sha256:8" in str(refused.value)


def _flip(log: bytes, event: el.Event) -> bytes:
    offset = log.index(event.digests["sha256"])
    return log[:offset] + bytes((log[offset] ^ 1,)) + log[offset + 1 :]


def test_a_second_tpm_sending_many_logs_does_not_evict_the_first_nodes_entry(booted, other_swtpm, monkeypatch):
    evidence, nonce, policy, parses = booted
    monkeypatch.setattr(tpm_variant, "PARSED_EVENT_LOGS", logcache.LogCache(max_slots=2))
    Verifier(policy).verify(evidence.to_json(), nonce)
    other_log = firmware_log(locality=None)
    with issuer.Tpm(other_swtpm.tcti) as tpm:
        extend_into(tpm, other_log)
    other_nonce = os.urandom(32)
    with issuer.Tpm(other_swtpm.tcti) as tpm:
        other = issuer.issue_evidence(tpm, other_nonce, EphemeralKey.generate().public_bytes(), event_log=other_log)
    values = other.pcrs["sha256"]
    other_verifier = Verifier(MeasurementPolicy("sha256", {i: PcrRule(i, (values[i],)) for i in (0, 4)}, "pcrs-only"))
    assert other_verifier.verify(other.to_json(), other_nonce).to_result()["verified"] is True
    for event in [e for e in el.parse(other_log).events if e.measured][:6]:
        with pytest.raises(VerificationError, match="does not replay"):
            other_verifier.verify(other._replace(event_log=_flip(other_log, event)).to_json(), other_nonce)
    assert len(tpm_variant.PARSED_EVENT_LOGS) == 2
    parsed = len(parses)
    Verifier(policy).verify(evidence.to_json(), nonce)
    assert len(parses) == parsed, "the second TPM's logs evicted the first node's parsed log"
