"""Real chart archives for the helm tests and the `helm` molecule scenario: a .tgz with one top directory, as
`helm package` makes, with CRDs in `crds/` (a namespaced kind with two served versions and one unserved, and a
cluster-scoped kind), a ConfigMap and a Secret from the values, and optionally a hook (pre-upgrade, or another): a Job, which
never completes where no kubelet runs pods (the lab, the loopback control plane), so helm times out on it."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

CRDS = """\
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
SECRET = """\
apiVersion: v1
kind: Secret
metadata:
  name: {{ .Release.Name }}-credentials
stringData:
  password: {{ .Values.password | quote }}
"""
HOOK = """\
apiVersion: batch/v1
kind: Job
metadata:
  name: {{ .Release.Name }}-migrate
  annotations:
    helm.sh/hook: HOOK_EVENT
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{name: migrate, image: busybox}]
"""


def make_chart(
    directory: Path,
    name: str = "gadgets",
    version: str = "1.0.0",
    crds: bool = True,
    hook: bool | str = False,
    schema: str | None = None,
    secret: bool = False,
) -> Path:
    """``<name>-<version>.tgz`` in ``directory``; ``hook`` adds a Job that never completes, run before upgrades (True)
    or at the hook event it names (for example ``pre-delete``)."""
    files = {
        "Chart.yaml": f'apiVersion: v2\nname: {name}\nversion: {version}\nappVersion: "{version}"\n',
        "values.yaml": "greeting: hello\n" + ('password: ""\n' if secret else ""),
        "templates/configmap.yaml": CONFIGMAP,
    }
    if secret:
        files["templates/secret.yaml"] = SECRET
    if crds:
        files["crds/crds.yaml"] = CRDS
    if hook:
        files["templates/hook.yaml"] = HOOK.replace("HOOK_EVENT", "pre-upgrade" if hook is True else hook)
    if schema:
        files["values.schema.json"] = schema
    archive = directory / f"{name}-{version}.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        for path, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{name}/{path}")
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return archive
