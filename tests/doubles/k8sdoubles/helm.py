"""helm 3 double: charts from directories or .tgz, a strict template subset, releases as Secrets."""

from __future__ import annotations

import base64
import copy
import datetime as _dt
import gzip
import json
import os
import re
import sys
import tarfile
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import yaml

from .cli import Parsed, UsageError, parse
from .client import ApiStatusError, Client, load_kubeconfig, resource_path
from .common import DoubleError, parse_duration

HELM_VERSION = "v3.16.3"
HELM_COMMIT = "cfd07493f46efc9debd9cc1b02a0961186df7fdf"
HOOK_ANNOTATION = "helm.sh/hook"
DOUBLE_HOOK_ANNOTATION = "k8s-doubles.test/hook"
SEMVER = re.compile(r"^v?(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$")
PENDING = ("pending-install", "pending-upgrade", "pending-rollback")

# Resource kinds helm's client can map without discovery (kind -> (group, version, plural, namespaced)).
KNOWN_KINDS = {
    "Namespace": ("", "v1", "namespaces", False),
    "ConfigMap": ("", "v1", "configmaps", True),
    "Secret": ("", "v1", "secrets", True),
    "Service": ("", "v1", "services", True),
    "ServiceAccount": ("", "v1", "serviceaccounts", True),
    "Pod": ("", "v1", "pods", True),
    "Deployment": ("apps", "v1", "deployments", True),
    "DaemonSet": ("apps", "v1", "daemonsets", True),
    "StatefulSet": ("apps", "v1", "statefulsets", True),
    "Job": ("batch", "v1", "jobs", True),
    "CustomResourceDefinition": ("apiextensions.k8s.io", "v1", "customresourcedefinitions", False),
    "ClusterRole": ("rbac.authorization.k8s.io", "v1", "clusterroles", False),
    "ClusterRoleBinding": ("rbac.authorization.k8s.io", "v1", "clusterrolebindings", False),
    "Role": ("rbac.authorization.k8s.io", "v1", "roles", True),
    "RoleBinding": ("rbac.authorization.k8s.io", "v1", "rolebindings", True),
}


class HelmError(DoubleError):
    """Printed as `Error: <message>`, exit 1."""


# ---------------------------------------------------------------- charts


@dataclass
class Chart:
    metadata: dict
    values: dict
    templates: list[tuple[str, str]]
    crds: list[tuple[str, str]]
    schema: dict | None
    notes: str = ""

    @property
    def name(self) -> str:
        return self.metadata["name"]

    @property
    def version(self) -> str:
        return str(self.metadata["version"])


def _chart_files(path: Path) -> dict[str, bytes]:
    if path.is_dir():
        return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    if path.is_file():
        try:
            with tarfile.open(path, "r:gz") as archive:
                files = {}
                for member in archive.getmembers():
                    if not member.isfile():
                        continue
                    parts = member.name.split("/", 1)
                    if len(parts) != 2:
                        continue
                    handle = archive.extractfile(member)
                    files[parts[1]] = handle.read() if handle else b""
                return files
        except (tarfile.TarError, OSError) as exc:
            raise HelmError(
                f"file '{path}' does not appear to be a gzipped archive; got 'application/octet-stream'"
            ) from exc
    raise HelmError(f'path "{path}" not found')


def load_chart(reference: str) -> Chart:
    files = _chart_files(Path(reference))
    if "Chart.yaml" not in files:
        raise HelmError("Chart.yaml file is missing")
    try:
        metadata = yaml.safe_load(files["Chart.yaml"]) or {}
    except yaml.YAMLError as exc:
        raise HelmError(f"cannot load Chart.yaml: error converting YAML to JSON: {exc}") from None
    if not metadata.get("apiVersion"):
        raise HelmError("validation: chart.metadata.apiVersion is required")
    if metadata["apiVersion"] not in ("v1", "v2"):
        raise HelmError(f"validation: chart.metadata.apiVersion \"{metadata['apiVersion']}\" is invalid")
    if not metadata.get("name"):
        raise HelmError("validation: chart.metadata.name is required")
    if not metadata.get("version"):
        raise HelmError("validation: chart.metadata.version is required")
    if not SEMVER.match(str(metadata["version"])):
        raise HelmError(f"validation: chart.metadata.version \"{metadata['version']}\" is invalid")
    if metadata.get("type", "application") not in ("application", "library"):
        raise HelmError(f"validation: chart.metadata.type \"{metadata['type']}\" is invalid")
    values = yaml.safe_load(files.get("values.yaml", b"")) or {}
    schema = None
    if "values.schema.json" in files:
        try:
            schema = json.loads(files["values.schema.json"])
        except json.JSONDecodeError as exc:
            raise HelmError(f"cannot load values.schema.json: {exc}") from None
    templates = sorted(
        (name, data.decode())
        for name, data in files.items()
        if name.startswith("templates/") and name.endswith((".yaml", ".yml", ".tpl", ".txt"))
    )
    notes = next((data for name, data in templates if name == "templates/NOTES.txt"), "")
    templates = [(n, d) for n, d in templates if n != "templates/NOTES.txt"]
    crds = sorted(
        (name, data.decode())
        for name, data in files.items()
        if name.startswith("crds/") and name.endswith((".yaml", ".yml", ".json"))
    )
    return Chart(metadata, values, templates, crds, schema, notes)


