"""kubectl double against the API double: get/apply/delete/wait, CRDs and custom resources."""

from __future__ import annotations

import json

import yaml

from k8s_doubles_harness import CRD, WIDGET


def test_get_nodes_formats_and_errors(cluster):
    node = cluster.control_plane
    wide = node.kubectl("get", "nodes", "-o", "wide")
    assert wide.stdout.splitlines()[0].split() == [
        "NAME",
        "STATUS",
        "ROLES",
        "AGE",
        "VERSION",
        "INTERNAL-IP",
        "EXTERNAL-IP",
        "OS-IMAGE",
        "KERNEL-VERSION",
        "CONTAINER-RUNTIME",
    ]
    assert node.kubectl("get", "nodes", "-o", "name").stdout == "node/cp1\n"
    listing = yaml.safe_load(node.kubectl("get", "nodes", "-o", "yaml").stdout)
    assert listing["kind"] == "List" and listing["items"][0]["metadata"]["name"] == "cp1"
    missing = node.kubectl("get", "nodes", "nope")
    assert missing.returncode == 1
    assert missing.stderr == 'Error from server (NotFound): nodes "nope" not found\n'
    unknown = node.kubectl("get", "gizmos")
    assert unknown.returncode == 1
    assert unknown.stderr == 'error: the server doesn\'t have a resource type "gizmos"\n'
    waited = node.kubectl("wait", "--for=condition=Ready", "node/cp1", "--timeout=5s")
    assert waited.returncode == 0 and waited.stdout == "node/cp1 condition met\n"
    timed_out = node.kubectl("wait", "--for=condition=NetworkUnavailable", "node/cp1", "--timeout=1s")
    assert timed_out.returncode == 1
    assert "error: timed out waiting for the condition on nodes/cp1" in timed_out.stderr


def test_version_and_cluster_info(cluster):
    node = cluster.control_plane
    version = json.loads(node.kubectl("version", "-o", "json").stdout)
    assert version["clientVersion"]["gitVersion"] == version["serverVersion"]["gitVersion"] == "v1.31.4"
    info = node.kubectl("cluster-info")
    assert info.stdout.splitlines()[0] == f"Kubernetes control plane is running at https://{cluster.endpoint}"


def test_crd_and_custom_resource_lifecycle(cluster):
    node = cluster.control_plane
    crd_file = node.write("crd.yaml", CRD)
    assert (
        node.kubectl("apply", "-f", crd_file).stdout
        == "customresourcedefinition.apiextensions.k8s.io/widgets.example.com created\n"
    )
    assert (
        node.kubectl("apply", "-f", crd_file).stdout
        == "customresourcedefinition.apiextensions.k8s.io/widgets.example.com unchanged\n"
    )
    resources = node.kubectl("api-resources").stdout
    assert any(line.split()[:3] == ["widgets", "wd", "example.com/v1"] for line in resources.splitlines())

    created = node.kubectl("apply", "-f", "-", stdin=WIDGET.replace("{size}", "3"))
    assert created.returncode == 0, created.stderr
    assert created.stdout == "widget.example.com/small created\n"
    assert (
        node.kubectl("apply", "-f", "-", stdin=WIDGET.replace("{size}", "3")).stdout
        == "widget.example.com/small unchanged\n"
    )
    assert (
        node.kubectl("apply", "-f", "-", stdin=WIDGET.replace("{size}", "5")).stdout
        == "widget.example.com/small configured\n"
    )

    table = node.kubectl("get", "wd").stdout.splitlines()
    assert table[0].split() == ["NAME", "SIZE"] and table[1].split() == ["small", "5"]
    by_kind = json.loads(node.kubectl("get", "widget.example.com/small", "-o", "json").stdout)
    assert by_kind["spec"] == {"size": 5} and by_kind["apiVersion"] == "example.com/v1"
    other_version = json.loads(node.kubectl("get", "widgets.v1beta1.example.com", "small", "-o", "json").stdout)
    assert other_version["apiVersion"] == "example.com/v1beta1"
    assert node.kubectl("get", "widgets", "-l", "tier=test", "-o", "name").stdout == "widget.example.com/small\n"
    assert node.kubectl("get", "widgets", "-l", "tier=prod", "-o", "name").stdout == ""
    assert node.kubectl("get", "wd", "-n", "kube-system").stderr == "No resources found in kube-system namespace.\n"

    invalid = node.kubectl("apply", "-f", "-", stdin=WIDGET.replace("{size}", "big"))
    assert invalid.returncode == 1
    assert (
        invalid.stderr
        == 'The Widget "small" is invalid: spec.size: Invalid value: "string": spec.size in body must be of type integer: "string"\n'
    )
    unknown_field = node.kubectl("apply", "-f", "-", stdin=WIDGET.replace("{size}", "1\n  colour: red"))
    assert unknown_field.returncode == 1 and "spec.colour: field not declared in schema" in unknown_field.stderr

    deleted = node.kubectl("delete", "widgets", "small")
    assert deleted.stdout == 'widget.example.com "small" deleted\n'
    assert (
        node.kubectl("get", "wd", "small").stderr
        == 'Error from server (NotFound): widgets.example.com "small" not found\n'
    )
    assert node.kubectl("delete", "crd", "widgets.example.com").returncode == 0
    assert node.kubectl("get", "wd").stderr == 'error: the server doesn\'t have a resource type "wd"\n'


