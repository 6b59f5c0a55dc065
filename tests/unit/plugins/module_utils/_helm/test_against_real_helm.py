"""helm_release and the CRD backup with real helm 3.17 and 4.1 against a real API server 1.20 (tests/control_plane.py).

No kubelet runs pods there, so a pre-upgrade hook Job never completes: helm times out on it, which is how these
tests make an upgrade fail."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.backup import (
    BackupError,
    backup_crds,
    make_upgrade_dir,
    save_release_inputs,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.policy import VersionPolicyError
from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.release import ReleaseFailed, ReleaseManager
from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.runner import (
    Helm,
    ReleasePendingError,
    ReleaseRequest,
)

import control_plane
from helm_charts import make_chart

kubernetes = pytest.importorskip("kubernetes")

GADGETS = """\
apiVersion: lab.example.com/v1
kind: Gadget
metadata: {name: blue, namespace: NAMESPACE}
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


def ensure(
    cluster, helm_binary, namespace, chart, values=None, check=False, diff=False, skip_version_policy=False, **kwargs
):
    helm = Helm(helm_binary, str(cluster.admin_kubeconfig))
    kwargs.setdefault("wait_timeout", "10s")
    req = ReleaseRequest("web", namespace, str(chart), create_namespace=True, **kwargs)
    return ReleaseManager(helm, req, values or {}, skip_version_policy).ensure(check, diff)


def api_get_for(cluster):
    from ansible_collections.confidential.kubernetes.plugins.action.crd_backup import kubernetes_get

    return kubernetes_get(str(cluster.admin_kubeconfig), None)


def history(cluster, helm_binary, namespace) -> list[tuple[int, str]]:
    helm = Helm(helm_binary, str(cluster.admin_kubeconfig))
    if helm.status("web", namespace) is None:
        return []
    return [(entry["revision"], entry["status"]) for entry in helm.history("web", namespace)]


def test_install_rerun_upgrade_with_backup(kube_control_plane, helm_binary, release_namespace, tmp_path):
    cluster, namespace = kube_control_plane, release_namespace
    chart = make_chart(tmp_path, version="1.0.0")
    assert ensure(cluster, helm_binary, namespace, chart, {"greeting": "hi"}, check=True)["changed"]
    assert history(cluster, helm_binary, namespace) == []
    first = ensure(cluster, helm_binary, namespace, chart, {"greeting": "hi"})
    assert (first["changed"], first["action"], first["revision"], first["status"]) == (True, "install", 1, "deployed")
    again = ensure(cluster, helm_binary, namespace, chart, {"greeting": "hi"})
    assert (again["changed"], again["action"], again["revision"]) == (False, "none", 1)
    assert history(cluster, helm_binary, namespace) == [(1, "deployed")]

    gadgets = GADGETS.replace("NAMESPACE", namespace).encode()
    cluster.kubectl("apply", "-f", "-", stdin=gadgets)
    api_client, api_get = api_get_for(cluster)
    try:
        upgrade_dir = make_upgrade_dir(str(tmp_path / "upgrades"))
        counts = backup_crds(api_get, upgrade_dir)
        inputs = dict(
            release_name="web", release_namespace=namespace, chart_ref=str(chart), merged_values={"greeting": "hi"}
        )
        saved = save_release_inputs(upgrade_dir, [inputs])
        # Every file is byte for byte the object as a GET serves it now.
        served = {}
        for path in counts["files"]:
            relative = os.path.relpath(path, os.path.join(upgrade_dir, "backups"))
            parts = relative[: -len(".yaml")].split(os.sep)
            if parts[0] == "crds":
                url = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{parts[1]}"
            elif len(parts) == 5:
                group, version, object_namespace, kind, name = parts
                url = f"/apis/{group}/{version}/namespaces/{object_namespace}/{kind.lower()}s/{name}"
            else:
                group, version, kind, name = parts
                url = f"/apis/{group}/{version}/{kind.lower()}s/{name}"
            served[relative] = api_get(url)
            assert yaml.safe_load(Path(path).read_bytes()) == served[relative], relative
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    finally:
        api_client.close()
        cluster.kubectl("delete", "-f", "-", stdin=gadgets)
    assert sorted(served) == sorted(
        [
            "crds/gadgets.lab.example.com.yaml",
            "crds/knobs.lab.example.com.yaml",
            f"lab.example.com/v1/{namespace}/Gadget/blue.yaml",
            "lab.example.com/v1/default/Gadget/red.yaml",
            f"lab.example.com/v1beta1/{namespace}/Gadget/blue.yaml",
            "lab.example.com/v1beta1/default/Gadget/red.yaml",
            "lab.example.com/v1/Knob/volume.yaml",
        ]
    )
    assert (counts["crds"], counts["custom_resources"]) == (2, 5)
    assert served[f"lab.example.com/v1/{namespace}/Gadget/blue.yaml"]["spec"]["token"] == "s3cr3t-token"
    for current, dirs, files in os.walk(upgrade_dir):
        assert stat.S_IMODE(os.stat(current).st_mode) == 0o700
    assert yaml.safe_load(Path(upgrade_dir, "values", namespace, "web.yaml").read_text()) == {"greeting": "hi"}
    assert Path(upgrade_dir, "charts", namespace, "web", chart.name).read_bytes() == chart.read_bytes()
    assert len(saved) == 2

    newer = make_chart(tmp_path, version="1.1.0")
    upgraded = ensure(cluster, helm_binary, namespace, newer, {"greeting": "hi"}, diff=True)
    assert (upgraded["action"], upgraded["previous_chart_version"], upgraded["revision"]) == ("upgrade", "1.0.0", 2)
    values_diff, manifest_diff = upgraded["diff"]
    assert "hi" not in values_diff["after"] and "greeting: <masked:" in values_diff["after"]
    assert "gadgets-1.0.0" in manifest_diff["before"] and "gadgets-1.1.0" in manifest_diff["after"]
    assert ensure(cluster, helm_binary, namespace, newer, {"greeting": "hi"})["changed"] is False
    assert history(cluster, helm_binary, namespace) == [(1, "superseded"), (2, "deployed")]


