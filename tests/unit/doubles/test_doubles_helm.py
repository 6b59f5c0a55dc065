"""helm double: charts, strict templates, schema, releases as Secrets, hooks, atomic rollback."""

from __future__ import annotations

import base64
import gzip
import json
import tarfile
from pathlib import Path

import pytest

CHART_YAML = """\
apiVersion: v2
name: demo
version: {version}
appVersion: "1.0"
"""
VALUES = "greeting: hello\nreplicas: 2\n"
SCHEMA = {
    "type": "object",
    "required": ["greeting"],
    "properties": {
        "greeting": {"type": "string"},
        "replicas": {"type": "integer", "minimum": 1},
        "hook": {"type": "string"},
    },
    "additionalProperties": False,
}
CONFIGMAP = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-settings
data:
  greeting: {{ .Values.greeting | quote }}
  chart: "{{ .Chart.Name }}-{{ .Chart.Version }}"
  replicas: "{{ .Values.replicas }}"
"""
HOOK = """\
apiVersion: batch/v1
kind: Job
metadata:
  name: {{ .Release.Name }}-migrate
  annotations:
    helm.sh/hook: pre-upgrade
    k8s-doubles.test/hook: {{ .Values.hook }}
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{name: migrate, image: busybox}]
"""
CRD = """\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: gadgets.example.com}
spec:
  group: example.com
  scope: Namespaced
  names: {plural: gadgets, kind: Gadget}
  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}]
