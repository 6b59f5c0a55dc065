"""Fixtures: simulated nodes (temp roots) and a control plane made by `kubeadm init`."""

from __future__ import annotations

from pathlib import Path

import pytest

from k8s_doubles_harness import Cluster, Node, free_port, init_config, stop_pid
from k8sdoubles import pki


@pytest.fixture
def make_node(tmp_path: Path):
    counter = iter(range(1000))

    def factory() -> Node:
        root = tmp_path / f"node{next(counter)}"
        root.mkdir()
        return Node(root)

    return factory


@pytest.fixture
def cluster(make_node):
    """A control plane initialised by `kubeadm init`; its API double is stopped by pid afterwards."""
    node = make_node()
    port = free_port()
    result = node.run("kubeadm", "init", "--config", init_config(node, port))
    pid = node.apiserver_pid()
    try:
        assert result.returncode == 0, result.stderr
        ca_hash = pki.spki_hash(
            pki.x509.load_pem_x509_certificate(node.path("/etc/kubernetes/pki/ca.crt").read_bytes())
        )
        yield Cluster(node, port, ca_hash)
    finally:
        stop_pid(pid or node.apiserver_pid())
