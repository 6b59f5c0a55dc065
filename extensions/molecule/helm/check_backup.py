"""Compares every backup file byte for byte with the object the API serves now (as block YAML, served key order)."""

import json
import os
import stat
import sys

import yaml
from kubernetes import config

backup, kubeconfig = sys.argv[1], sys.argv[2]
api = config.new_client_from_config(config_file=kubeconfig)
plurals = {}


def served(path):
    response = api.call_api(path, "GET", header_params={"Accept": "application/json"}, auth_settings=["BearerToken"],
                            response_type=None, _preload_content=False, _return_http_data_only=True)
    return json.loads(response.data)


for crd in served("/apis/apiextensions.k8s.io/v1/customresourcedefinitions")["items"]:
    plurals[(crd["spec"]["group"], crd["spec"]["names"]["kind"])] = crd["spec"]["names"]["plural"]
report = {"files": [], "mismatches": [], "bad_modes": []}
root = os.path.join(backup, "backups")
for current, dirs, files in os.walk(backup):
    if stat.S_IMODE(os.stat(current).st_mode) != 0o700:
        report["bad_modes"].append(current)
    for name in files:
        if stat.S_IMODE(os.stat(os.path.join(current, name)).st_mode) != 0o600:
            report["bad_modes"].append(os.path.join(current, name))
for current, dirs, files in os.walk(root):
    for name in sorted(files):
        path = os.path.join(current, name)
        parts = os.path.relpath(path, root)[: -len(".yaml")].split(os.sep)
        if parts[0] == "crds":
            url = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{parts[1]}"
        else:
            group, version, kind, obj = parts[0], parts[1], parts[-2], parts[-1]
            namespace = f"/namespaces/{parts[2]}" if len(parts) == 5 else ""
            url = f"/apis/{group}/{version}{namespace}/{plurals[(group, kind)]}/{obj}"
        expected = yaml.safe_dump(served(url), default_flow_style=False, sort_keys=False, allow_unicode=True).encode()
        report["files"].append(os.path.relpath(path, root))
        with open(path, "rb") as handle:
            if handle.read() != expected:
                report["mismatches"].append(url)
report["files"].sort()
print(json.dumps(report))