"""


def make_chart(directory: Path, version: str = "0.1.0", hook: bool = False, template: str = CONFIGMAP) -> Path:
    chart = directory / f"demo-{version}"
    (chart / "templates").mkdir(parents=True)
    (chart / "crds").mkdir()
    (chart / "Chart.yaml").write_text(CHART_YAML.format(version=version))
    (chart / "values.yaml").write_text(VALUES + ("hook: succeed\n" if hook else ""))
    (chart / "values.schema.json").write_text(json.dumps(SCHEMA))
    (chart / "templates" / "configmap.yaml").write_text(template)
    (chart / "crds" / "gadgets.yaml").write_text(CRD)
    if hook:
        (chart / "templates" / "hook.yaml").write_text(HOOK)
    return chart


def helm(cluster, *args: str):
    node = cluster.control_plane
    return node.run("helm", *args, "--kubeconfig", node.admin_conf)


def configmap(cluster, name: str, namespace: str = "apps") -> dict:
    return json.loads(cluster.control_plane.kubectl("get", "cm", name, "-n", namespace, "-o", "json").stdout)


def test_version(make_node):
    result = make_node().run("helm", "version", "--short")
    assert result.returncode == 0 and result.stdout.startswith("v3.")


def test_install_from_tgz_records_release_secret(cluster, tmp_path):
    chart = make_chart(tmp_path)
    archive = tmp_path / "demo-0.1.0.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(chart, arcname="demo")
    result = helm(
        cluster,
        "install",
        "rel",
        str(archive),
        "-n",
        "apps",
        "--create-namespace",
        "--wait",
        "--timeout",
        "5m0s",
        "-o",
        "json",
    )
    assert result.returncode == 0, result.stderr
    release = json.loads(result.stdout)
    assert (release["name"], release["version"], release["info"]["status"]) == ("rel", 1, "deployed")
    assert configmap(cluster, "rel-settings")["data"] == {"greeting": "hello", "chart": "demo-0.1.0", "replicas": "2"}
    assert cluster.control_plane.kubectl("get", "crd", "gadgets.example.com").returncode == 0
    secret = json.loads(
        cluster.control_plane.kubectl("get", "secret", "-n", "apps", "sh.helm.release.v1.rel.v1", "-o", "json").stdout
    )
    assert secret["type"] == "helm.sh/release.v1"
    assert secret["metadata"]["labels"] == {"name": "rel", "owner": "helm", "status": "deployed", "version": "1"}
    stored = json.loads(gzip.decompress(base64.b64decode(base64.b64decode(secret["data"]["release"]))))
    assert stored["info"]["status"] == "deployed"
    listed = json.loads(helm(cluster, "list", "-n", "apps", "-o", "json").stdout)
    assert [(r["name"], r["revision"], r["status"], r["chart"]) for r in listed] == [
        ("rel", "1", "deployed", "demo-0.1.0")
    ]
    again = helm(cluster, "install", "rel", str(archive), "-n", "apps")
    assert again.returncode == 1
    assert again.stderr == "Error: INSTALLATION FAILED: cannot re-use a name that is still in use\n"


def test_upgrade_values_history_and_rollback(cluster, tmp_path):
    chart = make_chart(tmp_path)
    assert helm(cluster, "upgrade", "--install", "rel", str(chart), "-n", "apps", "--create-namespace").returncode == 0
    values = tmp_path / "override.yaml"
    values.write_text("greeting: bonjour\n")
    upgraded = helm(cluster, "upgrade", "rel", str(make_chart(tmp_path, "0.2.0")), "-n", "apps", "-f", str(values))
    assert upgraded.returncode == 0, upgraded.stderr
    assert upgraded.stdout.startswith('Release "rel" has been upgraded. Happy Helming!\n')
    assert configmap(cluster, "rel-settings")["data"]["greeting"] == "bonjour"
    assert json.loads(helm(cluster, "get", "values", "rel", "-n", "apps", "-o", "json").stdout) == {
        "greeting": "bonjour"
    }
    history = json.loads(helm(cluster, "history", "rel", "-n", "apps", "-o", "json").stdout)
    assert [(h["revision"], h["status"], h["chart"]) for h in history] == [
        (1, "superseded", "demo-0.1.0"),
        (2, "deployed", "demo-0.2.0"),
    ]
    assert helm(cluster, "rollback", "rel", "1", "-n", "apps").stdout == "Rollback was a success! Happy Helming!\n"
    assert configmap(cluster, "rel-settings")["data"]["greeting"] == "hello"
    status = json.loads(helm(cluster, "status", "rel", "-n", "apps", "-o", "json").stdout)
    assert (status["version"], status["info"]["status"], status["info"]["description"]) == (
        3,
        "deployed",
        "Rollback to 1",
    )


def test_schema_violation_is_rejected(cluster, tmp_path):
    chart = make_chart(tmp_path)
    result = helm(
        cluster, "install", "rel", str(chart), "-n", "default", "--set", "replicas=zero", "--set", "colour=red"
    )
    assert result.returncode == 1
    assert result.stderr == (
        "Error: INSTALLATION FAILED: values don't meet the specifications of the schema(s) in the following chart(s):\n"
        "demo:\n- replicas: Invalid type. Expected: integer, given: string\n"
        "- (root): Additional property colour is not allowed\n\n"
    )


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ('data: {{ include "x" . }}\n', 'not "include"'),
        ("data: {{ .Values.greeting | upper }}\n", 'function "upper" not defined'),
        ("data: {{ .Values.missing.deeper }}\n", "nil pointer evaluating interface {}.deeper"),
        ("data: {{ .Chart.Bogus }}\n", "can't evaluate field Bogus in type *chart.Metadata"),
    ],
)
def test_unsupported_or_failing_template_is_an_error(make_node, tmp_path, template, message):
    chart = make_chart(tmp_path, template="apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n" + template)
    result = make_node().run("helm", "template", "rel", str(chart))
    assert result.returncode == 1
    assert message in result.stderr


def test_bad_chart_version_is_rejected(make_node, tmp_path):
    chart = make_chart(tmp_path, version="one")
    result = make_node().run("helm", "template", "rel", str(chart))
    assert result.returncode == 1 and 'validation: chart.metadata.version "one" is invalid' in result.stderr


def test_template_renders_without_cluster(make_node, tmp_path):
    result = make_node().run("helm", "template", "rel", str(make_chart(tmp_path)), "--set", "greeting=hi")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("---\n# Source: demo/templates/configmap.yaml\n")
    assert "greeting: hi\n" in result.stdout


def test_failing_hook_without_atomic_leaves_release_failed(cluster, tmp_path):
    chart = make_chart(tmp_path, hook=True)
    assert helm(cluster, "install", "rel", str(chart), "-n", "apps", "--create-namespace").returncode == 0
    failed = helm(cluster, "upgrade", "rel", str(chart), "-n", "apps", "--set", "hook=fail", "--set", "greeting=new")
    assert failed.returncode == 1
    assert failed.stderr == (
        "Error: UPGRADE FAILED: pre-upgrade hooks failed: 1 error occurred:\n" "\t* job failed: BackoffLimitExceeded\n"
    )
    history = json.loads(helm(cluster, "history", "rel", "-n", "apps", "-o", "json").stdout)
    assert [h["status"] for h in history] == ["deployed", "failed"]
    assert configmap(cluster, "rel-settings")["data"]["greeting"] == "hello"


def test_failing_hook_with_atomic_rolls_back(cluster, tmp_path):
    chart = make_chart(tmp_path, hook=True)
    assert helm(cluster, "install", "rel", str(chart), "-n", "apps", "--create-namespace").returncode == 0
    failed = helm(cluster, "upgrade", "rel", str(chart), "-n", "apps", "--atomic", "--set", "hook=fail")
    assert failed.returncode == 1
    assert failed.stderr.startswith(
        "Error: UPGRADE FAILED: release rel failed, and has been rolled back due to atomic "
        "being set: pre-upgrade hooks failed:"
    )
    history = json.loads(helm(cluster, "history", "rel", "-n", "apps", "-o", "json").stdout)
    assert [(h["status"], h["description"]) for h in history][-1] == ("deployed", "Rollback to 1")
    assert [h["status"] for h in history] == ["superseded", "superseded", "deployed"]


def test_pending_release_refuses_upgrade(cluster, tmp_path):
    chart = make_chart(tmp_path, hook=True)
    assert helm(cluster, "install", "rel", str(chart), "-n", "apps", "--create-namespace").returncode == 0
    hung = helm(cluster, "upgrade", "rel", str(chart), "-n", "apps", "--set", "hook=hang")
    assert hung.returncode == 1
    assert (
        json.loads(helm(cluster, "status", "rel", "-n", "apps", "-o", "json").stdout)["info"]["status"]
        == "pending-upgrade"
    )
    refused = helm(cluster, "upgrade", "rel", str(chart), "-n", "apps")
    assert refused.returncode == 1
    assert refused.stderr == "Error: UPGRADE FAILED: another operation (install/upgrade/rollback) is in progress\n"