def test_custom_resource_in_same_file_as_crd_needs_crd_first(cluster):
    node = cluster.control_plane
    both = node.write("both.yaml", CRD + "---\n" + WIDGET.replace("{size}", "1"))
    first = node.kubectl("apply", "-f", both)
    assert first.returncode == 1
    assert first.stdout == "customresourcedefinition.apiextensions.k8s.io/widgets.example.com created\n"
    assert 'no matches for kind "Widget" in version "example.com/v1"\nensure CRDs are installed first' in first.stderr
    second = node.kubectl("apply", "-f", both)
    assert second.returncode == 0, second.stderr
    assert "widget.example.com/small created" in second.stdout


def test_cluster_scoped_crd_and_core_resources(cluster):
    node = cluster.control_plane
    crd = CRD.replace("scope: Namespaced", "scope: Cluster")
    assert node.kubectl("apply", "-f", "-", stdin=crd).returncode == 0
    made = node.kubectl("apply", "-f", "-", stdin=WIDGET.replace("{size}", "2"))
    assert made.returncode == 0, made.stderr
    assert json.loads(node.kubectl("get", "wd", "small", "-o", "json").stdout)["metadata"].get("namespace") is None
    manifest = """\
apiVersion: v1
kind: Namespace
metadata: {name: apps}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: apps}
data: {mode: strict}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: apps}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: web, image: nginx}]}
"""
    applied = node.kubectl("apply", "-f", "-", stdin=manifest)
    assert (
        applied.stdout == "namespace/apps created\nconfigmap/settings created\ndeployment.apps/web created\n"
    ), applied.stderr
    assert node.kubectl("get", "deploy", "-n", "apps").stdout.splitlines()[1].split()[:4] == ["web", "2/2", "2", "2"]
    missing_ns = node.kubectl(
        "apply", "-f", "-", stdin="apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x, namespace: nowhere}\n"
    )
    assert missing_ns.returncode == 1 and 'namespaces "nowhere" not found' in missing_ns.stderr
    everywhere = node.kubectl("get", "configmaps", "-A").stdout.splitlines()
    assert everywhere[0].split() == ["NAMESPACE", "NAME", "DATA", "AGE"]
    assert any(line.split()[:2] == ["apps", "settings"] for line in everywhere)


def test_jsonpath_and_labels(cluster):
    node = cluster.control_plane
    names = node.kubectl("get", "nodes", "-o", 'jsonpath={.items[*].metadata.name}{"\\n"}')
    assert names.stdout == "cp1\n"
    ready = node.kubectl("get", "node", "cp1", "-o", 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')
    assert ready.stdout == "True"
    assert node.kubectl("label", "node", "cp1", "zone=a").stdout == "node/cp1 labeled\n"
    refused = node.kubectl("label", "node", "cp1", "zone=b")
    assert refused.returncode == 1 and "'zone' already has a value (a), and --overwrite is false" in refused.stderr
    assert node.kubectl("get", "nodes", "-l", "zone=a", "-o", "name").stdout == "node/cp1\n"


def test_kube_apiserver_rejects_unknown_flags(make_node):
    result = make_node().run("kube-apiserver", "--no-such-flag=1")
    assert result.returncode == 1 and result.stderr == "Error: unknown flag: --no-such-flag\n"
    assert make_node().run("kube-apiserver", "--version").stdout == "Kubernetes v1.31.4\n"


def test_raw_and_cordon(cluster):
    node = cluster.control_plane
    assert node.kubectl("get", "--raw", "/healthz").stdout == "ok"
    assert node.kubectl("drain", "cp1", "--ignore-daemonsets").stdout == "node/cp1 cordoned\nnode/cp1 drained\n"
    assert node.kubectl("get", "nodes").stdout.splitlines()[1].split()[1] == "Ready,SchedulingDisabled"
    assert node.kubectl("cordon", "cp1").stdout == "node/cp1 already cordoned\n"
    assert node.kubectl("uncordon", "cp1").stdout == "node/cp1 uncordoned\n"
    assert node.kubectl("get", "nodes").stdout.splitlines()[1].split()[1] == "Ready"