def test_backup_of_an_unreachable_cluster_fails(tmp_path):
    def api_get(path):
        raise ConnectionRefusedError("connection refused")

    with pytest.raises(BackupError, match="cannot list the CustomResourceDefinitions: connection refused"):
        backup_crds(api_get, make_upgrade_dir(str(tmp_path)))


def test_hook_that_never_completes_is_rolled_back_with_helms_message(
    kube_control_plane, helm_binary, release_namespace, tmp_path
):
    cluster, namespace = kube_control_plane, release_namespace
    ensure(cluster, helm_binary, namespace, make_chart(tmp_path, version="1.0.0"), {"greeting": "v1"})
    broken = make_chart(tmp_path, version="1.0.1", hook=True)
    with pytest.raises(ReleaseFailed) as failed:
        ensure(cluster, helm_binary, namespace, broken, {"greeting": "v2"})
    assert "has been rolled back due to" in str(failed.value) and "pre-upgrade hooks failed" in str(failed.value)
    assert not str(failed.value).startswith(("Error", "level=", "time="))
    result = failed.value.result
    assert result["rolled_back"] and result["status"] == "deployed" and result["deployed_chart_version"] == "1.0.0"
    rollback_flag = "--rollback-on-failure" if result["helm_major_version"] >= 4 else "--atomic"
    assert rollback_flag in result["command"] and any(flag.startswith("--wait") for flag in result["command"])
    assert history(cluster, helm_binary, namespace) == [(1, "superseded"), (2, "failed"), (3, "deployed")]


def test_skip_wait_failure_rolled_back_by_module(kube_control_plane, helm_binary, release_namespace, tmp_path):
    cluster, namespace = kube_control_plane, release_namespace
    ensure(cluster, helm_binary, namespace, make_chart(tmp_path, version="1.0.0"))
    with pytest.raises(ReleaseFailed) as failed:
        ensure(cluster, helm_binary, namespace, make_chart(tmp_path, version="1.0.1", hook=True), wait=False)
    result = failed.value.result
    assert not any(flag.startswith("--wait") for flag in result["command"])
    assert "--atomic" not in result["command"] and "--rollback-on-failure" not in result["command"]
    assert result["rolled_back"] and "rolled back to revision 1" in str(failed.value)
    assert (result["status"], result["deployed_chart_version"]) == ("deployed", "1.0.0")
    assert history(cluster, helm_binary, namespace)[-1] == (3, "deployed")


