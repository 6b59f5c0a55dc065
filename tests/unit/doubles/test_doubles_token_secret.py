"""The join service's token registration against the doubles: the Secret it sends on kubectl's stdin is a working join token."""

from __future__ import annotations

import asyncio
import os

from k8s_doubles_harness import BIN

from ansible_collections.confidential.kubernetes.plugins.module_utils._join.tokens import KubectlTokenMinter, TokenMintError, generate_token


def _minter(cluster) -> KubectlTokenMinter:
    return KubectlTokenMinter(kubeconfig=cluster.control_plane.admin_conf, binary=str(BIN / "kubectl"))


def _in_node_env(cluster):
    """kubectl as the join service runs it, inside the control plane's double root."""
    saved = dict(os.environ)
    os.environ.update(cluster.control_plane.env())
    os.environ.pop("KUBECONFIG", None)
    return saved


def test_registered_secret_lets_kubeadm_join_and_expires_in_15_minutes(cluster, make_node):
    token = generate_token()
    saved = _in_node_env(cluster)
    try:
        asyncio.run(_minter(cluster).mint(token, "w1"))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    listing = cluster.control_plane.run("kubeadm", "token", "list", "--kubeconfig", cluster.control_plane.admin_conf)
    assert listing.returncode == 0, listing.stderr
    [row] = [line for line in listing.stdout.splitlines() if line.startswith(token[:6])]
    assert "14m" in row or "15m" in row, row
    assert "authentication,signing" in row and "confidential.kubernetes join of w1" in row
    worker = make_node()
    joined = worker.run("kubeadm", "join", "--config", cluster.join_config(worker, "w1", token=token))
    assert joined.returncode == 0, joined.stderr


def test_a_second_registration_of_the_same_token_is_refused_without_echoing_it(cluster):
    token = generate_token()
    saved = _in_node_env(cluster)
    try:
        asyncio.run(_minter(cluster).mint(token, "w1"))
        try:
            asyncio.run(_minter(cluster).mint(token, "w1"))
        except TokenMintError as exc:
            error = str(exc)
        else:
            error = ""
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert "already exists" in error and token.split(".")[1] not in error
