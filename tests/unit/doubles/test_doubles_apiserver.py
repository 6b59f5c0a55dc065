"""The API double's authentication, authorization and REST conventions, checked over real TLS."""

from __future__ import annotations

import base64

import pytest

from k8sdoubles import pki
from k8sdoubles.client import ApiStatusError, Client, Connection, load_kubeconfig


def anonymous(cluster, verify: bool = True) -> Client:
    ca = cluster.control_plane.path("/etc/kubernetes/pki/ca.crt").read_bytes() if verify else None
    return Client(Connection(server=f"https://{cluster.endpoint}", ca_pem=ca, insecure=not verify))


def admin(cluster) -> Client:
    return Client(load_kubeconfig(cluster.control_plane.admin_conf)[1])


def test_anonymous_may_read_only_cluster_info(cluster):
    client = anonymous(cluster)
    info = client.get("/api/v1/namespaces/kube-public/configmaps/cluster-info")
    data = info["data"]
    assert pki.detached_jws_valid(data["jws-kubeconfig-abcdef"], data["kubeconfig"], "abcdef", "0123456789abcdef")
    with pytest.raises(ApiStatusError) as denied:
        client.get("/api/v1/nodes")
    assert denied.value.code == 403
    assert denied.value.status["message"] == (
        'nodes is forbidden: User "system:anonymous" cannot list resource "nodes" '
        'in API group "" at the cluster scope'
    )
    with pytest.raises(ApiStatusError) as secret:
        client.get("/api/v1/namespaces/kube-system/secrets/bootstrap-token-abcdef")
    assert secret.value.code == 403


def test_bad_bearer_token_is_unauthorized_and_good_one_is_confined(cluster):
    bad = Client(Connection(server=f"https://{cluster.endpoint}", insecure=True, token="abcdef.ffffffffffffffff"))
    with pytest.raises(ApiStatusError) as rejected:
        bad.get("/api/v1/namespaces/kube-system/configmaps/kubeadm-config")
    assert rejected.value.code == 401 and rejected.value.status["reason"] == "Unauthorized"
    good = Client(Connection(server=f"https://{cluster.endpoint}", insecure=True, token=cluster.token))
    assert "ClusterConfiguration" in good.get("/api/v1/namespaces/kube-system/configmaps/kubeadm-config")["data"]
    with pytest.raises(ApiStatusError) as forbidden:
        good.get("/api/v1/namespaces/kube-system/secrets")
    assert 'User "system:bootstrap:abcdef" cannot list resource "secrets"' in forbidden.value.status["message"]


def test_server_certificate_is_signed_by_cluster_ca_and_client_certs_are_checked(cluster, tmp_path):
    anonymous(cluster, verify=True).get("/version")
    stranger_ca, stranger_key = pki.new_ca("kubernetes", "ECDSA-P256")
    cert, key = pki.new_cert(
        pki.CertSpec("kubernetes-admin", ["system:masters"], client=True), stranger_ca, stranger_key, "ECDSA-P256"
    )
    conn = Connection(
        server=f"https://{cluster.endpoint}", insecure=True, cert_pem=pki.cert_pem(cert), key_pem=pki.key_pem(key)
    )
    with pytest.raises(Exception):
        Client(conn).get("/api/v1/nodes")


def test_rest_conventions(cluster):
    client = admin(cluster)
    listing = client.get("/api/v1/namespaces")
    assert listing["kind"] == "NamespaceList" and listing["metadata"]["resourceVersion"]
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s1", "namespace": "default"},
        "stringData": {"k": "v"},
    }
    created = client.request("POST", "/api/v1/namespaces/default/secrets", body)
    assert created["data"] == {"k": base64.b64encode(b"v").decode()} and created["type"] == "Opaque"
    with pytest.raises(ApiStatusError) as exists:
        client.request("POST", "/api/v1/namespaces/default/secrets", body)
    assert exists.value.code == 409 and exists.value.status["message"] == 'secrets "s1" already exists'
    stale = dict(created, metadata=dict(created["metadata"], resourceVersion="1"))
    with pytest.raises(ApiStatusError) as conflict:
        client.request("PUT", "/api/v1/namespaces/default/secrets/s1", stale)
    assert conflict.value.code == 409 and conflict.value.reason == "Conflict"
    patched = client.request(
        "PATCH",
        "/api/v1/namespaces/default/secrets/s1",
        {"metadata": {"labels": {"a": "b"}}},
        "application/merge-patch+json",
    )
    assert patched["metadata"]["labels"] == {"a": "b"}
    with pytest.raises(ApiStatusError) as missing:
        client.get("/apis/apps/v1/namespaces/default/deployments/none")
    assert missing.value.status["message"] == 'deployments.apps "none" not found'
    assert missing.value.status["details"] == {"name": "none", "group": "apps", "kind": "deployments"}
    groups = client.get("/apis")
    assert {
        "name": "apps",
        "versions": [{"groupVersion": "apps/v1", "version": "v1"}],
        "preferredVersion": {"groupVersion": "apps/v1", "version": "v1"},
    } in groups["groups"]
    core = client.get("/api/v1")
    assert core["kind"] == "APIResourceList"
    assert any(r["name"] == "nodes" and r["namespaced"] is False and r["kind"] == "Node" for r in core["resources"])


def test_crd_name_must_match_plural_and_group(cluster):
    client = admin(cluster)
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "wrong.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Cluster",
            "names": {"plural": "gadgets", "kind": "Gadget"},
            "versions": [
                {"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {"type": "object"}}}
            ],
        },
    }
    with pytest.raises(ApiStatusError) as invalid:
        client.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    assert invalid.value.code == 422
    assert (
        'metadata.name: Invalid value: "wrong.example.com": must be spec.names.plural+"."+spec.group'
        in invalid.value.status["message"]
    )
    crd["metadata"]["name"] = "gadgets.example.com"
    client.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    resources = client.get("/apis/example.com/v1")
    assert resources["resources"][0]["name"] == "gadgets" and resources["resources"][0]["namespaced"] is False