# ---------------------------------------------------------------- values and schema


def merge_values(base: dict, override: dict) -> dict:
    result = copy.deepcopy(base)
    for key, value in override.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merge_values(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def _set_value(values: dict, assignment: str) -> None:
    key, sep, raw = assignment.partition("=")
    if not sep:
        raise HelmError(f'failed parsing --set data: key "{assignment}" has no value')
    target = values
    parts = key.split(".")
    for part in parts[:-1]:
        target = target.setdefault(part, {})
    value: object = raw
    if raw in ("true", "false"):
        value = raw == "true"
    elif re.fullmatch(r"-?\d+", raw):
        value = int(raw)
    elif raw == "null":
        value = None
    target[parts[-1]] = value


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def validate_schema(schema: dict, value: object, path: str, errors: list[str]) -> None:
    """A JSON-schema subset with gojsonschema's messages (what helm 3 prints)."""
    where = path or "(root)"
    expected = schema.get("type")
    if expected:
        allowed = expected if isinstance(expected, list) else [expected]
        given = _json_type(value)
        if given not in allowed and not (given == "integer" and "number" in allowed):
            errors.append(f"{where}: Invalid type. Expected: {', '.join(allowed)}, given: {given}")
            return
    if "enum" in schema and value not in schema["enum"]:
        choices = ", ".join(json.dumps(v) for v in schema["enum"])
        errors.append(f"{where}: {where} must be one of the following: {choices}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{where}: Must be greater than or equal to {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{where}: Must be less than or equal to {schema['maximum']}")
    if isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"], value):
        errors.append(f"{where}: Does not match pattern '{schema['pattern']}'")
    if isinstance(value, dict):
        for name in schema.get("required", []) or []:
            if name not in value:
                errors.append(f"{where}: {name} is required")
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            child = f"{path}.{key}" if path else key
            if key in properties:
                validate_schema(properties[key], item, child, errors)
            elif extra is False:
                errors.append(f"{where}: Additional property {key} is not allowed")
            elif isinstance(extra, dict):
                validate_schema(extra, item, child, errors)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            validate_schema(schema["items"], item, f"{path}.{index}" if path else str(index), errors)


# ---------------------------------------------------------------- templates

_ACTION = re.compile(r"\{\{(-?)(.*?)(-?)\}\}", re.S)
_KEYWORDS = {"if", "else", "end", "range", "with", "define", "template", "block", "include", "tpl", "break", "continue"}
_CHART_FIELDS = {
    "Name": "name",
    "Version": "version",
    "AppVersion": "appVersion",
    "Description": "description",
    "ApiVersion": "apiVersion",
    "Type": "type",
    "KubeVersion": "kubeVersion",
}


def _go_number(value: float) -> str:
    """fmt's %v of a float64 (helm reads values as JSON numbers)."""
    if value == 0:
        return "0"
    text = repr(float(value))
    digits_tuple = Decimal(text).normalize().as_tuple()
    digits = "".join(map(str, digits_tuple.digits))
    point = len(digits) + digits_tuple.exponent  # type: ignore[operator]
    exponent = point - 1
    eprec = 6
    if eprec > len(digits) and len(digits) >= point:
        eprec = len(digits)
    sign = "-" if value < 0 else ""
    if exponent < -4 or exponent >= eprec:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mantissa}e{'+' if exponent >= 0 else '-'}{abs(exponent):02d}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return f"{sign}{digits}{'0' * (point - len(digits))}"
    return f"{sign}{digits[:point]}.{digits[point:]}"


def _go_format(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return _go_number(value)
    if isinstance(value, list):
        return "[" + " ".join(_go_format(v) for v in value) + "]"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{_go_format(v)}" for k, v in sorted(value.items())) + "]"
    return str(value)


def render_template(name: str, text: str, context: dict, chart: Chart) -> str:
    out = []
    position = 0
    for match in _ACTION.finditer(text):
        literal = text[position : match.start()]
        if match.group(1):
            literal = literal.rstrip(" \t\r\n")
        out.append(literal)
        line = text.count("\n", 0, match.start()) + 1
        out.append(_evaluate(match.group(2).strip(), context, chart, name, line))
        position = match.end()
        if match.group(3):
            while position < len(text) and text[position] in " \t\r\n":
                position += 1
    out.append(text[position:])
    return "".join(out)


def _evaluate(action: str, context: dict, chart: Chart, name: str, line: int) -> str:
    where = f"{chart.name}/{name}"
    if action.startswith("/*") and action.endswith("*/"):
        return ""
    stages = [s.strip() for s in action.split("|")]
    head = stages[0].split()
    if not head:
        raise HelmError(f"parse error at ({where}:{line}): missing value for command")
    if head[0] in _KEYWORDS:
        raise HelmError(
            f"parse error at ({where}:{line}): the helm double supports only field references and the "
            f'quote function, not "{head[0]}" (see k8sdoubles/README.md)'
        )
    if len(head) != 1 or not head[0].startswith("."):
        raise HelmError(f'parse error at ({where}:{line}): function "{head[0]}" not defined')
    value = _lookup(head[0], context, chart, where, line)
    for stage in stages[1:]:
        if stage != "quote":
            function = stage.split()[0] if stage.split() else stage
            raise HelmError(f'parse error at ({where}:{line}): function "{function}" not defined')
        value = json.dumps(_go_format(value))
    return _go_format(value)


