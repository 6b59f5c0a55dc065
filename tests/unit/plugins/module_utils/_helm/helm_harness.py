"""Shared by the helm tests: a control plane of the k8s doubles (API double over HTTPS on 127.0.0.1); it also puts
tests/ on the import path for helm_charts (the chart archives)."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[4]
sys.path[:0] = [str(TESTS / "unit" / "doubles"), str(TESTS)]

from k8s_doubles_harness import BIN, Cluster, Node, free_port, init_config, stop_pid  # noqa: E402


def control_plane(tmp_path: Path, monkeypatch):
    """A control plane initialised by the kubeadm double (a generator for fixtures); the helm double runs with this Python."""
    node = Node(tmp_path / "cp")
    node.root.mkdir()
    port = free_port()
    result = node.run("kubeadm", "init", "--config", init_config(node, port))
    pid = node.apiserver_pid()
    monkeypatch.setenv("K8S_DOUBLES_PYTHON", sys.executable)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    try:
        assert result.returncode == 0, result.stderr
        yield Cluster(node, port, "")
    finally:
        stop_pid(pid or node.apiserver_pid())


HELM_BINARY = str(BIN / "helm")
