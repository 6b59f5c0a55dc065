"""Builds the scenario's chart archives (.tgz, one top directory, as `helm package` makes) and values files."""

import io
import sys
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
TEMPLATES = {
    "templates/configmap.yaml": """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-settings
data:
  greeting: {{ .Values.greeting | quote }}
  chart: "{{ .Chart.Name }}-{{ .Chart.Version }}"
""",
    "templates/secret.yaml": """\
apiVersion: v1
kind: Secret
metadata:
  name: {{ .Release.Name }}-credentials
stringData:
  password: {{ .Values.password | quote }}
""",
}
HOOK = """\
apiVersion: batch/v1
kind: Job
metadata:
  name: {{ .Release.Name }}-migrate
  annotations:
    helm.sh/hook: pre-upgrade
    k8s-doubles.test/hook: BEHAVIOUR
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{name: migrate, image: busybox}]
"""
SCHEMA = '{"type": "object", "required": ["greeting"], "properties": {"greeting": {"type": "string", "pattern": "^[a-z ]+$"}}}'


def chart(directory: Path, version: str, hook: str = "") -> None:
    files = {
        "Chart.yaml": f"apiVersion: v2\nname: gadgets\nversion: {version}\nappVersion: \"{version}\"\n",
        "values.yaml": "greeting: hello\npassword: \"\"\n",
        "values.schema.json": SCHEMA,
        "crds/crds.yaml": CRDS,
        **TEMPLATES,
    }
    if hook:
        files["templates/hook.yaml"] = HOOK.replace("BEHAVIOUR", hook)
    with tarfile.open(directory / f"gadgets-{version}.tgz", "w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"gadgets/{name}")
            info.size = len(data)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(data))


def main() -> None:
    directory = Path(sys.argv[1])
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    for version in ("1.0.0", "1.1.0", "1.3.0"):
        chart(directory, version)
    chart(directory, "1.1.1", "fail")
    chart(directory, "1.1.2", "hang")
    (directory / "secret-values.yaml").write_text("password: lab-s3cret-value\n")
    (directory / "secret-values.yaml").chmod(0o600)


main()