def _lookup(path: str, context: dict, chart: Chart, where: str, line: int) -> object:
    parts = path.split(".")[1:]
    if not parts or any(not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", p) for p in parts):
        raise HelmError(f'parse error at ({where}:{line}): bad character in "{path}"')
    if parts[0] == "Chart" and len(parts) > 1:
        if parts[1] not in _CHART_FIELDS:
            raise HelmError(
                f'template: {where}:{line}: executing "{where}" at <{path}>: can\'t evaluate field '
                f"{parts[1]} in type *chart.Metadata"
            )
        return chart.metadata.get(_CHART_FIELDS[parts[1]], "")
    current: object = context
    walked = ""
    for part in parts:
        if current is None:
            raise HelmError(
                f'template: {where}:{line}: executing "{where}" at <{walked}.{part}>: nil pointer '
                f"evaluating interface {{}}.{part}"
            )
        if not isinstance(current, dict):
            raise HelmError(
                f'template: {where}:{line}: executing "{where}" at <{walked}.{part}>: can\'t evaluate '
                f"field {part} in type interface {{}}"
            )
        current = current.get(part)
        walked += f".{part}"
    return current


def render_chart(chart: Chart, values: dict, release: dict) -> tuple[list[dict], list[dict], str]:
    """Returns (manifests, hooks, manifest text)."""
    context = {
        "Values": values,
        "Release": {
            "Name": release["name"],
            "Namespace": release["namespace"],
            "Revision": release["version"],
            "IsInstall": release["version"] == 1,
            "IsUpgrade": release["version"] > 1,
            "Service": "Helm",
        },
        "Capabilities": {"KubeVersion": {"Version": "v1.31.4", "Major": "1", "Minor": "31"}},
    }
    manifests, hooks, text = [], [], []
    for name, template in chart.templates:
        if Path(name).name.startswith("_"):
            continue
        rendered = render_template(name, template, context, chart)
        for chunk in re.split(r"^---\s*$", rendered, flags=re.M):
            try:
                document = yaml.safe_load(chunk)
            except yaml.YAMLError as exc:
                raise HelmError(
                    f"YAML parse error on {chart.name}/{name}: error converting YAML to JSON: {exc}"
                ) from None
            if not document:
                continue
            if not isinstance(document, dict) or "kind" not in document or "apiVersion" not in document:
                raise HelmError(
                    'unable to build kubernetes objects from release manifest: error validating "": '
                    "error validating data: [apiVersion not set, kind not set]"
                )
            annotations = (document.get("metadata") or {}).get("annotations") or {}
            if HOOK_ANNOTATION in annotations:
                hooks.append(document)
            else:
                manifests.append(document)
                text.append(f"---\n# Source: {chart.name}/{name}\n{yaml.safe_dump(document, sort_keys=False)}")
    return manifests, hooks, "".join(text)


# ---------------------------------------------------------------- releases


def _stamp() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")


def _encode(release: dict) -> str:
    return base64.b64encode(gzip.compress(json.dumps(release).encode())).decode()


def _decode(data: str) -> dict:
    raw = base64.b64decode(base64.b64decode(data))
    if raw[:3] == b"\x1f\x8b\x08":
        raw = gzip.decompress(raw)
    return json.loads(raw)


class Releases:
    """Helm's Secret storage driver."""

    def __init__(self, client: Client, namespace: str) -> None:
        self.client = client
        self.namespace = namespace

    def history(self, name: str) -> list[dict]:
        path = resource_path("", "v1", "secrets", self.namespace) + f"?labelSelector=owner%3Dhelm%2Cname%3D{name}"
        items = self.client.get(path).get("items", [])  # type: ignore[union-attr]
        releases = [_decode(item["data"]["release"]) for item in items]
        return sorted(releases, key=lambda r: r["version"])

    def all(self, all_namespaces: bool) -> list[dict]:
        namespace = "" if all_namespaces else self.namespace
        path = resource_path("", "v1", "secrets", namespace) + "?labelSelector=owner%3Dhelm"
        items = self.client.get(path).get("items", [])  # type: ignore[union-attr]
        latest: dict[tuple[str, str], dict] = {}
        for item in items:
            release = _decode(item["data"]["release"])
            key = (release["namespace"], release["name"])
            if key not in latest or latest[key]["version"] < release["version"]:
                latest[key] = release
        return [latest[k] for k in sorted(latest)]

    def save(self, release: dict) -> None:
        name = f"sh.helm.release.v1.{release['name']}.v{release['version']}"
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "helm.sh/release.v1",
            "metadata": {
                "name": name,
                "namespace": release["namespace"],
                "labels": {
                    "name": release["name"],
                    "owner": "helm",
                    "status": release["info"]["status"],
                    "version": str(release["version"]),
                },
            },
            "data": {"release": base64.b64encode(_encode(release).encode()).decode()},
        }
        path = resource_path("", "v1", "secrets", release["namespace"])
        try:
            self.client.request("POST", path, secret)
        except ApiStatusError as exc:
            if exc.code != 409:
                raise
            current = self.client.get(f"{path}/{name}")
            secret["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]  # type: ignore[index]
            self.client.request("PUT", f"{path}/{name}", secret)

    def delete_all(self, name: str) -> None:
        for release in self.history(name):
            self.client.request(
                "DELETE",
                resource_path("", "v1", "secrets", self.namespace, f"sh.helm.release.v1.{name}.v{release['version']}"),
            )


# ---------------------------------------------------------------- kube operations


class Kube:
    def __init__(self, client: Client) -> None:
        self.client = client

    def mapping(self, document: dict) -> tuple[str, str, str, bool]:
        group, _unused, version = document["apiVersion"].rpartition("/")
        known = KNOWN_KINDS.get(document["kind"])
        if known and known[0] == group and known[1] == version:
            return known
        try:
            listing = self.client.get(f"/apis/{group}/{version}" if group else f"/api/{version}")
        except ApiStatusError:
            listing = {}
        for resource in listing.get("resources", []):  # type: ignore[union-attr]
            if resource["kind"] == document["kind"] and "/" not in resource["name"]:
                return group, version, resource["name"], resource["namespaced"]
        raise HelmError(
            f"unable to build kubernetes objects from release manifest: resource mapping not found for "
            f"name: \"{document.get('metadata', {}).get('name', '')}\" namespace: \"\" from \"\": no matches "
            f"for kind \"{document['kind']}\" in version \"{document['apiVersion']}\"\nensure CRDs are installed first"
        )

    def apply(self, document: dict, namespace: str) -> None:
        group, version, plural, namespaced = self.mapping(document)
        document = copy.deepcopy(document)
        metadata = document.setdefault("metadata", {})
        target_ns = (metadata.get("namespace") or namespace) if namespaced else ""
        if namespaced:
            metadata["namespace"] = target_ns
        metadata.setdefault("labels", {})
        path = resource_path(group, version, plural, target_ns)
        try:
            self.client.request("POST", path, document)
        except ApiStatusError as exc:
            if exc.code != 409:
                raise
            current = self.client.get(f"{path}/{metadata['name']}")
            metadata["resourceVersion"] = current["metadata"]["resourceVersion"]  # type: ignore[index]
            self.client.request("PUT", f"{path}/{metadata['name']}", document)

    def delete(self, document: dict, namespace: str) -> None:
        group, version, plural, namespaced = self.mapping(document)
        metadata = document.get("metadata", {})
        target_ns = (metadata.get("namespace") or namespace) if namespaced else ""
        try:
            self.client.request("DELETE", resource_path(group, version, plural, target_ns, metadata["name"]))
        except ApiStatusError as exc:
            if exc.code != 404:
                raise

    def exists(self, document: dict) -> bool:
        group, version, plural, _unused = self.mapping(document)
        try:
            self.client.get(resource_path(group, version, plural, "", document["metadata"]["name"]))
            return True
        except ApiStatusError as exc:
            if exc.code == 404:
                return False
            raise


# ---------------------------------------------------------------- commands


@dataclass
class Options:
    namespace: str
    flags: Parsed
    client: Client | None = None
    values: dict = field(default_factory=dict)


def _user_values(flags: Parsed) -> dict:
    values: dict = {}
    for path in flags.get("values") or []:  # type: ignore[union-attr]
        try:
            text = sys.stdin.read() if path == "-" else Path(str(path)).read_text()
        except OSError:
            raise HelmError(f"open {path}: no such file or directory") from None
        try:
            loaded = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise HelmError(f"failed to parse {path}: error converting YAML to JSON: {exc}") from None
        if not isinstance(loaded, dict):
            raise HelmError(
                f"failed to parse {path}: error unmarshaling JSON: json: cannot unmarshal array into Go value of type map[string]interface {{}}"
            )
        values = merge_values(values, loaded)
    for assignment in flags.get("set") or []:  # type: ignore[union-attr]
        _set_value(values, str(assignment))
    return values


def _client(flags: Parsed) -> Client:
    path = (
        flags.get("kubeconfig")
        or os.environ.get("KUBECONFIG", "").split(":")[0]
        or str(Path.home() / ".kube" / "config")
    )
    try:
        return Client(load_kubeconfig(str(path), flags.get("kube-context"))[1])  # type: ignore[arg-type]
    except DoubleError as exc:
        raise HelmError(f"Kubernetes cluster unreachable: {exc}") from None


def _release_output(release: dict, output: str, show_notes: bool = True) -> None:
    if output == "json":
        print(json.dumps(release))
        return
    if output == "yaml":
        sys.stdout.write(yaml.safe_dump(release, sort_keys=False))
        return
    deployed = _dt.datetime.strptime(release["info"]["last_deployed"][:19], "%Y-%m-%dT%H:%M:%S")
    print(f"NAME: {release['name']}")
    print(f"LAST DEPLOYED: {deployed.strftime('%a %b %e %H:%M:%S %Y')}")
    print(f"NAMESPACE: {release['namespace']}")
    print(f"STATUS: {release['info']['status']}")
    print(f"REVISION: {release['version']}")
    print("TEST SUITE: None")
    if show_notes and release["info"].get("notes"):
        print("NOTES:")
        print(release["info"]["notes"].rstrip("\n"))


def _new_release(
    name: str, namespace: str, chart: Chart, config: dict, version: int, status: str, description: str
) -> dict:
    now = _stamp()
    return {
        "name": name,
        "info": {
            "first_deployed": now,
            "last_deployed": now,
            "deleted": "",
            "description": description,
            "status": status,
            "notes": "",
        },
        "chart": {
            "metadata": chart.metadata,
            "values": chart.values,
            "schema": chart.schema,
            "templates": [{"name": n, "data": base64.b64encode(d.encode()).decode()} for n, d in chart.templates],
            "crds": [{"name": n, "data": base64.b64encode(d.encode()).decode()} for n, d in chart.crds],
        },
        "config": config,
        "manifest": "",
        "hooks": [],
        "version": version,
        "namespace": namespace,
    }


def _chart_of(release: dict) -> Chart:
    stored = release["chart"]
    return Chart(
        stored["metadata"],
        stored.get("values") or {},
        [(t["name"], base64.b64decode(t["data"]).decode()) for t in stored.get("templates") or []],
        [(t["name"], base64.b64decode(t["data"]).decode()) for t in stored.get("crds") or []],
        stored.get("schema"),
    )


def _run_hooks(hooks: list[dict], event: str, kube: Kube, namespace: str, release: dict) -> None:
    for hook in hooks:
        annotations = hook["metadata"].get("annotations") or {}
        if event not in [e.strip() for e in annotations[HOOK_ANNOTATION].split(",")]:
            continue
        behaviour = annotations.get(DOUBLE_HOOK_ANNOTATION, "succeed")
        name = hook["metadata"].get("name", "")
        kube.apply(hook, namespace)
        if behaviour == "hang":
            # A helm process killed while waiting: the release stays pending, as in real life.
            raise HelmError(
                f"the helm double was interrupted while waiting for hook {name} "
                f"({DOUBLE_HOOK_ANNOTATION}: hang); release {release['name']} is left {release['info']['status']}"
            )
        if behaviour == "fail":
            kind = hook.get("kind", "")
            reason = "job failed: BackoffLimitExceeded" if kind == "Job" else f"pod {name} failed"
            raise _HookFailure(f"{event} hooks failed: 1 error occurred:\n\t* {reason}")
        if annotations.get("helm.sh/hook-delete-policy", "before-hook-creation").find("hook-succeeded") >= 0:
            kube.delete(hook, namespace)


class _HookFailure(HelmError):
    pass


def _prepare(chart_ref: str, flags: Parsed) -> tuple[Chart, dict, dict]:
    # Like helm's LocateChart, --version does not apply to a chart given as a local path.
    chart = load_chart(chart_ref)
    if chart.metadata.get("type") == "library":
        raise HelmError("library charts are not installable")
    config = _user_values(flags)
    values = merge_values(chart.values, config)
    if chart.schema is not None:
        errors: list[str] = []
        validate_schema(chart.schema, values, "", errors)
        if errors:
            raise HelmError(
                "values don't meet the specifications of the schema(s) in the following chart(s):\n"
                f"{chart.name}:\n" + "\n".join(f"- {e}" for e in errors) + "\n"
            )
    if flags.get("timeout"):
        try:
            parse_duration(str(flags.get("timeout")))
        except ValueError as exc:
            raise UsageError(f'invalid argument "{flags.get("timeout")}" for "--timeout" flag: {exc}') from None
    return chart, config, values


def _ensure_namespace(client: Client, namespace: str, create: bool) -> None:
    try:
        client.get(f"/api/v1/namespaces/{namespace}")
    except ApiStatusError as exc:
        if exc.code != 404:
            raise
        if not create:
            raise HelmError(f'create: failed to create: namespaces "{namespace}" not found') from None
        client.request(
            "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        )


def _install(name: str, chart_ref: str, namespace: str, flags: Parsed) -> dict:
    chart, config, values = _prepare(chart_ref, flags)
    client = _client(flags)
    releases = Releases(client, namespace)
    history = releases.history(name)
    if history and history[-1]["info"]["status"] != "uninstalled":
        raise HelmError("cannot re-use a name that is still in use")
    _ensure_namespace(client, namespace, bool(flags.get("create-namespace")))
    kube = Kube(client)
    version = history[-1]["version"] + 1 if history else 1
    release = _new_release(name, namespace, chart, config, version, "pending-install", "Initial install underway")
    manifests, hooks, text = render_chart(chart, values, release)
    release["manifest"] = text
    release["hooks"] = hooks
    for _unused, crd_text in chart.crds:
        for document in yaml.safe_load_all(crd_text):
            if document and not kube.exists(document):
                kube.apply(document, namespace)
    releases.save(release)
    try:
        _run_hooks(hooks, "pre-install", kube, namespace, release)
        for document in manifests:
            kube.apply(document, namespace)
        _run_hooks(hooks, "post-install", kube, namespace, release)
    except _HookFailure as exc:
        release["info"].update(status="failed", description=f'Release "{name}" failed: {exc}')
        releases.save(release)
        if flags.get("atomic"):
            for document in manifests:
                kube.delete(document, namespace)
            releases.delete_all(name)
            raise HelmError(f"release {name} failed, and has been uninstalled due to atomic being set: {exc}") from None
        raise HelmError(str(exc)) from None
    except ApiStatusError as exc:
        release["info"].update(status="failed", description=f'Release "{name}" failed: {exc}')
        releases.save(release)
        raise HelmError(f"{exc}") from None
    release["info"].update(status="deployed", description="Install complete", notes=_notes(chart, values, release))
    releases.save(release)
    return release


def _notes(chart: Chart, values: dict, release: dict) -> str:
    if not chart.notes:
        return ""
    context = {
        "Values": values,
        "Release": {"Name": release["name"], "Namespace": release["namespace"], "Revision": release["version"]},
    }
    return render_template("templates/NOTES.txt", chart.notes, context, chart)


def _upgrade(name: str, chart_ref: str, namespace: str, flags: Parsed) -> dict:
    chart, config, values = _prepare(chart_ref, flags)
    client = _client(flags)
    releases = Releases(client, namespace)
    history = releases.history(name)
    if not history:
        raise HelmError(f'"{name}" has no deployed releases')
    latest = history[-1]
    if latest["info"]["status"] in PENDING:
        raise HelmError("another operation (install/upgrade/rollback) is in progress")
    deployed = next((r for r in reversed(history) if r["info"]["status"] == "deployed"), None)
    if deployed is None and latest["info"]["status"] in ("failed", "superseded"):
        # helm upgrades from the last failed release when nothing was ever deployed successfully.
        deployed = latest
    if deployed is None:
        raise HelmError(f'"{name}" has no deployed releases')
    if flags.get("reuse-values"):
        config = merge_values(deployed["config"], config)
        values = merge_values(chart.values, config)
    kube = Kube(client)
    release = _new_release(
        name, namespace, chart, config, latest["version"] + 1, "pending-upgrade", "Preparing upgrade"
    )
    release["info"]["first_deployed"] = history[0]["info"]["first_deployed"]
    manifests, hooks, text = render_chart(chart, values, release)
    release["manifest"] = text
    release["hooks"] = hooks
    releases.save(release)
    try:
        _run_hooks(hooks, "pre-upgrade", kube, namespace, release)
        for document in manifests:
            kube.apply(document, namespace)
        old = _manifest_objects(deployed["manifest"])
        keep = {(d["kind"], d["metadata"]["name"]) for d in manifests}
        for document in old:
            if (document["kind"], document["metadata"]["name"]) not in keep:
                kube.delete(document, namespace)
        _run_hooks(hooks, "post-upgrade", kube, namespace, release)
    except (_HookFailure, ApiStatusError) as exc:
        release["info"].update(status="failed", description=f'Upgrade "{name}" failed: {exc}')
        releases.save(release)
        if flags.get("atomic"):
            _rollback(releases, kube, name, namespace, deployed, release)
            raise HelmError(f"release {name} failed, and has been rolled back due to atomic being set: {exc}") from None
        raise HelmError(str(exc)) from None
    deployed["info"]["status"] = "superseded"
    releases.save(deployed)
    release["info"].update(status="deployed", description="Upgrade complete", notes=_notes(chart, values, release))
    releases.save(release)
    return release


def _manifest_objects(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text or "") if d]


def _rollback(releases: Releases, kube: Kube, name: str, namespace: str, target: dict, current: dict) -> dict:
    chart = _chart_of(target)
    release = _new_release(
        name,
        namespace,
        chart,
        target["config"],
        current["version"] + 1,
        "pending-rollback",
        f"Rollback to {target['version']}",
    )
    release["manifest"], release["hooks"] = target["manifest"], target.get("hooks") or []
    release["info"]["first_deployed"] = target["info"]["first_deployed"]
    releases.save(release)
    wanted = _manifest_objects(target["manifest"])
    for document in wanted:
        kube.apply(document, namespace)
    keep = {(d["kind"], d["metadata"]["name"]) for d in wanted}
    for document in _manifest_objects(current["manifest"]):
        if (document["kind"], document["metadata"]["name"]) not in keep:
            kube.delete(document, namespace)
    for previous in releases.history(name):
        if previous["version"] != release["version"] and previous["info"]["status"] in ("deployed", "failed"):
            previous["info"]["status"] = "superseded"
            releases.save(previous)
    release["info"].update(status="deployed", description=f"Rollback to {target['version']}")
    releases.save(release)
    return release


def ui_table(rows: list[list[str]]) -> str:
    """gosuri/uitable as helm configures it: cells padded to the column width, joined by tabs."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "\t".join(cell.ljust(widths[i]) if i < len(row) - 1 else cell for i, cell in enumerate(row)) for row in rows
    ]
    return "\n".join(lines) + "\n"


def _list_row(release: dict) -> dict:
    stamp = release["info"]["last_deployed"]
    updated = f"{stamp[:10]} {stamp[11:-1]} +0000 UTC"
    chart = release["chart"]["metadata"]
    return {
        "name": release["name"],
        "namespace": release["namespace"],
        "revision": str(release["version"]),
        "updated": updated,
        "status": release["info"]["status"],
        "chart": f"{chart['name']}-{chart['version']}",
        "app_version": str(chart.get("appVersion", "")),
    }


COMMON_FLAGS = {"kubeconfig": "str", "kube-context": "str", "namespace": "str", "debug": "bool", "output": "str"}
COMMON_SHORTS = {"n": "namespace", "o": "output"}
INSTALL_FLAGS = {
    "create-namespace": "bool",
    "version": "str",
    "values": "array",
    "set": "array",
    "atomic": "bool",
    "wait": "bool",
    "wait-for-jobs": "bool",
    "timeout": "str",
    "install": "bool",
    "reuse-values": "bool",
    "reset-values": "bool",
    "dry-run": "bool",
    "force": "bool",
    "cleanup-on-fail": "bool",
    "skip-crds": "bool",
    "description": "str",
    "generate-name": "bool",
    "history-max": "str",
}


def main(argv: list[str]) -> int:
    try:
        return _main(argv)
    except UsageError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    except DoubleError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1


def _main(argv: list[str]) -> int:
    if not argv:
        print("The Kubernetes package manager (test double)", file=sys.stderr)
        return 1
    command, rest = argv[0], argv[1:]
    namespace_default = "default"
    if command == "version":
        flags = parse(rest, {"short": "bool", "template": "str", "client": "bool"}, {"c": "client"})
        if flags.get("short"):
            print(f"{HELM_VERSION}+g{HELM_COMMIT[:7]}")
        else:
            print(
                f'version.BuildInfo{{Version:"{HELM_VERSION}", GitCommit:"{HELM_COMMIT}", GitTreeState:"clean", GoVersion:"go1.22.7"}}'
            )
        return 0
    if command in ("install", "upgrade"):
        flags = parse(rest, {**COMMON_FLAGS, **INSTALL_FLAGS}, {**COMMON_SHORTS, "f": "values", "i": "install"})
        namespace = str(flags.get("namespace") or namespace_default)
        if len(flags.args) != 2:
            raise UsageError(f'"helm {command}" requires 2 arguments\n\nUsage:  helm {command} [NAME] [CHART] [flags]')
        name, chart_ref = flags.args
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", name) or len(name) > 53:
            raise HelmError(
                f'INSTALLATION FAILED: release name "{name}": invalid release name, must match regex '
                "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$ and the length must not be longer than 53"
            )
        output = str(flags.get("output") or "table")
        if command == "install":
            try:
                release = _install(name, chart_ref, namespace, flags)
            except HelmError as exc:
                raise HelmError(f"INSTALLATION FAILED: {exc}") from None
            _release_output(release, output)
            return 0
        try:
            history = Releases(_client(flags), namespace).history(name)
            if flags.get("install") and (not history or all(r["info"]["status"] == "uninstalled" for r in history)):
                if output == "table":
                    print(f'Release "{name}" does not exist. Installing it now.')
                release = _install(name, chart_ref, namespace, flags)
            else:
                release = _upgrade(name, chart_ref, namespace, flags)
                if output == "table":
                    print(f'Release "{name}" has been upgraded. Happy Helming!')
        except HelmError as exc:
            raise HelmError(f"UPGRADE FAILED: {exc}") from None
        _release_output(release, output)
        return 0
    if command == "rollback":
        flags = parse(
            rest,
            {**COMMON_FLAGS, "wait": "bool", "timeout": "str", "force": "bool", "cleanup-on-fail": "bool"},
            COMMON_SHORTS,
        )
        if not 1 <= len(flags.args) <= 2:
            raise UsageError('"helm rollback" requires at least 1 argument')
        namespace = str(flags.get("namespace") or namespace_default)
        client = _client(flags)
        releases = Releases(client, namespace)
        history = releases.history(flags.args[0])
        if not history:
            raise HelmError("release: not found")
        current = history[-1]
        if current["info"]["status"] in PENDING:
            raise HelmError("another operation (install/upgrade/rollback) is in progress")
        wanted = int(flags.args[1]) if len(flags.args) == 2 else 0
        if wanted == 0:
            if len(history) < 2:
                raise HelmError(f"release has no {current['version'] - 1} version")
            target = history[-2]
        else:
            target = next((r for r in history if r["version"] == wanted), None)
            if target is None:
                raise HelmError(f"release has no {wanted} version")
        _rollback(releases, Kube(client), flags.args[0], namespace, target, current)
        print("Rollback was a success! Happy Helming!")
        return 0
    if command in ("list", "ls"):
        flags = parse(
            rest,
            {
                **COMMON_FLAGS,
                "all-namespaces": "bool",
                "all": "bool",
                "short": "bool",
                "failed": "bool",
                "deployed": "bool",
                "pending": "bool",
                "filter": "str",
            },
            {**COMMON_SHORTS, "A": "all-namespaces", "a": "all", "q": "short"},
        )
        namespace = str(flags.get("namespace") or namespace_default)
        releases = Releases(_client(flags), namespace).all(bool(flags.get("all-namespaces")))
        wanted_states = {s for s in ("failed", "deployed", "pending") if flags.get(s)}
        rows = []
        for release in releases:
            status = release["info"]["status"]
            if wanted_states:
                bucket = "pending" if status in PENDING else status
                if bucket not in wanted_states:
                    continue
            elif not flags.get("all") and status not in ("deployed", "failed"):
                continue
            if flags.get("filter") and not re.search(str(flags.get("filter")), release["name"]):
                continue
            rows.append(_list_row(release))
        output = str(flags.get("output") or "table")
        if output == "json":
            print(json.dumps(rows))
        elif output == "yaml":
            sys.stdout.write(yaml.safe_dump(rows, sort_keys=False))
        elif flags.get("short"):
            for row in rows:
                print(row["name"])
        else:
            table = [["NAME", "NAMESPACE", "REVISION", "UPDATED", "STATUS", "CHART", "APP VERSION"]]
            table += [
                [r["name"], r["namespace"], r["revision"], r["updated"], r["status"], r["chart"], r["app_version"]]
                for r in rows
            ]
            sys.stdout.write(ui_table(table))
        return 0
    if command in ("status", "history", "hist", "uninstall", "delete", "del", "un"):
        flags = parse(
            rest,
            {
                **COMMON_FLAGS,
                "revision": "str",
                "max": "str",
                "keep-history": "bool",
                "wait": "bool",
                "timeout": "str",
                "show-desc": "bool",
                "show-resources": "bool",
            },
            COMMON_SHORTS,
        )
        if len(flags.args) != 1:
            raise UsageError(f'"helm {command}" requires 1 argument')
        namespace = str(flags.get("namespace") or namespace_default)
        client = _client(flags)
        releases = Releases(client, namespace)
        history = releases.history(flags.args[0])
        if not history:
            if command in ("uninstall", "delete", "del", "un"):
                raise HelmError(f"uninstall: Release not loaded: {flags.args[0]}: release: not found")
            raise HelmError("release: not found")
        output = str(flags.get("output") or "table")
        if command == "status":
            release = history[-1]
            if flags.get("revision"):
                release = next((r for r in history if r["version"] == int(str(flags.get("revision")))), None)  # type: ignore[assignment]
                if release is None:
                    raise HelmError("release: not found")
            _release_output(release, output)
            return 0
        if command in ("history", "hist"):
            rows = [
                {
                    "revision": r["version"],
                    "updated": r["info"]["last_deployed"],
                    "status": r["info"]["status"],
                    "chart": f"{r['chart']['metadata']['name']}-{r['chart']['metadata']['version']}",
                    "app_version": str(r["chart"]["metadata"].get("appVersion", "")),
                    "description": r["info"]["description"],
                }
                for r in history
            ]
            if output == "json":
                print(json.dumps(rows))
            elif output == "yaml":
                sys.stdout.write(yaml.safe_dump(rows, sort_keys=False))
            else:
                table = [["REVISION", "UPDATED", "STATUS", "CHART", "APP VERSION", "DESCRIPTION"]]
                table += [
                    [str(r["revision"]), r["updated"], r["status"], r["chart"], r["app_version"], r["description"]]
                    for r in rows
                ]
                sys.stdout.write(ui_table(table))
            return 0
        kube = Kube(client)
        for document in _manifest_objects(history[-1]["manifest"]):
            kube.delete(document, namespace)
        releases.delete_all(flags.args[0])
        print(f'release "{flags.args[0]}" uninstalled')
        return 0
    if command == "get":
        if not rest or rest[0] not in ("values", "manifest"):
            raise UsageError('the helm double implements only "helm get values" and "helm get manifest"')
        flags = parse(rest[1:], {**COMMON_FLAGS, "all": "bool", "revision": "str"}, {**COMMON_SHORTS, "a": "all"})
        if len(flags.args) != 1:
            raise UsageError(f'"helm get {rest[0]}" requires 1 argument')
        namespace = str(flags.get("namespace") or namespace_default)
        history = Releases(_client(flags), namespace).history(flags.args[0])
        if not history:
            raise HelmError("release: not found")
        release = history[-1]
        if rest[0] == "manifest":
            sys.stdout.write(release["manifest"])
            return 0
        values = (
            merge_values(release["chart"].get("values") or {}, release["config"])
            if flags.get("all")
            else release["config"]
        )
        output = str(flags.get("output") or "table")
        if output == "json":
            print(json.dumps(values or None))
        elif output == "yaml":
            sys.stdout.write(yaml.safe_dump(values or None, sort_keys=True))
        else:
            print("COMPUTED VALUES:" if flags.get("all") else "USER-SUPPLIED VALUES:")
            sys.stdout.write(yaml.safe_dump(values or None, sort_keys=True))
        return 0
    if command == "template":
        flags = parse(
            rest,
            {**COMMON_FLAGS, **INSTALL_FLAGS, "include-crds": "bool", "show-only": "array"},
            {**COMMON_SHORTS, "f": "values", "s": "show-only"},
        )
        if len(flags.args) not in (1, 2):
            raise UsageError('"helm template" requires at least 1 argument')
        name, chart_ref = flags.args if len(flags.args) == 2 else ["release-name", flags.args[0]]
        chart, config, values = _prepare(chart_ref, flags)
        release = _new_release(
            name, str(flags.get("namespace") or namespace_default), chart, config, 1, "pending-install", ""
        )
        _unused, _unused, text = render_chart(chart, values, release)
        if flags.get("include-crds"):
            text = "".join(f"---\n# Source: {chart.name}/{n}\n{d}" for n, d in chart.crds) + text
        sys.stdout.write(text)
        return 0
    raise UsageError(f'unknown command "{command}" for "helm"')
