"""What the join service hands a node, tried against a real API server 1.20 (tests/control_plane.py).

The bootstrap token it registers must authenticate and be allowed kubeadm's reads and no certificate request; the token
cleaner must remove it after its TTL; the kubelet client certificate it signs must pass the Node authorizer and
NodeRestriction for its own Node and nothing else.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import time

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ansible_collections.confidential.kubernetes.plugins.module_utils._join.kubeapi import ClusterApi
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.pki import ClusterPki, kubelet_subject
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.tokens import ApiTokenMinter, generate_token


def mint(cluster, token: str, node_name: str, ttl: datetime.timedelta = datetime.timedelta(minutes=15)) -> None:
    """Register ``token`` as the join service does: its one API client, with the cluster's admin kubeconfig."""

    async def register():
        api = ClusterApi.from_kubeconfig(str(cluster.admin_kubeconfig))
        try:
            await ApiTokenMinter(api, ttl=ttl).mint(token, node_name)
        finally:
            api.close()

    asyncio.run(register())


def _as_token(cluster, token: str, *args: str, stdin: bytes | None = None, check: bool = True):
    """kubectl with only the bootstrap token (and the CA) as credentials."""
    kubeconfig = cluster.root / f"token-{token.split('.', 1)[0]}.conf"
    cluster.user_kubeconfig(kubeconfig, {"token": token})
    return cluster.kubectl(*args, kubeconfig=kubeconfig, stdin=stdin, check=check)


def _kubelet_csr_manifest(name: str, node_name: str) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    csr = x509.CertificateSigningRequestBuilder().subject_name(kubelet_subject(node_name)).sign(key, hashes.SHA256())
    return json.dumps(
        {
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "CertificateSigningRequest",
            "metadata": {"name": name},
            "spec": {
                "request": base64.b64encode(csr.public_bytes(serialization.Encoding.PEM)).decode(),
                "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
                "usages": ["digital signature", "key encipherment", "client auth"],
            },
        }
    ).encode()


def test_minted_token_authenticates_as_a_bootstrapper_without_certificate_rights(kube_control_plane):
    """The token serves discovery and kubeadm's reads; the kubelet certificate comes signed in the ticket, so no CSR."""
    cluster = kube_control_plane
    token = generate_token()
    mint(cluster, token, "worker-7")
    token_id = token.split(".", 1)[0]

    allowed = _as_token(cluster, token, "auth", "can-i", "get", "nodes")
    assert allowed.stdout.decode().strip() == "yes"
    for verb, resource in (("create", "certificatesigningrequests.certificates.k8s.io"), ("list", "secrets")):
        denied = _as_token(cluster, token, "auth", "can-i", verb, resource, "-n", "kube-system", check=False)
        assert denied.stdout.decode().strip() == "no", f"a join token may {verb} {resource}"
    # A wrong secret for the same id is not a bootstrapper at all.
    wrong = _as_token(cluster, f"{token_id}.{'0' * 16}", "get", "--raw", "/api", check=False)
    assert wrong.returncode != 0 and b"Unauthorized" in wrong.stderr

    posted = _as_token(
        cluster, token, "create", "-f", "-", stdin=_kubelet_csr_manifest(f"csr-{token_id}", "worker-7"), check=False
    )
    assert posted.returncode != 0 and b"forbidden" in posted.stderr.lower()


def test_token_cleaner_removes_an_expired_token(kube_control_plane):
    cluster = kube_control_plane
    token = generate_token()
    mint(cluster, token, "worker-8", ttl=datetime.timedelta(seconds=2))
    secret = f"bootstrap-token-{token.split('.', 1)[0]}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if cluster.kubectl("-n", "kube-system", "get", "secret", secret, check=False).returncode != 0:
            break
        time.sleep(0.5)
    assert cluster.kubectl("-n", "kube-system", "get", "secret", secret, check=False).returncode != 0, (
        "expired token still there"
    )
    assert _as_token(cluster, token, "get", "--raw", "/api", check=False).returncode != 0


@pytest.fixture
def kubelet_kubeconfig(kube_control_plane):
    """A kubelet kubeconfig for node worker-9 with the client certificate the join service signs."""
    cluster = kube_control_plane
    key = ec.generate_private_key(ec.SECP256R1())
    csr = x509.CertificateSigningRequestBuilder().subject_name(kubelet_subject("worker-9")).sign(key, hashes.SHA256())
    certificate = ClusterPki.load(str(cluster.pki)).sign_kubelet_client(
        csr.public_key(), "worker-9", datetime.datetime.now(datetime.timezone.utc)
    )
    (cluster.root / "worker-9.crt").write_bytes(certificate)
    key_path = cluster.root / "worker-9.key"
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_path.chmod(0o600)
    kubeconfig = cluster.root / "worker-9.conf"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [
                    {
                        "name": "k",
                        "cluster": {"server": cluster.server, "certificate-authority": str(cluster.pki / "ca.crt")},
                    }
                ],
                "users": [
                    {
                        "name": "u",
                        "user": {"client-certificate": str(cluster.root / "worker-9.crt"), "client-key": str(key_path)},
                    }
                ],
                "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
            }
        )
    )
    return kubeconfig


def _node(name: str) -> bytes:
    return json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}
    ).encode()


def test_kubelet_certificate_passes_node_authorizer_for_its_own_node_only(
    kube_control_plane, kubelet_kubeconfig, nodes_deleted_after
):
    cluster = kube_control_plane

    def as_kubelet(*args, **kwargs):
        return cluster.kubectl(*args, kubeconfig=kubelet_kubeconfig, check=False, **kwargs)

    cluster.kubectl("create", "-f", "-", stdin=_node("cp-other"))

    assert as_kubelet("create", "-f", "-", stdin=_node("worker-9")).returncode == 0
    assert as_kubelet("label", "node", "worker-9", "example.com/updated=yes").returncode == 0
    assert as_kubelet("get", "node", "cp-other").returncode == 0, "reading other Nodes is allowed in real Kubernetes"

    refused = {
        "modify another Node": as_kubelet("label", "node", "cp-other", "example.com/hijacked=yes"),
        "delete another Node": as_kubelet("delete", "node", "cp-other"),
        "create a Node under another name": as_kubelet("create", "-f", "-", stdin=_node("worker-10")),
        "list Secrets": as_kubelet("get", "secrets", "-A"),
        "list ConfigMaps": as_kubelet("get", "configmaps", "-A"),
    }
    assert {what: done.returncode for what, done in refused.items()} == {what: 1 for what in refused}
    assert all(b"Forbidden" in done.stderr or b"forbidden" in done.stderr for done in refused.values()), {
        what: done.stderr for what, done in refused.items()
    }
    labels = json.loads(cluster.kubectl("get", "node", "cp-other", "-o", "json").stdout)["metadata"]["labels"]
    assert "example.com/hijacked" not in labels
