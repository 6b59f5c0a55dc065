"""Disk bindings in the cluster's API, claimed and watched through the service's one API client, against the real API
server 1.20 (tests/control_plane.py). Each test binds disks of its own (the API server is shared by the session)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._join.bindings import (
    ApiDiskBindings,
    BindingConflict,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.kubeapi import ClusterApi
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.registry import Binding


def _binding(disk: str, ek: str, enrolment_id: str = "") -> Binding:
    return Binding(disk, ek * 64, f"node-{ek}", enrolment_id, "2026-01-01T00:00:00Z")


def _run(kubeconfig, coroutine_of):
    async def run():
        api = ClusterApi.from_kubeconfig(str(kubeconfig), retry_window=1.0)
        try:
            return await coroutine_of(ApiDiskBindings(api))
        finally:
            api.close()

    return asyncio.run(run())


def _configmap(cluster, name: str) -> dict | None:
    done = cluster.kubectl("-n", "kube-system", "get", "configmap", name, "-o", "json", check=False)
    return json.loads(done.stdout) if done.returncode == 0 else None


def test_first_claim_creates_the_binding_and_a_second_ek_gets_the_holder(kube_control_plane):
    cluster = kube_control_plane
    disk = str(uuid.uuid4())
    mine = _binding(disk, "a")
    assert _run(cluster.admin_kubeconfig, lambda bindings: bindings.claim(mine)) == mine
    stored = _configmap(cluster, f"confidential-kubernetes-disk-{disk}")
    assert stored["metadata"]["labels"] == {"confidential.kubernetes/disk-binding": "v1"}
    assert stored["data"] == mine.to_document()
    assert _configmap(cluster, f"confidential-kubernetes-ek-{'a' * 64}")["metadata"]["labels"] == {
        "confidential.kubernetes/ek-binding": "v1"
    }
    assert _run(cluster.admin_kubeconfig, lambda bindings: bindings.claim(_binding(disk, "b"))) == mine


def test_another_eks_binding_is_never_replaced_and_the_same_ek_enrolled_afresh_renews_its_own(kube_control_plane):
    cluster = kube_control_plane
    disk = str(uuid.uuid4())
    name = f"confidential-kubernetes-disk-{disk}"
    held = _binding(disk, "c", "01")
    _run(cluster.admin_kubeconfig, lambda bindings: bindings.claim(held))
    # However the enrolment reads now (the owner unenrolled, or the disk enrolled for another node), the disk stays C's.
    assert _run(cluster.admin_kubeconfig, lambda bindings: bindings.claim(_binding(disk, "d"))) == held
    assert _configmap(cluster, name)["data"]["ek"] == "c" * 64
    # C's own binding made under an older enrolment is replaced by compare-and-swap.
    renewed = _binding(disk, "c", "02")
    assert _run(cluster.admin_kubeconfig, lambda bindings: bindings.claim(renewed)) == renewed
    assert _configmap(cluster, name)["data"]["enrolment_id"] == "02"


def test_one_tpm_binds_one_disk_however_many_first_joins_it_starts(kube_control_plane):
    cluster = kube_control_plane
    first, second = _binding(str(uuid.uuid4()), "e"), _binding(str(uuid.uuid4()), "e")

    async def both(bindings):
        return await asyncio.gather(bindings.claim(first), bindings.claim(second))

    results = _run(cluster.admin_kubeconfig, both)
    winners = [claimed for claimed, asked in zip(results, (first, second)) if claimed == asked]
    assert len(winners) == 1, results
    loser = second if winners[0] == first else first
    assert results == [winners[0]] * 2, "the loser learns which disk this TPM holds"
    assert _configmap(cluster, f"confidential-kubernetes-ek-{'e' * 64}")["data"]["disk_uuid"] == winners[0].disk_uuid
    assert _configmap(cluster, f"confidential-kubernetes-disk-{loser.disk_uuid}") is None


def test_a_concurrent_change_is_a_conflict(kube_control_plane):
    cluster = kube_control_plane
    disk = str(uuid.uuid4())
    _run(cluster.admin_kubeconfig, lambda bindings: bindings.claim(_binding(disk, "f", "01")))

    async def renew_racing(bindings):
        real_replace = bindings.api.replace

        async def replace_after_someone_else(resource, name, body):
            # Another control plane changes the object between this one's read and its replace.
            await asyncio.get_running_loop().run_in_executor(
                None, lambda: cluster.kubectl("-n", "kube-system", "label", "configmap", name, "raced=yes")
            )
            return await real_replace(resource, name, body)

        bindings.api.replace = replace_after_someone_else
        return await bindings.claim(_binding(disk, "f", "02"))

    with pytest.raises(BindingConflict, match="changed while it was claimed .*HTTP 409"):
        _run(cluster.admin_kubeconfig, renew_racing)
    assert _configmap(cluster, f"confidential-kubernetes-ek-{'f' * 64}")["data"]["enrolment_id"] == "01"


def test_an_unreachable_api_is_a_conflict_naming_the_endpoint(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    kubeconfig = tmp_path / "away.conf"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "k", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "x"}}],
                "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
            }
        )
    )
    started = time.monotonic()
    with pytest.raises(BindingConflict) as err:
        _run(kubeconfig, lambda bindings: bindings.claim(_binding(str(uuid.uuid4()), "8")))
    assert f"the Kubernetes API at https://127.0.0.1:{port} did not answer creating configmaps" in str(err.value)
    assert "attempt(s)" in str(err.value) and time.monotonic() - started < 5


def test_the_watch_mirrors_every_valid_binding_and_drops_a_released_one(kube_control_plane):
    cluster = kube_control_plane
    disk = str(uuid.uuid4())
    name = f"confidential-kubernetes-disk-{disk}"
    failures = []

    async def watch(bindings):
        changed = asyncio.Event()
        loop = asyncio.get_running_loop()
        bindings.follow(lambda: loop.call_soon_threadsafe(changed.set), failures.append)

        async def until(condition):
            deadline = loop.time() + 30
            while loop.time() < deadline:
                changed.clear()
                if condition():
                    break
                await asyncio.wait_for(changed.wait(), 30)
            return condition()

        mine = _binding(disk, "9")
        await ApiDiskBindings(bindings.api).claim(mine)
        seen = await until(lambda: mine in bindings.watched())
        # An operator releases the disk (remove_node.yml deletes the ConfigMaps).
        await loop.run_in_executor(None, lambda: cluster.kubectl("-n", "kube-system", "delete", "configmap", name))
        dropped = await until(lambda: all(b.disk_uuid != disk for b in bindings.watched()))
        return seen, dropped, [b for b in bindings.watched() if b.ek == "9" * 64]

    assert _run(cluster.admin_kubeconfig, watch) == (True, True, []), failures
