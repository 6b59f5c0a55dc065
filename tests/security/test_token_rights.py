"""A join token cannot buy a node's identity at the Kubernetes layer (issue 25, item 2), against a real API server 1.20.

The control plane (``tests/control_plane.py``) is set up as ``kubeadm init`` sets it up, then as ``kubeadm_init`` leaves
it (kubeadm's bindings that give bootstrap tokens certificate rights deleted). The token is registered by the join
service's own code. With kubeadm's bindings, CSRs for ``system:node:cp-0``, for the token's own node and for a random
name are each approved and signed within a second; here none is, while a kubelet still renews its own certificate.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import os
import time

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ansible_collections.confidential.kubernetes.plugins.module_utils._join.pki import ClusterPki, kubelet_subject
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.kubeapi import ClusterApi
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.tokens import ApiTokenMinter, generate_token
from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import (
    TOKEN_CERTIFICATE_BINDINGS,
    Kubeadm,
)

# The controller-manager's CSR approver and signer answer within a second here; five leaves them room on a busy machine.
APPROVAL_WAIT = 5.0


def _kubeconfig(cluster, name: str, user: dict):
    return cluster.user_kubeconfig(cluster.root / f"{name}.conf", user)


def _csr(name: str, node_name: str) -> bytes:
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


def _signed(cluster, names: list[str], wait: float) -> dict[str, bool]:
    """CSR name -> whether it was approved and signed, waiting up to ``wait`` seconds for all of them."""
    deadline = time.monotonic() + wait
    while True:
        listing = json.loads(cluster.kubectl("get", "csr", "-o", "json").stdout)["items"]
        signed = {item["metadata"]["name"]: bool(item.get("status", {}).get("certificate")) for item in listing}
        outcome = {name: signed.get(name, False) for name in names}
        if all(outcome.values()) or time.monotonic() > deadline:
            return outcome
        time.sleep(0.3)


def test_a_join_token_gets_no_node_certificate_approved(kube_control_plane, attack):
    cluster = kube_control_plane
    token = generate_token()

    async def mint():
        api = ClusterApi.from_kubeconfig(str(cluster.admin_kubeconfig))
        try:
            await ApiTokenMinter(api).mint(token, "worker-3")
        finally:
            api.close()

    asyncio.run(mint())
    token_id = token.split(".", 1)[0]
    as_token = _kubeconfig(cluster, f"token-{token_id}", {"token": token})
    # The token works (kubeadm join's reads): the refusals below are about certificates, not a dead credential.
    assert cluster.kubectl("auth", "can-i", "get", "nodes", kubeconfig=as_token).stdout.decode().strip() == "yes"

    wanted = {
        f"attack-{token_id}-{suffix}": node
        for suffix, node in (("cp", "cp-0"), ("own", "worker-3"), ("random", f"node-{os.urandom(4).hex()}"))
    }
    posted = {
        name: cluster.kubectl("create", "-f", "-", kubeconfig=as_token, stdin=_csr(name, node), check=False)
        for name, node in wanted.items()
    }
    signed = _signed(cluster, list(wanted), APPROVAL_WAIT)
    attack.obtained("node client certificates bought with a join token", sum(signed.values()))
    refused = {
        wanted[name]: done.stderr.decode(errors="replace").strip()
        for name, done in posted.items()
        if done.returncode != 0
    }
    assert set(refused) == set(wanted.values()), (
        f"a join token may post node CSRs: {sorted(set(wanted.values()) - set(refused))}"
    )
    assert all("forbidden" in words.lower() for words in refused.values()), refused


def test_the_kubelet_still_renews_its_own_certificate(kube_control_plane):
    """The renewal the kubelet makes with its current certificate (kubeadm:node-autoapprove-certificate-rotation) is
    approved for its own name only."""
    cluster = kube_control_plane
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = ClusterPki.load(str(cluster.pki)).sign_kubelet_client(key.public_key(), "worker-4", now)
    (cluster.root / "worker-4.crt").write_bytes(certificate)
    (cluster.root / "worker-4.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    (cluster.root / "worker-4.key").chmod(0o600)
    as_kubelet = _kubeconfig(
        cluster,
        "worker-4",
        {"client-certificate": str(cluster.root / "worker-4.crt"), "client-key": str(cluster.root / "worker-4.key")},
    )
    suffix = os.urandom(4).hex()
    own, other = f"renew-worker-4-{suffix}", f"renew-as-cp-0-{suffix}"
    cluster.kubectl("create", "-f", "-", kubeconfig=as_kubelet, stdin=_csr(own, "worker-4"))
    cluster.kubectl("create", "-f", "-", kubeconfig=as_kubelet, stdin=_csr(other, "cp-0"))
    assert _signed(cluster, [own], 60) == {own: True}, "the kubelet's renewal of its own certificate was not signed"
    assert _signed(cluster, [other], APPROVAL_WAIT) == {other: False}, "a kubelet got a certificate for another node"


def test_revoking_is_idempotent_and_keeps_the_renewal_binding(kube_control_plane):
    cluster = kube_control_plane
    kubeadm = Kubeadm(str(cluster.bin / "kubeadm"))
    assert kubeadm.revoke_token_certificate_rights(str(cluster.admin_kubeconfig)) == []
    bindings = cluster.kubectl("get", "clusterrolebindings", "-o", "name").stdout.decode().split()
    names = {binding.split("/", 1)[1] for binding in bindings}
    assert not names & set(TOKEN_CERTIFICATE_BINDINGS)
    assert "kubeadm:node-autoapprove-certificate-rotation" in names