def test_refusals_change_nothing(kube_control_plane, helm_binary, release_namespace, tmp_path):
    cluster, namespace = kube_control_plane, release_namespace
    ensure(cluster, helm_binary, namespace, make_chart(tmp_path, version="1.1.0"))
    with pytest.raises(VersionPolicyError, match="downgrade from 1.1.0 to 1.0.0"):
        ensure(cluster, helm_binary, namespace, make_chart(tmp_path, version="1.0.0"))
    with pytest.raises(VersionPolicyError, match="minor versions may only advance by one"):
        ensure(cluster, helm_binary, namespace, make_chart(tmp_path, version="1.3.0"))
    schema = json.dumps(
        {"type": "object", "properties": {"greeting": {"type": "string", "maxLength": 3, "pattern": "^[a-z]+$"}}}
    )
    with pytest.raises(ReleaseFailed, match="values don't meet the specifications of the schema"):
        ensure(
            cluster, helm_binary, namespace, make_chart(tmp_path, version="1.1.1", schema=schema), {"greeting": "NOPE"}
        )
    helm = Helm(helm_binary, str(cluster.admin_kubeconfig))
    status = helm.status("web", namespace)
    assert (status.revision, status.status, status.chart_version) == (1, "deployed", "1.1.0")
    assert history(cluster, helm_binary, namespace) == [(1, "deployed")]
    assert (
        ensure(cluster, helm_binary, namespace, make_chart(tmp_path, version="1.3.0"), skip_version_policy=True)[
            "revision"
        ]
        == 2
    )


def test_pending_upgrade_is_a_clear_error(kube_control_plane, helm_binary, release_namespace, tmp_path):
    """A helm killed in the middle of an upgrade leaves the release pending-upgrade; the module refuses to touch it."""
    cluster, namespace = kube_control_plane, release_namespace
    ensure(cluster, helm_binary, namespace, make_chart(tmp_path, version="1.0.0"))
    helm = Helm(helm_binary, str(cluster.admin_kubeconfig))
    upgrading = subprocess.Popen(
        [
            helm_binary,
            "upgrade",
            "web",
            str(make_chart(tmp_path, version="1.0.1", hook=True)),
            "--namespace",
            namespace,
            "--kubeconfig",
            str(cluster.admin_kubeconfig),
            "--timeout",
            "5m",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while helm.status("web", namespace).status != "pending-upgrade" and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        upgrading.send_signal(signal.SIGKILL)
        upgrading.wait()
    with pytest.raises(ReleasePendingError, match="stuck in pending-upgrade .revision 2."):
        ensure(cluster, helm_binary, namespace, make_chart(tmp_path, version="1.0.2"))
    assert history(cluster, helm_binary, namespace) == [(1, "deployed"), (2, "pending-upgrade")]


def test_backup_restores_into_an_empty_cluster(kube_control_plane, tmp_path):
    """The backup's files, less resourceVersion and uid, recreate every CRD and custom resource in a new cluster."""
    cluster, namespace = kube_control_plane, "restore-source"
    from helm_charts import CRDS

    cluster.kubectl("create", "namespace", namespace)
    cluster.kubectl("apply", "-f", "-", stdin=CRDS.encode())
    cluster.kubectl("wait", "--for=condition=established", "crd/gadgets.lab.example.com", "crd/knobs.lab.example.com")
    gadgets = GADGETS.replace("NAMESPACE", namespace).encode()
    cluster.kubectl("apply", "-f", "-", stdin=gadgets)
    api_client, api_get = api_get_for(cluster)
    try:
        counts = backup_crds(api_get, make_upgrade_dir(str(tmp_path / "upgrades")))
    finally:
        api_client.close()
        cluster.kubectl("delete", "-f", "-", stdin=gadgets)
    documents = [yaml.safe_load(Path(path).read_text()) for path in counts["files"]]
    for document in documents:
        for server_field in ("resourceVersion", "uid"):
            document["metadata"].pop(server_field, None)
    crds = [document for document in documents if document["kind"] == "CustomResourceDefinition"]
    custom_resources = [document for document in documents if document["kind"] != "CustomResourceDefinition"]

    empty = control_plane.start_control_plane()
    try:
        empty.kubectl("create", "namespace", namespace)
        empty.kubectl("create", "-f", "-", stdin=yaml.safe_dump_all(crds).encode())
        empty.kubectl("wait", "--for=condition=established", "crd/gadgets.lab.example.com", "crd/knobs.lab.example.com")
        # The backup holds every served version of an object; the storage version is the one to create.
        stored = [document for document in custom_resources if document["apiVersion"].endswith("/v1")]
        empty.kubectl("create", "-f", "-", stdin=yaml.safe_dump_all(stored).encode())
        restored = json.loads(
            empty.kubectl("get", "gadgets.lab.example.com,knobs.lab.example.com", "-A", "-o", "json").stdout
        )
    finally:
        control_plane.stop_control_plane(empty)
    assert sorted(
        (item["kind"], item["metadata"].get("namespace", ""), item["metadata"]["name"], json.dumps(item["spec"]))
        for item in restored["items"]
    ) == sorted(
        (
            document["kind"],
            document["metadata"].get("namespace", ""),
            document["metadata"]["name"],
            json.dumps(document["spec"]),
        )
        for document in stored
    )
    assert len(stored) == 3
