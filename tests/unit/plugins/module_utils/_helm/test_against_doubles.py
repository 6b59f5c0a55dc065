"""helm_release and the CRD backup against the helm double and the API double (HTTPS, real TLS client auth)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import yaml

from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.backup import (
    BackupError, backup_crds, dump_object, make_upgrade_dir, save_release_inputs)
from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.policy import VersionPolicyError
from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.release import ReleaseFailed, ReleaseManager
from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.runner import (
    Helm, ReleasePendingError, ReleaseRequest)

from helm_charts import make_chart

kubernetes = pytest.importorskip("kubernetes")

GADGETS = """\
apiVersion: lab.example.com/v1
kind: Gadget
metadata: {name: blue, namespace: apps}
spec: {size: 3, token: s3cr3t-token}
---
apiVersion: lab.example.com/v1beta1
kind: Gadget
metadata: {name: red, namespace: default}
spec: {size: 1}
---
apiVersion: lab.example.com/v1
kind: Knob
metadata: {name: volume}
spec: {level: 11}
"""


def ensure(cluster, helm_binary, chart, values=None, check=False, diff=False, force=False, **kwargs):
    helm = Helm(helm_binary, cluster.control_plane.admin_conf)
    req = ReleaseRequest("web", "apps", str(chart), create_namespace=True, wait_timeout="30s", **kwargs)
    return ReleaseManager(helm, req, values or {}, force).ensure(check, diff)


def api_get_for(cluster):
    from ansible_collections.confidential.kubernetes.plugins.action.crd_backup import kubernetes_get

    return kubernetes_get(cluster.control_plane.admin_conf, None)


def test_install_rerun_upgrade_with_backup(cluster, helm_binary, tmp_path):
    chart = make_chart(tmp_path, version="1.0.0")
    assert ensure(cluster, helm_binary, chart, {"greeting": "hi"}, check=True)["changed"]
    first = ensure(cluster, helm_binary, chart, {"greeting": "hi"})
    assert (first["changed"], first["action"], first["revision"], first["status"]) == (True, "install", 1, "deployed")
    again = ensure(cluster, helm_binary, chart, {"greeting": "hi"})
    assert (again["changed"], again["action"], again["revision"]) == (False, "none", 1)

    node = cluster.control_plane
    assert node.kubectl("apply", "-f", "-", stdin=GADGETS).returncode == 0
    api_client, api_get = api_get_for(cluster)
    try:
        upgrade_dir = make_upgrade_dir(str(tmp_path / "upgrades"))
        counts = backup_crds(api_get, upgrade_dir)
        inputs = dict(release_name="web", release_namespace="apps", chart_ref=str(chart), merged_values={"greeting": "hi"})
        saved = save_release_inputs(upgrade_dir, [inputs])
        # Every file is byte for byte the object as a GET serves it now.
        served = {}
        for path in counts["files"]:
            relative = os.path.relpath(path, os.path.join(upgrade_dir, "backups"))
            parts = relative[:-len(".yaml")].split(os.sep)
            if parts[0] == "crds":
                url = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{parts[1]}"
            elif len(parts) == 5:
                group, version, namespace, kind, name = parts
                url = f"/apis/{group}/{version}/namespaces/{namespace}/{kind.lower()}s/{name}"
            else:
                group, version, kind, name = parts
                url = f"/apis/{group}/{version}/{kind.lower()}s/{name}"
            served[relative] = api_get(url)
            assert Path(path).read_bytes() == dump_object(served[relative]), relative
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    finally:
        api_client.close()
    assert sorted(served) == sorted([
        "crds/gadgets.lab.example.com.yaml",
        "crds/knobs.lab.example.com.yaml",
        "lab.example.com/v1/apps/Gadget/blue.yaml",
        "lab.example.com/v1/default/Gadget/red.yaml",
        "lab.example.com/v1beta1/apps/Gadget/blue.yaml",
        "lab.example.com/v1beta1/default/Gadget/red.yaml",
        "lab.example.com/v1/Knob/volume.yaml",
    ])
    assert (counts["crds"], counts["custom_resources"]) == (2, 5)
    assert served["lab.example.com/v1/apps/Gadget/blue.yaml"]["spec"]["token"] == "s3cr3t-token"
    for current, dirs, files in os.walk(upgrade_dir):
        assert stat.S_IMODE(os.stat(current).st_mode) == 0o700
    assert yaml.safe_load(Path(upgrade_dir, "values", "apps", "web.yaml").read_text()) == {"greeting": "hi"}
    assert Path(upgrade_dir, "charts", "apps", "web", chart.name).read_bytes() == chart.read_bytes()
    assert len(saved) == 2

    newer = make_chart(tmp_path, version="1.1.0")
    upgraded = ensure(cluster, helm_binary, newer, {"greeting": "hi"}, diff=True)
    assert (upgraded["action"], upgraded["previous_chart_version"], upgraded["revision"]) == ("upgrade", "1.0.0", 2)
    values_diff, manifest_diff = upgraded["diff"]
    assert "hi" not in values_diff["after"] and "greeting: <masked:" in values_diff["after"]
    assert "gadgets-1.0.0" in manifest_diff["before"] and "gadgets-1.1.0" in manifest_diff["after"]
    assert ensure(cluster, helm_binary, newer, {"greeting": "hi"})["changed"] is False


def test_backup_of_an_unreachable_cluster_fails(tmp_path):
    def api_get(path):
        raise ConnectionRefusedError("connection refused")

    with pytest.raises(BackupError, match="cannot list the CustomResourceDefinitions: connection refused"):
        backup_crds(api_get, make_upgrade_dir(str(tmp_path)))


def test_failing_hook_is_rolled_back_with_helms_message(cluster, helm_binary, tmp_path):
    ensure(cluster, helm_binary, make_chart(tmp_path, version="1.0.0"), {"greeting": "v1"})
    broken = make_chart(tmp_path, version="1.0.1", hook="fail")
    with pytest.raises(ReleaseFailed) as failed:
        ensure(cluster, helm_binary, broken, {"greeting": "v2"})
    assert "has been rolled back due to atomic being set: pre-upgrade hooks failed" in str(failed.value)
    result = failed.value.result
    assert result["rolled_back"] and result["status"] == "deployed" and result["deployed_chart_version"] == "1.0.0"
    assert "--atomic" in result["command"] and "--wait" in result["command"]


def test_skip_wait_failure_rolled_back_by_module(cluster, helm_binary, tmp_path):
    ensure(cluster, helm_binary, make_chart(tmp_path, version="1.0.0"))
    with pytest.raises(ReleaseFailed) as failed:
        ensure(cluster, helm_binary, make_chart(tmp_path, version="1.0.1", hook="fail"), wait=False)
    result = failed.value.result
    assert "--wait" not in result["command"] and "--atomic" not in result["command"]
    assert result["rolled_back"] and "rolled back to revision 1" in str(failed.value)
    assert (result["status"], result["deployed_chart_version"]) == ("deployed", "1.0.0")


def test_refusals_change_nothing(cluster, helm_binary, tmp_path):
    ensure(cluster, helm_binary, make_chart(tmp_path, version="1.1.0"))
    with pytest.raises(VersionPolicyError, match="downgrade from 1.1.0 to 1.0.0"):
        ensure(cluster, helm_binary, make_chart(tmp_path, version="1.0.0"))
    with pytest.raises(VersionPolicyError, match="minor versions may only advance by one"):
        ensure(cluster, helm_binary, make_chart(tmp_path, version="1.3.0"))
    schema = json.dumps({"type": "object", "properties": {"greeting": {"type": "string", "maxLength": 3,
                                                                       "pattern": "^[a-z]+$"}}})
    with pytest.raises(ReleaseFailed, match="values don't meet the specifications of the schema"):
        ensure(cluster, helm_binary, make_chart(tmp_path, version="1.1.1", schema=schema), {"greeting": "NOPE"})
    helm = Helm(helm_binary, cluster.control_plane.admin_conf)
    status = helm.status("web", "apps")
    assert (status.revision, status.status, status.chart_version) == (1, "deployed", "1.1.0")
    assert ensure(cluster, helm_binary, make_chart(tmp_path, version="1.3.0"), force=True)["revision"] == 2


def test_pending_upgrade_is_a_clear_error(cluster, helm_binary, tmp_path):
    ensure(cluster, helm_binary, make_chart(tmp_path, version="1.0.0"))
    with pytest.raises(ReleaseFailed, match="interrupted"):
        ensure(cluster, helm_binary, make_chart(tmp_path, version="1.0.1", hook="hang"))
    with pytest.raises(ReleasePendingError, match="stuck in pending-upgrade .revision 2."):
        ensure(cluster, helm_binary, make_chart(tmp_path, version="1.0.2"))
