"""Disk bindings in the cluster's API, through kubectl's runner seam (the harness's FakeApi answers as kubectl would)."""

from __future__ import annotations

import asyncio
import json

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._join.bindings import BindingConflict
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.registry import Binding

from join_harness import FakeApi

DISK = "0d3b1c4e-9f2a-4e57-8a61-2f4c9b7d5e13"


def _binding(ek: str, enrolment_id: str = "") -> Binding:
    return Binding(DISK, ek * 64, f"node-{ek}", enrolment_id, "2026-01-01T00:00:00Z")


def test_first_claim_creates_the_binding_and_a_second_ek_gets_the_holder():
    api = FakeApi()
    bindings = api.bindings()
    mine = _binding("a")
    assert asyncio.run(bindings.claim(mine, lambda existing: True)) == mine
    stored = api.configmaps[f"confidential-kubernetes-disk-{DISK}"]
    assert stored["metadata"]["labels"] == {"confidential.kubernetes/disk-binding": "v1"} and stored["data"]["ek"] == "a" * 64
    assert asyncio.run(bindings.claim(_binding("b"), lambda existing: True)) == mine
    assert asyncio.run(bindings.all_bindings()) == [mine]
    assert all(call[0] in ("create", "get") for call in api.calls)


def test_a_binding_that_no_longer_counts_is_replaced_by_compare_and_swap():
    api = FakeApi()
    bindings = api.bindings()
    asyncio.run(bindings.claim(_binding("a"), lambda existing: True))
    newer = _binding("b")
    assert asyncio.run(bindings.claim(newer, lambda existing: False)) == newer
    assert json.loads(json.dumps(api.configmaps[f"confidential-kubernetes-disk-{DISK}"]["data"]))["ek"] == "b" * 64
    # The same EK enrolled afresh updates its own binding.
    renewed = _binding("b", "02")
    assert asyncio.run(bindings.claim(renewed, lambda existing: True)) == renewed


def test_a_concurrent_change_or_an_unreachable_api_is_a_conflict():
    class Racing(FakeApi):
        async def _write(self, verb, manifest):
            if verb == "replace":
                manifest["metadata"]["resourceVersion"] = "stale"
            return await super()._write(verb, manifest)

    api = Racing()
    bindings = api.bindings()
    asyncio.run(bindings.claim(_binding("a"), lambda existing: True))
    with pytest.raises(BindingConflict, match="changed while it was claimed"):
        asyncio.run(bindings.claim(_binding("b"), lambda existing: False))
    api.fail_bindings = True
    with pytest.raises(BindingConflict, match="connection refused"):
        asyncio.run(api.bindings().claim(Binding("5a0c7e21-3b9d-4f16-9c2e-7d81a4f0b362", "c" * 64, "n"), lambda existing: True))
