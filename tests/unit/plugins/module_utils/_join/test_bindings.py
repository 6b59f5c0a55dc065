"""Disk bindings in the cluster's API, through kubectl's runner seam (the harness's FakeApi answers as kubectl would)."""

from __future__ import annotations

import asyncio

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
    assert asyncio.run(bindings.claim(mine)) == mine
    stored = api.configmaps[f"confidential-kubernetes-disk-{DISK}"]
    assert (
        stored["metadata"]["labels"] == {"confidential.kubernetes/disk-binding": "v1"}
        and stored["data"]["ek"] == "a" * 64
    )
    assert asyncio.run(bindings.claim(_binding("b"))) == mine
    assert asyncio.run(bindings.all_bindings()) == [mine]
    assert all(call[0] in ("create", "get") for call in api.calls)


def test_another_eks_binding_is_never_replaced_and_the_same_ek_enrolled_afresh_renews_its_own():
    api = FakeApi()
    bindings = api.bindings()
    held = _binding("a", "01")
    asyncio.run(bindings.claim(held))
    # However the enrolment reads now (the owner unenrolled, or the disk enrolled for another node), the disk stays A's.
    assert asyncio.run(bindings.claim(_binding("b"))) == held
    assert api.configmaps[f"confidential-kubernetes-disk-{DISK}"]["data"]["ek"] == "a" * 64
    assert not any(call[0] == "replace" for call in api.calls)
    # A's own binding made under an older enrolment is replaced by compare-and-swap.
    renewed = _binding("a", "02")
    assert asyncio.run(bindings.claim(renewed)) == renewed
    assert api.configmaps[f"confidential-kubernetes-disk-{DISK}"]["data"]["enrolment_id"] == "02"


def test_one_tpm_binds_one_disk_however_many_first_joins_it_starts():
    api = FakeApi()
    bindings = api.bindings()
    other = "5a0c7e21-3b9d-4f16-9c2e-7d81a4f0b362"
    first, second = _binding("a"), Binding(other, "a" * 64, "node-a", "", "2026-01-01T00:00:00Z")

    async def both():
        return await asyncio.gather(bindings.claim(first), bindings.claim(second))

    results = asyncio.run(both())
    winners = [claimed for claimed, asked in zip(results, (first, second)) if claimed == asked]
    assert len(winners) == 1, results
    loser = second if winners[0] == first else first
    assert results == [winners[0]] * 2, "the loser learns which disk this TPM holds"
    assert api.configmaps[f"confidential-kubernetes-ek-{'a' * 64}"]["data"]["disk_uuid"] == winners[0].disk_uuid
    assert f"confidential-kubernetes-disk-{loser.disk_uuid}" not in api.configmaps
    assert asyncio.run(bindings.all_bindings()) == [winners[0]]


def test_a_concurrent_change_or_an_unreachable_api_is_a_conflict():
    class Racing(FakeApi):
        async def _write(self, verb, manifest):
            if verb == "replace":
                manifest["metadata"]["resourceVersion"] = "stale"
            return await super()._write(verb, manifest)

    api = Racing()
    bindings = api.bindings()
    asyncio.run(bindings.claim(_binding("a")))
    with pytest.raises(BindingConflict, match="changed while it was claimed"):
        asyncio.run(bindings.claim(_binding("a", "02")))
    api.fail_bindings = True
    with pytest.raises(BindingConflict, match="connection refused"):
        asyncio.run(api.bindings().claim(Binding("5a0c7e21-3b9d-4f16-9c2e-7d81a4f0b362", "c" * 64, "n")))
