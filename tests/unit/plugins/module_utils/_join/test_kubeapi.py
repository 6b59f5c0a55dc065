"""The join service's one API client against the real API server 1.20 (tests/control_plane.py): bounded retries with an
error naming the endpoint, recovery when the API server restarts under joins, and no process started per join."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._join.client import JoinError
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.config import ConfigError
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.kubeapi import ApiUnavailable, ClusterApi
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.service import build_service

from join_harness import ProcessCounter, join_with_client, wait_for

# The restart test's bound: joins go on until this many succeeded after the API server is back, within RESTART_BOUND s.
JOINS_AFTER_RESTART = 3
RESTART_BOUND = 180.0


def _secret_exists(cluster, token: str) -> bool:
    name = f"bootstrap-token-{token.split('.')[0]}"
    return cluster.kubectl("-n", "kube-system", "get", "secret", name, check=False).returncode == 0


def test_an_unusable_kubeconfig_stops_the_service_naming_the_file(join_lab, tmp_path):
    join_lab.write_policy("pcrs-only")
    missing = tmp_path / "no-admin.conf"
    with pytest.raises(ConfigError, match=f"cannot use the kubeconfig {missing}"):
        build_service(join_lab.config(admin_kubeconfig=str(missing)), join_lab.log)


def test_a_call_retries_while_the_api_server_restarts_and_names_it_when_it_stays_away(kube_control_plane):
    cluster = kube_control_plane

    async def read_namespace_configmaps(retry_window: float) -> list:
        api = ClusterApi.from_kubeconfig(str(cluster.admin_kubeconfig), retry_window=retry_window)
        try:
            return await api.list("configmaps")
        finally:
            api.close()

    cluster.stop_api_server()
    try:
        started = time.monotonic()
        with pytest.raises(ApiUnavailable) as err:
            asyncio.run(read_namespace_configmaps(1.0))
        assert time.monotonic() - started < 5, "the retries are bounded"
        assert f"the Kubernetes API at {cluster.server} did not answer listing configmaps" in str(err.value)
        assert "attempt(s)" in str(err.value) and "refused" in str(err.value).lower()
        # A call made while it is down succeeds once it is back, within its window.
        restarted = threading.Timer(2.0, cluster.start_api_server)
        restarted.start()
        assert isinstance(asyncio.run(read_namespace_configmaps(90.0)), list)
        restarted.join()
    finally:
        if cluster.processes["kube-apiserver"].poll() is not None:
            cluster.start_api_server()


def test_the_service_recovers_when_the_api_server_restarts_under_joins(
    join_lab, kube_control_plane, nodes_deleted_after
):
    """Joins run in a loop while the real API server is stopped and started again: each join either gets a ticket whose
    token the API holds, or fails with a clear reason and is retried by the node; joins succeed again once the API is
    back, and the Node watch, resumed after the restart, retires the tokens once the node registers."""
    cluster = kube_control_plane
    api = ClusterApi.from_kubeconfig(str(cluster.admin_kubeconfig), retry_window=5.0)
    service = join_lab.start("pcrs-only", api=api)
    tickets: list[tuple[float, str]] = []
    refusals: list[str] = []
    stop = threading.Event()

    def join_in_a_loop():
        deadline = time.monotonic() + RESTART_BOUND
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                ticket = join_with_client(join_lab, service, attempts=20, backoff=0.2, max_backoff=1.0, timeout=20)
                tickets.append((time.monotonic(), ticket.bootstrap_token))
            except JoinError as exc:
                refusals.append(f"{exc.code} {exc.reason}: {exc}")

    joiner = threading.Thread(target=join_in_a_loop)
    joiner.start()
    try:
        assert wait_for(lambda: len(tickets) >= 2, timeout=60), refusals
        cluster.stop_api_server()
        time.sleep(4)
        back = time.monotonic() + cluster.start_api_server()
        assert wait_for(lambda: sum(1 for at, _token in tickets if at > back) >= JOINS_AFTER_RESTART, RESTART_BOUND), (
            refusals,
            join_lab.logs()[-5:],
        )
    finally:
        stop.set()
        joiner.join()
    # No node waited for ever, and every ticket handed out carries a token the API holds.
    assert refusals == [], refusals
    assert all(_secret_exists(cluster, token) for _at, token in tickets)
    failed = [
        e for e in join_lab.logs() if e.get("result") == "refused" and e.get("reason") in ("token-mint", "disk-binding")
    ]
    assert all("the Kubernetes API at " + cluster.server in e["msg"] for e in failed), failed
    # The Node watch resumed after the restart: the node registers and every token it was handed is retired.
    cluster.kubectl(
        "create",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "worker-1"}}).encode(),
    )
    assert wait_for(lambda: not any(_secret_exists(cluster, token) for _at, token in tickets), timeout=60)
    # (Tokens of other nodes, registered by earlier tests on this API server, are adopted and stay.)
    live = service.issuer.live_tokens
    assert wait_for(lambda: not any(t.node_name == "worker-1" for t in list(live.values())), timeout=10)


def test_a_join_starts_no_process(join_lab, kube_control_plane):
    cluster = kube_control_plane
    service = join_lab.start("pcrs-only", api=ClusterApi.from_kubeconfig(str(cluster.admin_kubeconfig)))
    join_with_client(join_lab, service, attempts=1)  # the worker processes exist before the count
    joins = 5
    with ProcessCounter() as counter:
        tokens = [join_with_client(join_lab, service, attempts=1).bootstrap_token for _join in range(joins)]
        during_joins = list(counter.started)
        # The counter does see a process started the ordinary way.
        subprocess.run(["true"], check=True)
    assert (len(during_joins) / joins, counter.started) == (0, ["_fork_exec"])
    assert all(_secret_exists(cluster, token) for token in tokens)
