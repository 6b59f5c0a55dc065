"""Compares every backup file with the object the API serves now: custom resources byte for byte (as block YAML,
served key order); CRDs likewise except for what the API server's own controllers keep updating after the backup
(status, resourceVersion, managedFields), where the uid must still be the same."""

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
    response = api.call_api(
        path,
        "GET",
        header_params={"Accept": "application/json"},
        auth_settings=["BearerToken"],
        response_type=None,
        _preload_content=False,
        _return_http_data_only=True,
    )
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
        now = served(url)
        report["files"].append(os.path.relpath(path, root))
        with open(path, "rb") as handle:
            saved = handle.read()
        if parts[0] == "crds":
            saved, now = yaml.safe_load(saved), dict(now)
            for document in (saved, now):
                document.pop("status", None)
                document["metadata"] = {
                    key: value
                    for key, value in document["metadata"].items()
                    if key not in ("resourceVersion", "managedFields")
                }
            same = saved == now
        else:
            same = saved == yaml.safe_dump(now, default_flow_style=False, sort_keys=False, allow_unicode=True).encode()
        if not same:
            report["mismatches"].append(url)
report["files"].sort()
print(json.dumps(report))
