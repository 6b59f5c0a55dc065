"""kubectl double: a real TLS client of the API double with kubectl's output formats."""

from __future__ import annotations

import copy
import json
import os
import re
import sys
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import yaml

from .cli import Parsed, UsageError, parse
from .client import ApiStatusError, Client, load_kubeconfig, resource_path
from .common import DoubleError, human_duration, now, parse_duration, parse_rfc3339, tabulate, version_info

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
KUSTOMIZE_VERSION = "v5.4.2"

GLOBAL_FLAGS = {
    "kubeconfig": "str",
    "context": "str",
    "namespace": "str",
    "request-timeout": "str",
    "v": "str",
    "server": "str",
    "insecure-skip-tls-verify": "bool",
}
GLOBAL_SHORTS = {"n": "namespace", "v": "v"}


class CommandError(DoubleError):
    """Printed verbatim (already in kubectl's wording) and exit 1."""


@dataclass
class Mapping:
    group: str
    version: str
    plural: str
    singular: str
    kind: str
    namespaced: bool
    short_names: list[str]

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def kind_qualified(self) -> str:
        return f"{self.kind.lower()}.{self.group}" if self.group else self.kind.lower()

    @property
    def qualified(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def path(self, namespace: str = "", name: str = "") -> str:
        return resource_path(self.group, self.version, self.plural, namespace if self.namespaced else "", name)


def server_error(exc: ApiStatusError, prefix: str = "") -> CommandError:
    if exc.code == 401:
        return CommandError("error: You must be logged in to the server (Unauthorized)")
    reason = exc.reason or "Unknown"
    details = exc.status.get("details") or {}
    if reason == "Invalid" and " is invalid: " in str(exc):
        # kubectl rewrites validation failures as `The <Kind> "<name>" is invalid: ...`.
        return CommandError(
            f'The {details.get("kind", "object")} "{details.get("name", "")}" is invalid: '
            f'{str(exc).split(" is invalid: ", 1)[1]}'
        )
    return CommandError(f"Error from server ({reason}): {prefix}{exc}")


class Kubectl:
    def __init__(self, flags: Parsed) -> None:
        self.flags = flags
        path = flags.get("kubeconfig") or (os.environ.get("KUBECONFIG", "").split(":")[0] or None)
        if path is None:
            path = str(Path.home() / ".kube" / "config")
            if not Path(path).exists():
                raise CommandError(
                    "The connection to the server localhost:8080 was refused - did you specify the right host or port?"
                )
        try:
            config, conn = load_kubeconfig(str(path), flags.get("context"))  # type: ignore[arg-type]
        except DoubleError as exc:
            raise CommandError(f"error: {exc}") from None
        if flags.get("insecure-skip-tls-verify"):
            conn.insecure = True
        if flags.get("server"):
            conn.server = str(flags.get("server"))
        self.config = config
        context_name = flags.get("context") or config.get("current-context")
        context = next((c.get("context", {}) for c in config.get("contexts") or [] if c["name"] == context_name), {})
        self.default_namespace = context.get("namespace") or "default"
        timeout = (
            float(parse_duration(str(flags.get("request-timeout"))))
            if flags.get("request-timeout") not in (None, "0")
            else 30.0
        )
        self.client = Client(conn, timeout=timeout or 30.0)
        self._mappings: list[Mapping] | None = None

    @property
    def namespace(self) -> str:
        return str(self.flags.get("namespace") or self.default_namespace)

    def call(self, method: str, path: str, body: object = None, content_type: str = "application/json") -> object:
        try:
            return self.client.request(method, path, body, content_type)
        except ApiStatusError:
            raise
        except DoubleError as exc:
            if "connection refused" in str(exc):
                raise CommandError(
                    f"The connection to the server {self.client.conn.host_port} was refused - did you specify the right host or port?"
                ) from None
            raise CommandError(f"Unable to connect to the server: {exc}") from None

    # -- discovery

    def mappings(self, refresh: bool = False) -> list[Mapping]:
        if self._mappings is not None and not refresh:
            return self._mappings
        result: list[Mapping] = []
        try:
            versions = [("", "v1")]
            groups = self.call("GET", "/apis")
            for group in groups.get("groups", []):  # type: ignore[union-attr]
                preferred = group["preferredVersion"]["version"]
                ordered = [preferred] + [v["version"] for v in group["versions"] if v["version"] != preferred]
                versions += [(group["name"], v) for v in ordered]
            for group, version in versions:
                path = f"/apis/{group}/{version}" if group else "/api/v1"
                listing = self.call("GET", path)
                for entry in listing.get("resources", []):  # type: ignore[union-attr]
                    if "/" in entry["name"]:
                        continue
                    result.append(
                        Mapping(
                            group,
                            version,
                            entry["name"],
                            entry.get("singularName") or entry["kind"].lower(),
                            entry["kind"],
                            entry["namespaced"],
                            entry.get("shortNames", []),
                        )
                    )
        except ApiStatusError as exc:
            raise server_error(exc) from None
        self._mappings = result
        return result

    def resolve(self, text: str) -> Mapping:
        name = text.lower()
        resource, _unused, group = name.partition(".")
        version = ""
        if group and re.fullmatch(r"v\d+(alpha\d+|beta\d+)?", group.split(".")[0]) and "." in group:
            version, group = group.split(".", 1)
        for refresh in (False, True):
            candidates = [
                m
                for m in self.mappings(refresh)
                if (not group or m.group == group) and (not version or m.version == version)
            ]
            for matcher in (
                lambda m: m.plural == resource,
                lambda m: m.singular == resource,
                lambda m: resource in m.short_names,
                lambda m: m.kind.lower() == resource,
            ):
                found = [m for m in candidates if matcher(m)]
                if found:
                    return found[0]
            if group and not version:
                whole = [m for m in self.mappings() if m.plural == name or m.kind.lower() == name]
                if whole:
                    return whole[0]
        raise CommandError(f'error: the server doesn\'t have a resource type "{resource}"')

    def resolve_kind(self, api_version: str, kind: str) -> Mapping | None:
        group, _unused, version = api_version.rpartition("/")
        for refresh in (False, True):
            for mapping in self.mappings(refresh):
                if mapping.group == group and mapping.version == version and mapping.kind == kind:
                    return mapping
        return None


# ---------------------------------------------------------------- printing


def age(obj: dict) -> str:
    stamp = obj.get("metadata", {}).get("creationTimestamp")
    if not stamp:
        return "<unknown>"
    return human_duration((now() - parse_rfc3339(stamp)).total_seconds())


def node_row(obj: dict, wide: bool) -> list[str]:
    status = obj.get("status", {})
    ready = next((c for c in status.get("conditions", []) if c.get("type") == "Ready"), None)
    state = "Ready" if ready and ready.get("status") == "True" else "NotReady" if ready else "Unknown"
    if obj.get("spec", {}).get("unschedulable"):
        state += ",SchedulingDisabled"
    labels = obj["metadata"].get("labels") or {}
    roles = sorted(
        {k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/") and "/" in k}
        | ({labels["kubernetes.io/role"]} if labels.get("kubernetes.io/role") else set())
    )
    info = status.get("nodeInfo", {})
    row = [obj["metadata"]["name"], state, ",".join(roles) or "<none>", age(obj), info.get("kubeletVersion", "")]
    if wide:
        addresses = {a["type"]: a["address"] for a in status.get("addresses", [])}
        row += [
            addresses.get("InternalIP", "<none>"),
            addresses.get("ExternalIP", "<none>"),
            info.get("osImage", ""),
            info.get("kernelVersion", ""),
            info.get("containerRuntimeVersion", ""),
        ]
    return row


def _ports(spec: dict) -> str:
    parts = []
    for port in spec.get("ports") or []:
        text = f"{port.get('port')}"
        if port.get("nodePort"):
            text += f":{port['nodePort']}"
        parts.append(f"{text}/{port.get('protocol', 'TCP')}")
    return ",".join(parts) or "<none>"


def _jsonpath_simple(obj: dict, path: str) -> str:
    current: object = obj
    for step in filter(None, re.split(r"\.(?![^\[]*\])", path.strip("."))):
        match = re.fullmatch(r"([^\[]*)(?:\[(\d+)\])?", step)
        key, index = match.groups() if match else (step, None)
        current = current.get(key) if isinstance(current, dict) else None
        if index is not None:
            current = current[int(index)] if isinstance(current, list) and len(current) > int(index) else None
    if current is None:
        return "<none>"
    return (
        json.dumps(current)
        if isinstance(current, (dict, list))
        else str(current).lower() if isinstance(current, bool) else str(current)
    )


def table(
    mapping: Mapping, items: list[dict], wide: bool, all_namespaces: bool, printer_columns: list
) -> list[list[str]]:
    plural = (
        mapping.plural
        if not mapping.group or mapping.group in ("apps", "batch", "apiextensions.k8s.io", "certificates.k8s.io")
        else ""
    )
    rows: list[list[str]]
    if plural == "nodes":
        header = ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
        if wide:
            header += ["INTERNAL-IP", "EXTERNAL-IP", "OS-IMAGE", "KERNEL-VERSION", "CONTAINER-RUNTIME"]
        rows = [header] + [node_row(o, wide) for o in items]
    elif plural == "namespaces":
        rows = [["NAME", "STATUS", "AGE"]] + [
            [o["metadata"]["name"], o.get("status", {}).get("phase", ""), age(o)] for o in items
        ]
    elif plural == "secrets":
        rows = [["NAME", "TYPE", "DATA", "AGE"]] + [
            [o["metadata"]["name"], o.get("type", ""), str(len(o.get("data") or {})), age(o)] for o in items
        ]
    elif plural == "configmaps":
        rows = [["NAME", "DATA", "AGE"]] + [
            [o["metadata"]["name"], str(len(o.get("data") or {}) + len(o.get("binaryData") or {})), age(o)]
            for o in items
        ]
    elif plural == "services":
        rows = [["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE"]]
        for o in items:
            spec = o.get("spec", {})
            rows.append(
                [o["metadata"]["name"], spec.get("type", ""), spec.get("clusterIP", ""), "<none>", _ports(spec), age(o)]
            )
    elif plural == "serviceaccounts":
        rows = [["NAME", "SECRETS", "AGE"]] + [
            [o["metadata"]["name"], str(len(o.get("secrets") or [])), age(o)] for o in items
        ]
    elif plural == "deployments":
        rows = [["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]]
        for o in items:
            status = o.get("status", {})
            rows.append(
                [
                    o["metadata"]["name"],
                    f"{status.get('readyReplicas', 0)}/{o.get('spec', {}).get('replicas', 1)}",
                    str(status.get("updatedReplicas", 0)),
                    str(status.get("availableReplicas", 0)),
                    age(o),
                ]
            )
    elif plural == "customresourcedefinitions":
        rows = [["NAME", "CREATED AT"]] + [
            [o["metadata"]["name"], o["metadata"].get("creationTimestamp", "")] for o in items
        ]
    elif printer_columns:
        rows = [["NAME"] + [c[0].upper() for c in printer_columns]]
        for o in items:
            row = [o["metadata"]["name"]]
            for _unused, path, kind in printer_columns:
                value = _jsonpath_simple(o, path)
                if kind == "date" and value != "<none>":
                    value = human_duration((now() - parse_rfc3339(value)).total_seconds())
                row.append(value)
            rows.append(row)
    else:
        rows = [["NAME", "AGE"]] + [[o["metadata"]["name"], age(o)] for o in items]
    if all_namespaces and mapping.namespaced:
        rows[0].insert(0, "NAMESPACE")
        for row, obj in zip(rows[1:], items):
            row.insert(0, obj["metadata"].get("namespace", ""))
    return rows


def dump(obj: object, output: str) -> str:
    if output == "json":
        return json.dumps(obj, indent=4) + "\n"
    return yaml.safe_dump(obj, default_flow_style=False, sort_keys=True)


def _crd_columns(ctl: Kubectl, mapping: Mapping) -> list:
    if not mapping.group or "." not in mapping.group:
        return []
    try:
        crd = ctl.call(
            "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{mapping.plural}.{mapping.group}"
        )
    except (ApiStatusError, CommandError):
        return []
    for version in crd.get("spec", {}).get("versions", []):  # type: ignore[union-attr]
        if version["name"] == mapping.version:
            columns = [
                (c["name"], c["jsonPath"], c.get("type", "string"))
                for c in version.get("additionalPrinterColumns") or []
            ]
            return columns
    return []


# ---------------------------------------------------------------- jsonpath


def jsonpath(template: str, obj: object) -> str:
    """A subset of kubectl's JSONPath: {.a.b}, [n], [*], [?(@.k=="v")], {range}/{end} not supported."""
    out = []
    for literal, expr in re.findall(r"([^{]*)(?:\{([^}]*)\})?", template):
        out.append(literal.replace("\\n", "\n").replace("\\t", "\t"))
        if not expr:
            continue
        quoted = re.fullmatch(r'\s*"((?:[^"\\]|\\.)*)"\s*', expr)
        if quoted:
            out.append(quoted.group(1).replace("\\n", "\n").replace("\\t", "\t").replace('\\"', '"'))
            continue
        values = _jp_eval(expr.strip(), [obj])
        out.append(" ".join(_jp_text(v) for v in values))
    return "".join(out)


def _jp_text(value: object) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _jp_eval(expr: str, current: list) -> list:
    if expr.startswith("$"):
        expr = expr[1:]
    tokens = re.findall(r"\.\.?[^.\[]+|\[[^\]]*\]", expr)
    if "".join(tokens) != expr and expr not in ("", "."):
        raise CommandError(f"error: error parsing jsonpath {{{expr}}}, unrecognized character in action")
    for token in tokens:
        following: list = []
        if token.startswith("["):
            inner = token[1:-1]
            for value in current:
                if not isinstance(value, list):
                    continue
                if inner == "*":
                    following.extend(value)
                elif inner.startswith("?(") and inner.endswith(")"):
                    cond = re.fullmatch(r"@\.([\w.-]+)\s*==\s*['\"]([^'\"]*)['\"]", inner[2:-1])
                    if not cond:
                        raise CommandError(f"error: error parsing jsonpath {{{expr}}}, unsupported filter")
                    for item in value:
                        found = _jp_eval("." + cond.group(1), [item]) if isinstance(item, dict) else []
                        if found and _jp_text(found[0]) == cond.group(2):
                            following.append(item)
                elif re.fullmatch(r"-?\d+", inner):
                    index = int(inner)
                    if -len(value) <= index < len(value):
                        following.append(value[index])
        else:
            key = token.lstrip(".")
            for value in current:
                if key == "*" and isinstance(value, dict):
                    following.extend(value.values())
                elif isinstance(value, dict) and key in value:
                    following.append(value[key])
        current = following
    return current


# ---------------------------------------------------------------- commands


def split_targets(ctl: Kubectl, args: list[str]) -> list[tuple[Mapping, str]]:
    """TYPE NAME..., TYPE/NAME..., TYPE1,TYPE2 → [(mapping, name or "")]."""
    if not args:
        raise CommandError(
            'error: You must specify the type of resource to get. Use "kubectl api-resources" for a complete list of supported resources.'
        )
    if "/" in args[0]:
        targets = []
        for arg in args:
            if "/" not in arg:
                raise CommandError(
                    "error: there is no need to specify a resource type as a separate argument when passing "
                    "arguments in resource/name form (e.g. 'kubectl get resource/<resource_name>' instead of "
                    "'kubectl get resource resource/<resource_name>'"
                )
            kind, _unused, name = arg.partition("/")
            targets.append((ctl.resolve(kind), name))
        return targets
    mappings = [ctl.resolve(part) for part in args[0].split(",") if part]
    names = args[1:]
    if names and len(mappings) > 1:
        raise CommandError("error: arguments in resource/name form must have a single resource and name")
    return [(m, n) for m in mappings for n in (names or [""])]


def cmd_get(ctl: Kubectl, flags: Parsed) -> int:
    if flags.get("raw"):
        if flags.args:
            raise CommandError("error: arguments may not be passed when --raw is specified")
        response = ctl.call("GET", str(flags.get("raw")))
        sys.stdout.write(response if isinstance(response, str) else json.dumps(response))
        return 0
    output = str(flags.get("output") or "")
    wide = output == "wide"
    all_namespaces = bool(flags.get("all-namespaces"))
    selector = str(flags.get("selector") or "")
    field_selector = str(flags.get("field-selector") or "")
    targets = split_targets(ctl, flags.args)
    collected: list[tuple[Mapping, list[dict], bool]] = []
    errors = []
    for mapping, name in targets:
        namespace = "" if all_namespaces or not mapping.namespaced else ctl.namespace
        try:
            if name:
                collected.append((mapping, [ctl.call("GET", mapping.path(namespace, name))], True))  # type: ignore[list-item]
            else:
                query = {k: v for k, v in (("labelSelector", selector), ("fieldSelector", field_selector)) if v}
                path = mapping.path(namespace) + (f"?{urllib.parse.urlencode(query)}" if query else "")
                listing = ctl.call("GET", path)
                collected.append((mapping, listing.get("items", []), False))  # type: ignore[union-attr]
        except ApiStatusError as exc:
            errors.append(server_error(exc))
    single = len(targets) == 1 and targets[0][1] != ""
    items_all = [(m, o) for m, items, _unused in collected for o in items]
    if output in ("json", "yaml"):
        if single and items_all:
            sys.stdout.write(dump(items_all[0][1], output))
        elif items_all or not errors:
            items = []
            for mapping, obj in items_all:
                obj = dict(obj)
                obj.setdefault("apiVersion", mapping.group_version)
                obj.setdefault("kind", mapping.kind)
                items.append(obj)
            sys.stdout.write(
                dump({"apiVersion": "v1", "items": items, "kind": "List", "metadata": {"resourceVersion": ""}}, output)
            )
    elif output == "name":
        for mapping, obj in items_all:
            print(f"{mapping.kind_qualified}/{obj['metadata']['name']}")
    elif output.startswith("jsonpath="):
        template = output[len("jsonpath=") :]
        if single and items_all:
            target: object = items_all[0][1]
        else:
            target = {
                "apiVersion": "v1",
                "kind": "List",
                "items": [o for _unused, o in items_all],
                "metadata": {"resourceVersion": ""},
            }
        sys.stdout.write(jsonpath(template, target))
    elif output in ("", "wide"):
        blocks = []
        grouped: dict[tuple[str, str], tuple[Mapping, list[dict]]] = {}
        for mapping, items, _unused in collected:
            grouped.setdefault((mapping.group, mapping.plural), (mapping, []))[1].extend(items)
        multiple = len(grouped) > 1
        for mapping, items in grouped.values():
            if not items:
                continue
            rows = table(mapping, items, wide, all_namespaces, _crd_columns(ctl, mapping))
            if flags.get("show-labels"):
                rows[0].append("LABELS")
                for row, obj in zip(rows[1:], items):
                    labels = obj["metadata"].get("labels") or {}
                    row.append(",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "<none>")
            if flags.get("no-headers"):
                rows = rows[1:]
            if multiple:
                for row in rows[1:]:
                    index = 1 if all_namespaces and mapping.namespaced else 0
                    row[index] = f"{mapping.kind_qualified}/{row[index]}"
            blocks.append(tabulate(rows))
        sys.stdout.write("\n".join(blocks))
        if not items_all and not errors:
            namespaced = any(m.namespaced for m, _unused in targets)
            if namespaced and not all_namespaces:
                print(f"No resources found in {ctl.namespace} namespace.", file=sys.stderr)
            else:
                print("No resources found", file=sys.stderr)
    else:
        raise CommandError(
            f'error: unable to match a printer suitable for the output format "{output}", allowed formats are: '
            "custom-columns,custom-columns-file,go-template,go-template-file,json,jsonpath,jsonpath-as-json,"
            "jsonpath-file,name,template,templatefile,wide,yaml"
        )
    for error in errors:
        print(error, file=sys.stderr)
    return 1 if errors else 0


def read_manifests(sources: list[str]) -> list[tuple[str, dict]]:
    documents = []
    for source in sources:
        if source == "-":
            texts = [("STDIN", sys.stdin.read())]
        else:
            path = Path(source)
            if path.is_dir():
                files = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml", ".json"))
            elif path.exists():
                files = [path]
            else:
                raise CommandError(f'error: the path "{source}" does not exist')
            texts = [(str(p), p.read_text()) for p in files]
        for name, text in texts:
            try:
                loaded = list(yaml.safe_load_all(text))
            except yaml.YAMLError as exc:
                raise CommandError(f"error: error parsing {name}: error converting YAML to JSON: yaml: {exc}") from None
            for document in loaded:
                if document is None:
                    continue
                if not isinstance(document, dict) or not document.get("kind") or not document.get("apiVersion"):
                    missing = "kind" if isinstance(document, dict) and document.get("apiVersion") else "apiVersion"
                    raise CommandError(
                        f'error: error validating "{name}": error validating data: {missing} not set; '
                        "if you choose to ignore these errors, turn validation off with --validate=false"
                    )
                if document["kind"].endswith("List") and isinstance(document.get("items"), list):
                    documents.extend((name, item) for item in document["items"])
                else:
                    documents.append((name, document))
    return documents


def _prune_removed(live: object, last: object, new: object) -> object:
    """Drop fields that the previous apply set but the new manifest no longer has."""
    if not isinstance(live, dict) or not isinstance(last, dict):
        return live
    result = dict(live)
    new = new if isinstance(new, dict) else {}
    for key, value in last.items():
        if key not in new:
            result.pop(key, None)
        elif isinstance(value, dict) and key in result:
            result[key] = _prune_removed(result[key], value, new[key])
    return result


def _merge(live: object, new: object) -> object:
    if isinstance(live, dict) and isinstance(new, dict):
        result = dict(live)
        for key, value in new.items():
            result[key] = _merge(live.get(key), value)
        return result
    return copy.deepcopy(new)


def _mapped(ctl: Kubectl, documents: list[tuple[str, dict]]) -> tuple[list, list[str]]:
    resolved, errors = [], []
    for source, document in documents:
        mapping = ctl.resolve_kind(document["apiVersion"], document["kind"])
        name = (document.get("metadata") or {}).get("name", "")
        if mapping is None:
            namespace = (document.get("metadata") or {}).get("namespace", "")
            errors.append(
                f'error: resource mapping not found for name: "{name}" namespace: "{namespace}" from "{source}": '
                f'no matches for kind "{document["kind"]}" in version "{document["apiVersion"]}"\n'
                "ensure CRDs are installed first"
            )
            continue
        resolved.append((source, document, mapping))
    return resolved, errors


def _target_namespace(ctl: Kubectl, flags: Parsed, document: dict, mapping: Mapping) -> str:
    if not mapping.namespaced:
        document.get("metadata", {}).pop("namespace", None)
        return ""
    given = document.get("metadata", {}).get("namespace")
    if given and flags.get("namespace") and given != flags.get("namespace"):
        raise CommandError(
            f'error: the namespace from the provided object "{given}" does not match the namespace '
            f'"{flags.get("namespace")}". You must pass \'--namespace={given}\' to perform this operation.'
        )
    namespace = given or ctl.namespace
    document.setdefault("metadata", {})["namespace"] = namespace
    return namespace


def cmd_apply(ctl: Kubectl, flags: Parsed) -> int:
    sources = list(flags.get("filename") or [])  # type: ignore[arg-type]
    if not sources:
        raise CommandError("error: must specify one of -f and -k")
    dry_run = str(flags.get("dry-run") or "none")
    suffix = {"client": " (dry run)", "server": " (server dry run)"}.get(dry_run, "")
    resolved, errors = _mapped(ctl, read_manifests(sources))
    failed = bool(errors)
    for source, document, mapping in resolved:
        document = copy.deepcopy(document)
        name = document.get("metadata", {}).get("name")
        if not name:
            errors.append(
                f'error: error when retrieving current configuration of:\nResource: "{mapping.qualified}", '
                f'GroupVersionKind: "{mapping.group_version}, Kind={mapping.kind}"\nName: "", Namespace: ""\n'
                f'from server for: "{source}": resource name may not be empty'
            )
            failed = True
            continue
        namespace = _target_namespace(ctl, flags, document, mapping)
        applied = copy.deepcopy(document)
        annotations = applied.get("metadata", {}).get("annotations") or {}
        annotations.pop(LAST_APPLIED, None)
        if "annotations" in applied.get("metadata", {}):
            applied["metadata"]["annotations"] = annotations or None
            if not annotations:
                applied["metadata"].pop("annotations")
        last_applied = json.dumps(applied, separators=(",", ":"), sort_keys=True) + "\n"
        document.setdefault("metadata", {}).setdefault("annotations", {})[LAST_APPLIED] = last_applied
        try:
            live = ctl.call("GET", mapping.path(namespace, name))
        except ApiStatusError as exc:
            if exc.code != 404:
                errors.append(
                    str(
                        server_error(
                            exc,
                            f'error when retrieving current configuration of:\nResource: "{mapping.qualified}", '
                            f'GroupVersionKind: "{mapping.group_version}, Kind={mapping.kind}"\n'
                            f'Name: "{name}", Namespace: "{namespace}"\nfrom server for: "{source}": ',
                        )
                    )
                )
                failed = True
                continue
            live = None
        try:
            if live is None:
                if dry_run != "client":
                    path = mapping.path(namespace) + ("?dryRun=All" if dry_run == "server" else "")
                    ctl.call("POST", path, document)
                print(f"{mapping.kind_qualified}/{name} created{suffix}")
                continue
            previous = (live.get("metadata", {}).get("annotations") or {}).get(LAST_APPLIED)  # type: ignore[union-attr]
            if previous == last_applied:
                print(f"{mapping.kind_qualified}/{name} unchanged{suffix}")
                continue
            if previous is None:
                print(
                    f"Warning: resource {mapping.qualified}/{name} is missing the {LAST_APPLIED} annotation which is "
                    "required by kubectl apply. kubectl apply should only be used on resources created declaratively "
                    "by either kubectl create --save-config or kubectl apply. The missing annotation will be patched "
                    "automatically.",
                    file=sys.stderr,
                )
            merged = _prune_removed(live, json.loads(previous) if previous else {}, applied)
            merged = _merge(merged, document)
            merged["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]  # type: ignore[index]
            if dry_run == "none":
                ctl.call("PUT", mapping.path(namespace, name), merged)
            print(f"{mapping.kind_qualified}/{name} configured{suffix}")
        except ApiStatusError as exc:
            action = "creating" if live is None else "patching"
            errors.append(str(server_error(exc, f'error when {action} "{source}": ')))
            failed = True
    for error in errors:
        print(error, file=sys.stderr)
    return 1 if failed else 0


def cmd_create(ctl: Kubectl, flags: Parsed) -> int:
    if flags.args[:1] in (["namespace"], ["ns"]):
        if len(flags.args) != 2:
            raise CommandError("error: exactly one NAME is required, got %d" % (len(flags.args) - 1))
        try:
            ctl.call(
                "POST",
                "/api/v1/namespaces",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": flags.args[1]}},
            )
        except ApiStatusError as exc:
            raise server_error(exc) from None
        print(f"namespace/{flags.args[1]} created")
        return 0
    sources = list(flags.get("filename") or [])  # type: ignore[arg-type]
    if not sources:
        raise CommandError("error: must specify one of -f and -k")
    resolved, errors = _mapped(ctl, read_manifests(sources))
    for source, document, mapping in resolved:
        namespace = _target_namespace(ctl, flags, document, mapping)
        try:
            ctl.call("POST", mapping.path(namespace), document)
            print(f"{mapping.kind_qualified}/{document['metadata']['name']} created")
        except ApiStatusError as exc:
            errors.append(str(server_error(exc, f'error when creating "{source}": ')))
    for error in errors:
        print(error, file=sys.stderr)
    return 1 if errors else 0


def cmd_delete(ctl: Kubectl, flags: Parsed) -> int:
    targets: list[tuple[Mapping, str, str]] = []
    if flags.get("filename"):
        resolved, errors = _mapped(ctl, read_manifests(list(flags.get("filename"))))  # type: ignore[arg-type]
        for error in errors:
            print(error, file=sys.stderr)
        for _unused, document, mapping in resolved:
            namespace = _target_namespace(ctl, flags, document, mapping)
            targets.append((mapping, namespace, document["metadata"]["name"]))
    else:
        pairs = split_targets(ctl, flags.args)
        for mapping, name in pairs:
            namespace = ctl.namespace if mapping.namespaced else ""
            if name:
                targets.append((mapping, namespace, name))
            elif flags.get("all") or flags.get("selector"):
                query = (
                    f"?labelSelector={urllib.parse.quote(str(flags.get('selector')))}" if flags.get("selector") else ""
                )
                listing = ctl.call("GET", mapping.path(namespace) + query)
                targets += [(mapping, namespace, o["metadata"]["name"]) for o in listing.get("items", [])]  # type: ignore[union-attr]
            else:
                raise CommandError("error: resource(s) were provided, but no name was specified")
    failed = False
    for mapping, namespace, name in targets:
        try:
            ctl.call("DELETE", mapping.path(namespace, name))
            print(f'{mapping.kind_qualified} "{name}" deleted')
        except ApiStatusError as exc:
            if exc.code == 404 and flags.get("ignore-not-found"):
                continue
            print(server_error(exc), file=sys.stderr)
            failed = True
    return 1 if failed else 0


def cmd_wait(ctl: Kubectl, flags: Parsed) -> int:
    condition = str(flags.get("for") or "")
    if not condition:
        raise CommandError("error: --for must be specified")
    timeout = parse_duration(str(flags.get("timeout") or "30s"))
    targets = split_targets(ctl, flags.args)
    expanded: list[tuple[Mapping, str]] = []
    for mapping, name in targets:
        if name:
            expanded.append((mapping, name))
        else:
            namespace = ctl.namespace if mapping.namespaced else ""
            query = f"?labelSelector={urllib.parse.quote(str(flags.get('selector')))}" if flags.get("selector") else ""
            listing = ctl.call("GET", mapping.path(namespace) + query)
            expanded += [(mapping, o["metadata"]["name"]) for o in listing.get("items", [])]  # type: ignore[union-attr]
    if not expanded:
        raise CommandError("error: no matching resources found")
    deadline = time.monotonic() + timeout
    for mapping, name in expanded:
        namespace = ctl.namespace if mapping.namespaced else ""
        while True:
            try:
                obj = ctl.call("GET", mapping.path(namespace, name))
            except ApiStatusError as exc:
                if exc.code == 404 and condition == "delete":
                    print(f"{mapping.kind_qualified}/{name} condition met")
                    break
                raise server_error(exc) from None
            if _condition_met(obj, condition):  # type: ignore[arg-type]
                print(f"{mapping.kind_qualified}/{name} condition met")
                break
            if time.monotonic() >= deadline:
                raise CommandError(f"error: timed out waiting for the condition on {mapping.qualified}/{name}")
            time.sleep(0.2)
    return 0


def _condition_met(obj: dict, condition: str) -> bool:
    if condition == "delete":
        return False
    if condition.startswith("condition="):
        spec = condition[len("condition=") :]
        kind, _unused, wanted = spec.partition("=")
        wanted = wanted or "true"
        for item in obj.get("status", {}).get("conditions") or []:
            if item.get("type", "").lower() == kind.lower():
                return str(item.get("status", "")).lower() == wanted.lower()
        return False
    if condition.startswith("jsonpath="):
        expression, _unused, wanted = condition[len("jsonpath=") :].rpartition("=")
        return jsonpath(expression.strip("'"), obj) == wanted
    raise CommandError(f'error: unrecognized condition: "{condition}"')


def cmd_version(ctl: Kubectl | None, flags: Parsed) -> int:
    output = flags.get("output") or ""
    result: dict = {"clientVersion": version_info(), "kustomizeVersion": KUSTOMIZE_VERSION}
    error = None
    if ctl is not None:
        try:
            result["serverVersion"] = ctl.call("GET", "/version")
        except (DoubleError, ApiStatusError) as exc:
            error = exc
    if output == "json":
        print(json.dumps(result, indent=2))
    elif output == "yaml":
        sys.stdout.write(yaml.safe_dump(result, sort_keys=False))
    else:
        print(f"Client Version: {result['clientVersion']['gitVersion']}")
        print(f"Kustomize Version: {KUSTOMIZE_VERSION}")
        if "serverVersion" in result:
            print(f"Server Version: {result['serverVersion']['gitVersion']}")
    if error is not None:
        print(error, file=sys.stderr)
        return 1
    return 0


def cmd_cluster_info(ctl: Kubectl, flags: Parsed) -> int:
    try:
        ctl.call("GET", "/api")
    except ApiStatusError as exc:
        raise server_error(exc) from None
    print(f"Kubernetes control plane is running at {ctl.client.conn.server}")
    try:
        services = ctl.call(
            "GET", "/api/v1/namespaces/kube-system/services?labelSelector=kubernetes.io%2Fcluster-service%3Dtrue"
        )
        for service in services.get("items", []):  # type: ignore[union-attr]
            label = service["metadata"].get("labels", {}).get("kubernetes.io/name", service["metadata"]["name"])
            port = (service.get("spec", {}).get("ports") or [{}])[0].get("name", "")
            suffix = f":{port}" if port else ""
            print(
                f"{label} is running at {ctl.client.conn.server}/api/v1/namespaces/kube-system/services/"
                f"{service['metadata']['name']}{suffix}/proxy"
            )
    except ApiStatusError:
        pass
    print()
    print("To further debug and diagnose cluster problems, use 'kubectl cluster-info dump'.")
    return 0


def cmd_api_resources(ctl: Kubectl, flags: Parsed) -> int:
    rows = [["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"]]
    seen = set()
    output = flags.get("output") or ""
    for mapping in ctl.mappings():
        if (mapping.group, mapping.plural) in seen:
            continue
        seen.add((mapping.group, mapping.plural))
        if flags.get("api-group") is not None and mapping.group != flags.get("api-group"):
            continue
        if "namespaced" in flags.given and mapping.namespaced != (flags.get("namespaced") in (True, "true")):
            continue
        if output == "name":
            print(mapping.qualified)
            continue
        rows.append(
            [
                mapping.plural,
                ",".join(mapping.short_names),
                mapping.group_version,
                str(mapping.namespaced).lower(),
                mapping.kind,
            ]
        )
    if output != "name":
        sys.stdout.write(
            tabulate(rows[:1] + sorted(rows[1:], key=lambda r: (r[2].count("/") > 0, r[2].split("/")[0], r[0])))
        )
    return 0


def cmd_patch(ctl: Kubectl, flags: Parsed) -> int:
    targets = split_targets(ctl, flags.args)
    if len(targets) != 1 or not targets[0][1]:
        raise CommandError("error: a resource type and name are required")
    mapping, name = targets[0]
    kind = str(flags.get("type") or "strategic")
    content = {
        "json": "application/json-patch+json",
        "merge": "application/merge-patch+json",
        "strategic": "application/strategic-merge-patch+json",
    }.get(kind)
    if content is None:
        raise CommandError(f'error: --type must be one of [json merge strategic], not "{kind}"')
    try:
        body = yaml.safe_load(str(flags.get("patch") or ""))
    except yaml.YAMLError as exc:
        raise CommandError(f"error: unable to parse \"{flags.get('patch')}\": {exc}") from None
    namespace = ctl.namespace if mapping.namespaced else ""
    try:
        before = ctl.call("GET", mapping.path(namespace, name))
        after = ctl.call("PATCH", mapping.path(namespace, name), body, content)
    except ApiStatusError as exc:
        raise server_error(exc) from None
    changed = before.get("metadata", {}).get("resourceVersion") != after.get("metadata", {}).get("resourceVersion")  # type: ignore[union-attr]
    print(f"{mapping.kind_qualified}/{name} {'patched' if changed else 'patched (no change)'}")
    return 0


def cmd_label(ctl: Kubectl, flags: Parsed, field: str) -> int:
    args = list(flags.args)
    changes = [a for a in args if "=" in a or a.endswith("-")]
    rest = [a for a in args if a not in changes]
    targets = split_targets(ctl, rest)
    verb = "labeled" if field == "labels" else "annotated"
    for mapping, name in targets:
        namespace = ctl.namespace if mapping.namespaced else ""
        try:
            obj = ctl.call("GET", mapping.path(namespace, name))
        except ApiStatusError as exc:
            raise server_error(exc) from None
        values = dict(obj["metadata"].get(field) or {})  # type: ignore[index]
        for change in changes:
            if change.endswith("-") and "=" not in change:
                values.pop(change[:-1], None)
                continue
            key, _unused, value = change.partition("=")
            if key in values and values[key] != value and not flags.get("overwrite"):
                raise CommandError(f"error: '{key}' already has a value ({values[key]}), and --overwrite is false")
            values[key] = value
        obj["metadata"][field] = values  # type: ignore[index]
        try:
            ctl.call("PUT", mapping.path(namespace, name), obj)
        except ApiStatusError as exc:
            raise server_error(exc) from None
        print(f"{mapping.kind_qualified}/{name} {verb}")
    return 0


def cmd_cordon(ctl: Kubectl, flags: Parsed, command: str) -> int:
    """cordon / uncordon / drain: the double runs no pods, so draining only cordons."""
    targets = split_targets(ctl, ["nodes", *flags.args]) if flags.args else []
    if not targets:
        raise CommandError(f"error: USAGE: {command} NODE [flags]")
    for mapping, name in targets:
        try:
            node = ctl.call("GET", mapping.path("", name))
        except ApiStatusError as exc:
            raise server_error(exc) from None
        unschedulable = command != "uncordon"
        if bool(node.get("spec", {}).get("unschedulable")) == unschedulable:  # type: ignore[union-attr]
            print(f"node/{name} already {'cordoned' if unschedulable else 'uncordoned'}")
        else:
            body = {"spec": {"unschedulable": True if unschedulable else None}}
            ctl.call("PATCH", mapping.path("", name), body, "application/strategic-merge-patch+json")
            print(f"node/{name} {'cordoned' if unschedulable else 'uncordoned'}")
        if command == "drain":
            print(f"node/{name} drained")
    return 0


def cmd_config(flags: Parsed) -> int:
    path = (
        flags.get("kubeconfig")
        or os.environ.get("KUBECONFIG", "").split(":")[0]
        or str(Path.home() / ".kube" / "config")
    )
    try:
        config = yaml.safe_load(Path(str(path)).read_text()) or {}
    except OSError:
        config = {}
    sub = flags.args[0] if flags.args else ""
    if sub == "current-context":
        if not config.get("current-context"):
            raise CommandError("error: current-context is not set")
        print(config["current-context"])
        return 0
    if sub == "view":
        if not flags.get("raw"):
            config = copy.deepcopy(config)
            for cluster in config.get("clusters") or []:
                if "certificate-authority-data" in cluster.get("cluster", {}):
                    cluster["cluster"]["certificate-authority-data"] = "DATA+OMITTED"
            for user in config.get("users") or []:
                for key in ("client-certificate-data", "client-key-data", "token"):
                    if key in user.get("user", {}):
                        user["user"][key] = "DATA+OMITTED" if key == "client-certificate-data" else "REDACTED"
        output = flags.get("output") or "yaml"
        sys.stdout.write(dump(config, str(output)))
        return 0
    raise CommandError(f'error: unknown command "{sub}" for "kubectl config"')


COMMAND_FLAGS = {
    "get": (
        {
            "raw": "str",
            "output": "str",
            "all-namespaces": "bool",
            "selector": "str",
            "field-selector": "str",
            "no-headers": "bool",
            "show-labels": "bool",
            "watch": "bool",
            "ignore-not-found": "bool",
        },
        {"o": "output", "A": "all-namespaces", "l": "selector", "w": "watch"},
    ),
    "apply": (
        {
            "filename": "array",
            "dry-run": "str",
            "server-side": "bool",
            "force-conflicts": "bool",
            "field-manager": "str",
            "validate": "str",
            "wait": "bool",
            "output": "str",
            "recursive": "bool",
            "prune": "bool",
            "selector": "str",
        },
        {"f": "filename", "o": "output", "R": "recursive", "l": "selector"},
    ),
    "create": (
        {"filename": "array", "dry-run": "str", "output": "str", "validate": "str"},
        {"f": "filename", "o": "output"},
    ),
    "delete": (
        {
            "filename": "array",
            "ignore-not-found": "bool",
            "all": "bool",
            "selector": "str",
            "wait": "bool",
            "timeout": "str",
            "now": "bool",
            "grace-period": "str",
            "force": "bool",
            "cascade": "str",
        },
        {"f": "filename", "l": "selector"},
    ),
    "wait": ({"for": "str", "timeout": "str", "all": "bool", "selector": "str"}, {"l": "selector"}),
    "version": ({"output": "str", "client": "bool"}, {"o": "output"}),
    "cluster-info": ({}, {}),
    "api-resources": (
        {
            "output": "str",
            "namespaced": "str",
            "api-group": "str",
            "verbs": "list",
            "no-headers": "bool",
            "sort-by": "str",
        },
        {"o": "output"},
    ),
    "api-versions": ({}, {}),
    "patch": ({"patch": "str", "type": "str", "dry-run": "str"}, {"p": "patch"}),
    "label": ({"overwrite": "bool", "all": "bool", "selector": "str"}, {"l": "selector"}),
    "annotate": ({"overwrite": "bool", "all": "bool", "selector": "str"}, {"l": "selector"}),
    "cordon": ({"selector": "str", "dry-run": "str"}, {"l": "selector"}),
    "uncordon": ({"selector": "str", "dry-run": "str"}, {"l": "selector"}),
    "drain": (
        {
            "ignore-daemonsets": "bool",
            "delete-emptydir-data": "bool",
            "force": "bool",
            "timeout": "str",
            "grace-period": "str",
            "selector": "str",
            "disable-eviction": "bool",
        },
        {"l": "selector"},
    ),
    "config": ({"raw": "bool", "minify": "bool", "flatten": "bool", "output": "str"}, {"o": "output"}),
}


def main(argv: list[str]) -> int:
    command = next(
        (
            a
            for a in argv
            if not a.startswith("-")
            and argv[argv.index(a) - 1]
            not in ("-n", "--namespace", "--kubeconfig", "--context", "--request-timeout", "-v", "--server")
        ),
        "",
    )
    if not command:
        print("kubectl controls the Kubernetes cluster manager (test double).", file=sys.stderr)
        return 1 if argv else 0
    if command not in COMMAND_FLAGS:
        print(f'error: unknown command "{command}" for "kubectl"', file=sys.stderr)
        return 1
    position = argv.index(command)
    rest = argv[:position] + argv[position + 1 :]
    spec, shorts = COMMAND_FLAGS[command]
    try:
        flags = parse(rest, {**GLOBAL_FLAGS, **spec}, {**GLOBAL_SHORTS, **shorts})
        if command == "config":
            return cmd_config(flags)
        if command == "version" and flags.get("client"):
            return cmd_version(None, flags)
        ctl = Kubectl(flags)
        handlers = {
            "get": cmd_get,
            "apply": cmd_apply,
            "create": cmd_create,
            "delete": cmd_delete,
            "wait": cmd_wait,
            "version": cmd_version,
            "cluster-info": cmd_cluster_info,
            "api-resources": cmd_api_resources,
            "patch": cmd_patch,
        }
        if command == "api-versions":
            versions = sorted({m.group_version for m in ctl.mappings()})
            print("\n".join(versions))
            return 0
        if command in ("cordon", "uncordon", "drain"):
            return cmd_cordon(ctl, flags, command)
        if command in ("label", "annotate"):
            return cmd_label(ctl, flags, "labels" if command == "label" else "annotations")
        return handlers[command](ctl, flags)
    except UsageError as exc:
        print(f"error: {exc}\nSee 'kubectl {command} --help' for usage.", file=sys.stderr)
        return 1
    except ApiStatusError as exc:
        print(server_error(exc), file=sys.stderr)
        return 1
    except CommandError as exc:
        print(exc, file=sys.stderr)
        return 1
    except DoubleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
