"""The official Python `kubernetes` client (used by the collection for CRD/CR backups) against the API double."""

from __future__ import annotations

import pytest

from k8s_doubles_harness import CRD, WIDGET

kubernetes = pytest.importorskip("kubernetes")


def test_official_client_lists_crds_and_custom_resources(cluster):
    node = cluster.control_plane
    assert node.kubectl("apply", "-f", "-", stdin=CRD).returncode == 0
    assert node.kubectl("apply", "-f", "-", stdin=WIDGET.replace("{size}", "4")).returncode == 0
    api_client = kubernetes.config.new_client_from_config(config_file=node.admin_conf)
    try:
        assert kubernetes.client.VersionApi(api_client).get_code().git_version == "v1.31.4"
        core = kubernetes.client.CoreV1Api(api_client)
        assert [n.metadata.name for n in core.list_node().items] == ["cp1"]
        crds = kubernetes.client.ApiextensionsV1Api(api_client).list_custom_resource_definition()
        assert [c.metadata.name for c in crds.items] == ["widgets.example.com"]
        assert crds.metadata.resource_version
        custom = kubernetes.client.CustomObjectsApi(api_client)
        everywhere = custom.list_cluster_custom_object("example.com", "v1", "widgets")
        assert everywhere["kind"] == "WidgetList"
        assert [(w["metadata"]["namespace"], w["metadata"]["name"]) for w in everywhere["items"]] == [
            ("default", "small")
        ]
        one = custom.get_namespaced_custom_object("example.com", "v1", "default", "widgets", "small")
        assert one["spec"] == {"size": 4}
        with pytest.raises(kubernetes.client.ApiException) as missing:
            core.read_namespaced_secret("nope", "default")
        assert missing.value.status == 404
        dynamic = kubernetes.dynamic.DynamicClient(api_client)
        widgets = dynamic.resources.get(api_version="example.com/v1", kind="Widget")
        assert [w.metadata.name for w in widgets.get(namespace="default").items] == ["small"]
    finally:
        api_client.close()
