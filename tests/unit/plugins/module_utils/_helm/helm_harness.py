"""Shared by the helm tests: a control plane of the k8s doubles (API double over HTTPS on 127.0.0.1) and chart archives."""

from __future__ import annotations

import io
import sys
import tarfile
import textwrap
from pathlib import Path

DOUBLES_TESTS = Path(__file__).resolve().parents[4] / "unit" / "doubles"
sys.path.insert(0, str(DOUBLES_TESTS))

from k8s_doubles_harness import BIN, Cluster, Node, free_port, init_config, stop_pid  # noqa: E402

CRD = """\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gadgets.lab.example.com
spec:
  group: lab.example.com
  scope: Namespaced
  names: {plural: gadgets, singular: gadget, kind: Gadget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
  - name: v1beta1
    served: true
    storage: false
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
  - name: v1alpha1
    served: false
    storage: false
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: knobs.lab.example.com
spec:
  group: lab.example.com
  scope: Cluster
  names: {plural: knobs, singular: knob, kind: Knob}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
"""

CONFIGMAP = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-settings
data:
  greeting: {{ .Values.greeting | quote }}
  chart: "{{ .Chart.Name }}-{{ .Chart.Version }}"
"""

FAILING_HOOK = """\
apiVersion: batch/v1
kind: Job
metadata:
  name: migrate
  annotations:
    helm.sh/hook: pre-upgrade
    k8s-doubles.test/hook: {behaviour}
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{{name: migrate, image: busybox}}]
"""


def make_chart(directory: Path, name: str = "gadgets", version: str = "1.0.0", crds: bool = True,
               hook: str | None = None, schema: str | None = None) -> Path:
    """A real chart archive (.tgz with one top directory), as `helm package` makes."""
    files = {
        "Chart.yaml": f"apiVersion: v2\nname: {name}\nversion: {version}\nappVersion: \"{version}\"\n",
        "values.yaml": "greeting: hello\n",
        "templates/configmap.yaml": CONFIGMAP,
    }
    if crds:
        files["crds/gadgets.yaml"] = CRD
    if hook:
        files["templates/hook.yaml"] = FAILING_HOOK.format(behaviour=hook)
    if schema:
        files["values.schema.json"] = schema
    archive = directory / f"{name}-{version}{'-' + hook if hook else ''}.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        for path, text in files.items():
            data = textwrap.dedent(text).encode()
            info = tarfile.TarInfo(f"{name}/{path}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return archive


def control_plane(tmp_path: Path, monkeypatch):
    """A control plane initialised by the kubeadm double (a generator for fixtures); the helm double runs with this Python."""
    node = Node(tmp_path / "cp")
    node.root.mkdir()
    port = free_port()
    result = node.run("kubeadm", "init", "--config", init_config(node, port))
    pid = node.apiserver_pid()
    monkeypatch.setenv("K8S_DOUBLES_PYTHON", sys.executable)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    try:
        assert result.returncode == 0, result.stderr
        yield Cluster(node, port, "")
    finally:
        stop_pid(pid or node.apiserver_pid())


HELM_BINARY = str(BIN / "helm")
