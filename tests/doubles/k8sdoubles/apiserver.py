"""kube-apiserver double: a small HTTPS server holding the cluster's objects.

TLS, client-certificate and bootstrap-token authentication are real; the
object store is one JSON file written atomically after every change.
"""

from __future__ import annotations

import base64
import copy
import datetime as _dt
import hmac
import ipaddress
import json
import os
import re
import signal
import socket
import ssl
import sys
import threading
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import NameOID

from . import pki
from .common import (
    APISERVER_STATE_FILE,
    DoubleError,
    atomic_write,
    host_path,
    now,
    parse_rfc3339,
    rfc3339,
    version_info,
)
from .resources import BUILTIN, ResourceType, discovery_resource, from_crd

ADMIN_GROUPS = {"system:masters", "kubeadm:cluster-admins"}
ADMIN_USERS = {"system:kube-controller-manager", "system:kube-scheduler", "kube-apiserver-kubelet-client"}
NODE_BOOTSTRAP_GROUP = "system:bootstrappers:kubeadm:default-node-token"
TOKEN_RE = re.compile(r"^([a-z0-9]{6})\.([a-z0-9]{16})$")
SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start "
    "and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
PUBLIC_PATHS = {"/healthz", "/livez", "/readyz", "/version", "/version/"}
KUBELET_SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"


class ApiError(Exception):
    """An error the server returns as a metav1.Status object."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict:
        body = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def _details(rt: ResourceType, name: str) -> dict:
    details = {"name": name, "kind": rt.plural}
    if rt.group:
        details["group"] = rt.group
    return details


def not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{rt.qualified} "{name}" not found', _details(rt, name))


def invalid(rt: ResourceType, name: str, causes: list[tuple[str, str]]) -> ApiError:
    text = ", ".join(f"{fld}: {msg}" for fld, msg in causes)
    group = rt.group or ""
    kind = f"{rt.kind}.{group}" if group else rt.kind
    details = _details(rt, name)
    details["kind"] = rt.kind
    details["causes"] = [{"reason": "FieldValueInvalid", "message": msg, "field": fld} for fld, msg in causes]
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {text}', details)


class User:
    def __init__(self, name: str, groups: list[str]) -> None:
        self.name = name
        self.groups = groups

    @property
    def is_admin(self) -> bool:
        return self.name in ADMIN_USERS or bool(ADMIN_GROUPS.intersection(self.groups))


ANONYMOUS = User("system:anonymous", ["system:unauthenticated"])


# ---------------------------------------------------------------- selectors

_REQ_RE = re.compile(r"^\s*(!?)([A-Za-z0-9._/-]+)\s*(?:(==|=|!=)\s*([A-Za-z0-9._-]*)|\s+(in|notin)\s*\(([^)]*)\))?\s*$")


def _split_selector(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current)
    return parts


def parse_label_selector(text: str) -> list[tuple]:
    requirements = []
    for part in _split_selector(text):
        match = _REQ_RE.match(part)
        if not match:
            raise ApiError(
                400, "BadRequest", f"unable to parse requirement: found '{part.strip()}', expected: identifier"
            )
        negate, key, op, value, setop, values = match.groups()
        if negate and (op or setop):
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {part.strip()}")
        if negate:
            requirements.append(("!", key, None))
        elif op:
            requirements.append(("!=" if op == "!=" else "=", key, value))
        elif setop:
            requirements.append((setop, key, {v.strip() for v in values.split(",") if v.strip()}))
        else:
            requirements.append(("exists", key, None))
    return requirements


def labels_match(requirements: list[tuple], labels: dict) -> bool:
    for op, key, value in requirements:
        if op == "=" and labels.get(key) != value:
            return False
        if op == "!=" and labels.get(key) == value:
            return False
        if op == "exists" and key not in labels:
            return False
        if op == "!" and key in labels:
            return False
        if op == "in" and labels.get(key) not in value:
            return False
        if op == "notin" and key in labels and labels[key] in value:
            return False
    return True


def fields_match(selector: str, obj: dict) -> bool:
    for part in filter(None, selector.split(",")):
        negate = "!=" in part
        key, _unused, value = part.replace("!=", "=").replace("==", "=").partition("=")
        current: object = obj
        for step in key.strip().split("."):
            current = current.get(step, "") if isinstance(current, dict) else ""
        if (str(current) == value.strip()) == negate:
            return False
    return True


# ---------------------------------------------------------------- patches


def merge_patch(target: object, patch: object) -> object:
    """RFC 7386 JSON merge patch (also used for strategic merge patches)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target: dict, operations: list) -> dict:
    result = copy.deepcopy(target)
    for operation in operations:
        op, path = operation.get("op"), operation.get("path", "")
        steps = [s.replace("~1", "/").replace("~0", "~") for s in path.split("/")[1:]]
        if not steps:
            raise ApiError(422, "Invalid", "the server rejected our request due to an error in our request")
        parent: object = result
        for step in steps[:-1]:
            parent = parent[int(step)] if isinstance(parent, list) else parent.setdefault(step, {})
        last = steps[-1]
        if op in ("add", "replace"):
            if isinstance(parent, list):
                index = len(parent) if last == "-" else int(last)
                if op == "add":
                    parent.insert(index, operation.get("value"))
                else:
                    parent[index] = operation.get("value")
            else:
                if op == "replace" and last not in parent:
                    raise ApiError(
                        422,
                        "Invalid",
                        f"the server rejected our request due to an error in our request: replace operation does not apply: doc is missing key: {path}",
                    )
                parent[last] = operation.get("value")
        elif op == "remove":
            try:
                del parent[int(last) if isinstance(parent, list) else last]
            except (KeyError, IndexError):
                raise ApiError(
                    422,
                    "Invalid",
                    f"the server rejected our request due to an error in our request: remove operation does not apply: doc is missing path: {path}",
                ) from None
        elif op == "test":
            if parent.get(last) != operation.get("value"):
                raise ApiError(
                    422,
                    "Invalid",
                    "the server rejected our request due to an error in our request: testing value failed",
                )
        else:
            raise ApiError(
                422, "Invalid", f"the server rejected our request due to an error in our request: Unexpected kind: {op}"
            )
    return result


# ---------------------------------------------------------------- schema


def validate_schema(schema: dict, value: object, path: str, errors: list[tuple[str, str]]) -> None:
    """A small structural-schema check: type, required, enum, unknown fields."""
    if not isinstance(schema, dict):
        return
    kind = schema.get("type")
    checks = {
        "object": dict,
        "array": list,
        "string": str,
        "boolean": bool,
        "integer": int,
        "number": (int, float),
    }
    if kind in checks and value is not None:
        ok = isinstance(value, checks[kind]) and not (kind in ("integer", "number") and isinstance(value, bool))
        if not ok:
            errors.append(
                (
                    path,
                    f'Invalid value: "{_type_name(value)}": {path} in body must be of type {kind}: "{_type_name(value)}"',
                )
            )
            return
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(json.dumps(v) for v in schema["enum"])
        errors.append((path, f"Unsupported value: {json.dumps(value)}: supported values: {allowed}"))
    if isinstance(value, dict):
        properties = schema.get("properties")
        for required in schema.get("required", []) or []:
            if required not in value:
                errors.append((f"{path}.{required}" if path else required, "Required value"))
        if properties is not None and not schema.get("x-kubernetes-preserve-unknown-fields"):
            extra = schema.get("additionalProperties")
            for key, item in value.items():
                child = f"{path}.{key}" if path else key
                if key in properties:
                    validate_schema(properties[key], item, child, errors)
                elif isinstance(extra, dict):
                    validate_schema(extra, item, child, errors)
                elif extra is not True:
                    errors.append((child, "field not declared in schema"))
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            validate_schema(schema["items"], item, f"{path}[{index}]", errors)


def _type_name(value: object) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number"}.get(
        type(value), "null"
    )


# ---------------------------------------------------------------- the store


class Store:
    """All objects of the cluster, persisted to one JSON file."""

    def __init__(self, path: Path, service_cidr: str, signing_cert: str, signing_key: str) -> None:
        self.path = path
        self.lock = threading.RLock()
        self.service_cidr = ipaddress.ip_network(service_cidr, strict=False)
        self.signing_cert = signing_cert
        self.signing_key = signing_key
        if path.exists():
            self.state = json.loads(path.read_text())
        else:
            self.state = {"resourceVersion": 1, "objects": {}}
        for namespace in DEFAULT_NAMESPACES:
            key = self.key(self.builtin("namespaces"), "", namespace)
            if key not in self.state["objects"]:
                self._insert(self.builtin("namespaces"), "", {"metadata": {"name": namespace}})
        self.save()

    # -- registry

    def builtin(self, plural: str, group: str = "") -> ResourceType:
        return next(rt for rt in BUILTIN if rt.plural == plural and rt.group == group)

    def resource_types(self) -> list[ResourceType]:
        result = list(BUILTIN)
        for obj in self._objects(self.builtin("customresourcedefinitions", "apiextensions.k8s.io")):
            result.extend(from_crd(obj))
        return result

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        for rt in self.resource_types():
            if rt.group == group and rt.version == version and rt.plural == plural:
                return rt
        return None

    # -- raw access

    @staticmethod
    def key(rt: ResourceType, namespace: str, name: str) -> str:
        return f"{rt.storage_key}/{namespace}/{name}"

    def _objects(self, rt: ResourceType, namespace: str | None = None) -> list[dict]:
        prefix = f"{rt.storage_key}/" + (f"{namespace}/" if namespace is not None else "")
        return [obj for key, obj in sorted(self.state["objects"].items()) if key.startswith(prefix)]

    def save(self) -> None:
        atomic_write(self.path, json.dumps(self.state, indent=1, sort_keys=True), 0o600)

    def _next_rv(self) -> str:
        self.state["resourceVersion"] += 1
        return str(self.state["resourceVersion"])

    def _insert(self, rt: ResourceType, namespace: str, obj: dict) -> dict:
        obj = copy.deepcopy(obj)
        obj["apiVersion"] = rt.group_version
        obj["kind"] = rt.kind
        meta = obj.setdefault("metadata", {})
        if rt.namespaced:
            meta["namespace"] = namespace
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = rfc3339(now())
        meta["resourceVersion"] = self._next_rv()
        if rt.group and rt.plural not in ("customresourcedefinitions",):
            meta["generation"] = 1
        self._admit(rt, obj, None)
        self.state["objects"][self.key(rt, namespace, meta["name"])] = obj
        return obj

    # -- admission and controllers (what kube-controller-manager would do)

    def _admit(self, rt: ResourceType, obj: dict, old: dict | None) -> None:
        meta = obj["metadata"]
        if rt.plural == "namespaces":
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
            obj["spec"] = {"finalizers": ["kubernetes"]}
            obj["status"] = {"phase": "Active"}
        elif rt.plural == "secrets" and not rt.group:
            self._admit_secret(rt, obj)
        elif rt.plural == "services" and not rt.group:
            self._admit_service(obj, old)
        elif rt.plural == "customresourcedefinitions":
            self._admit_crd(rt, obj, old)
        elif rt.plural == "certificatesigningrequests":
            if old is None:
                self._sign_kubelet_csr(rt, obj)
        elif rt.plural == "deployments" or rt.plural == "statefulsets":
            replicas = obj.get("spec", {}).get("replicas", 1)
            obj.setdefault("spec", {})["replicas"] = replicas
            obj["status"] = {
                "observedGeneration": meta.get("generation", 1),
                "replicas": replicas,
                "readyReplicas": replicas,
                "availableReplicas": replicas,
                "updatedReplicas": replicas,
                "conditions": [
                    {
                        "type": "Available",
                        "status": "True",
                        "reason": "MinimumReplicasAvailable",
                        "message": f"{rt.kind} has minimum availability.",
                    }
                ],
            }
            if rt.plural == "statefulsets":
                obj["status"].pop("conditions")
                obj["status"]["currentReplicas"] = replicas
        elif rt.plural == "daemonsets":
            nodes = len(self._objects(self.builtin("nodes")))
            obj["status"] = {
                "observedGeneration": meta.get("generation", 1),
                "currentNumberScheduled": nodes,
                "desiredNumberScheduled": nodes,
                "numberAvailable": nodes,
                "numberReady": nodes,
                "updatedNumberScheduled": nodes,
                "numberMisscheduled": 0,
            }
        elif rt.crd:
            self._admit_custom(rt, obj)

    def _admit_secret(self, rt: ResourceType, obj: dict) -> None:
        data = obj.get("data") or {}
        causes = []
        for key, value in data.items():
            try:
                base64.b64decode(value, validate=True)
            except (ValueError, TypeError):
                causes.append((f"data[{key}]", "Invalid value: illegal base64 data"))
        for key, value in (obj.pop("stringData", None) or {}).items():
            data[key] = base64.b64encode(str(value).encode()).decode()
        if causes:
            raise invalid(rt, obj["metadata"]["name"], causes)
        if data:
            obj["data"] = data
        obj.setdefault("type", "Opaque")

    def _admit_service(self, obj: dict, old: dict | None) -> None:
        spec = obj.setdefault("spec", {})
        spec.setdefault("type", "ClusterIP")
        if old is not None and "clusterIP" not in spec:
            spec["clusterIP"] = old.get("spec", {}).get("clusterIP")
        if spec.get("clusterIP") in (None, ""):
            used = {o.get("spec", {}).get("clusterIP") for o in self._objects(self.builtin("services"))}
            for address in self.service_cidr.hosts():
                if str(address) not in used:
                    spec["clusterIP"] = str(address)
                    break
        if spec["clusterIP"] != "None":
            spec["clusterIPs"] = [spec["clusterIP"]]
        for port in spec.get("ports", []) or []:
            port.setdefault("protocol", "TCP")
            port.setdefault("targetPort", port.get("port"))
        obj.setdefault("status", {"loadBalancer": {}})

    def _admit_crd(self, rt: ResourceType, obj: dict, old: dict | None) -> None:
        name = obj["metadata"]["name"]
        spec = obj.get("spec") or {}
        names = spec.get("names") or {}
        causes: list[tuple[str, str]] = []
        group = spec.get("group", "")
        if not group or "." not in group:
            causes.append(("spec.group", f'Invalid value: "{group}": should be a domain with at least one dot'))
        if not names.get("plural"):
            causes.append(("spec.names.plural", "Required value"))
        if not names.get("kind"):
            causes.append(("spec.names.kind", "Required value"))
        if names.get("plural") and group and name != f"{names['plural']}.{group}":
            causes.append(("metadata.name", f'Invalid value: "{name}": must be spec.names.plural+"."+spec.group'))
        if spec.get("scope") not in ("Namespaced", "Cluster"):
            causes.append(
                (
                    "spec.scope",
                    f'Unsupported value: "{spec.get("scope", "")}": supported values: "Cluster", "Namespaced"',
                )
            )
        versions = spec.get("versions") or []
        if not versions:
            causes.append(
                ("spec.versions", "Invalid value: null: must have exactly one version marked as storage version")
            )
        elif sum(1 for v in versions if v.get("storage")) != 1:
            causes.append(("spec.versions", "Invalid value: must have exactly one version marked as storage version"))
        for index, version in enumerate(versions):
            if "schema" not in version or "openAPIV3Schema" not in (version.get("schema") or {}):
                causes.append(
                    (f"spec.versions[{index}].schema.openAPIV3Schema", "Required value: schemas are required")
                )
        if old is not None and old.get("spec", {}).get("scope") != spec.get("scope"):
            causes.append(("spec.scope", "Invalid value: field is immutable"))
        if causes:
            raise invalid(rt, name, causes)
        names.setdefault("singular", names["kind"].lower())
        names.setdefault("listKind", names["kind"] + "List")
        stored = set((old or {}).get("status", {}).get("storedVersions", []))
        stored.update(v["name"] for v in versions if v.get("storage"))
        stamp = rfc3339(now())
        obj["status"] = {
            "acceptedNames": dict(names),
            "conditions": [
                {
                    "type": "NamesAccepted",
                    "status": "True",
                    "reason": "NoConflicts",
                    "message": "no conflicts found",
                    "lastTransitionTime": stamp,
                },
                {
                    "type": "Established",
                    "status": "True",
                    "reason": "InitialNamesAccepted",
                    "message": "the initial names have been accepted",
                    "lastTransitionTime": stamp,
                },
            ],
            "storedVersions": sorted(stored),
        }

    def _admit_custom(self, rt: ResourceType, obj: dict) -> None:
        crd = self.state["objects"].get(f"apiextensions.k8s.io/customresourcedefinitions//{rt.crd}", {})
        for version in crd.get("spec", {}).get("versions", []):
            if version["name"] != rt.version:
                continue
            schema = dict((version.get("schema") or {}).get("openAPIV3Schema") or {})
            body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
            props = {
                k: v for k, v in (schema.get("properties") or {}).items() if k not in ("apiVersion", "kind", "metadata")
            }
            errors: list[tuple[str, str]] = []
            validate_schema({**schema, "properties": props}, body, "", errors)
            if errors:
                raise invalid(rt, obj["metadata"]["name"], errors)

    def _sign_kubelet_csr(self, rt: ResourceType, obj: dict) -> None:
        """csrapproving + csrsigning: approve and sign kubelet client CSRs from bootstrap tokens and nodes."""
        spec = obj.get("spec") or {}
        name = obj["metadata"]["name"]
        try:
            request = x509.load_pem_x509_csr(base64.b64decode(spec.get("request", "")))
        except ValueError:
            raise invalid(
                rt, name, [("spec.request", "Invalid value: PEM block type must be CERTIFICATE REQUEST")]
            ) from None
        if spec.get("signerName") != KUBELET_SIGNER:
            return
        common = [a.value for a in request.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
        orgs = [a.value for a in request.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
        if len(common) != 1 or not str(common[0]).startswith("system:node:") or orgs != ["system:nodes"]:
            raise invalid(
                rt, name, [("spec.request", 'Invalid value: subject must be "O=system:nodes, CN=system:node:<name>"')]
            )
        usages = set(spec.get("usages") or [])
        if "client auth" not in usages or not usages <= {"digital signature", "key encipherment", "client auth"}:
            raise invalid(rt, name, [("spec.usages", 'Unsupported value: usages must contain "client auth"')])
        requester = spec.get("username", "")
        groups = spec.get("groups") or []
        approved = NODE_BOOTSTRAP_GROUP in groups or requester == common[0]
        if not approved:
            return
        ca_cert = pki.load_cert(self.signing_cert)
        ca_key = pki.load_key(self.signing_key)
        seconds = spec.get("expirationSeconds") or 365 * 24 * 3600
        cert = pki.sign_public_key(
            pki.CertSpec(str(common[0]), ["system:nodes"], client=True),
            request.public_key(),
            ca_cert,
            ca_key,
            _dt.timedelta(seconds=max(600, int(seconds))),
        )
        stamp = rfc3339(now())
        obj["status"] = {
            "certificate": base64.b64encode(pki.cert_pem(cert)).decode(),
            "conditions": [
                {
                    "type": "Approved",
                    "status": "True",
                    "reason": "AutoApproved",
                    "message": "Auto approving kubelet client certificate after SubjectAccessReview.",
                    "lastUpdateTime": stamp,
                    "lastTransitionTime": stamp,
                }
            ],
        }

    # -- bootstrap tokens (token authenticator, tokencleaner, bootstrapsigner)

    def bootstrap_tokens(self) -> dict[str, dict[str, str]]:
        """Valid, unexpired bootstrap tokens by id, with their decoded data."""
        tokens = {}
        moment = now()
        secrets_rt = self.builtin("secrets")
        for obj in self._objects(secrets_rt, "kube-system"):
            if obj.get("type") != "bootstrap.kubernetes.io/token":
                continue
            data = {}
            for key, value in (obj.get("data") or {}).items():
                try:
                    data[key] = base64.b64decode(value).decode()
                except (ValueError, UnicodeDecodeError):
                    data[key] = ""
            token_id = data.get("token-id", "")
            if obj["metadata"]["name"] != f"bootstrap-token-{token_id}":
                continue
            expiration = data.get("expiration")
            if expiration:
                try:
                    if parse_rfc3339(expiration) <= moment:
                        continue
                except ValueError:
                    continue
            tokens[token_id] = data
        return tokens

    def clean_expired_tokens(self) -> None:
        moment = now()
        changed = False
        for key, obj in list(self.state["objects"].items()):
            if not key.startswith("/secrets/kube-system/bootstrap-token-"):
                continue
            expiration = (obj.get("data") or {}).get("expiration")
            if not expiration:
                continue
            try:
                expired = parse_rfc3339(base64.b64decode(expiration).decode()) <= moment
            except ValueError:
                expired = True
            if expired:
                del self.state["objects"][key]
                changed = True
        if changed:
            self._next_rv()
            self.save()

    def authenticate_token(self, token: str) -> User | None:
        match = TOKEN_RE.match(token)
        if not match:
            return None
        data = self.bootstrap_tokens().get(match.group(1))
        if not data or not hmac.compare_digest(data.get("token-secret", ""), match.group(2)):
            return None
        if data.get("usage-bootstrap-authentication") != "true":
            return None
        groups = ["system:bootstrappers"]
        groups += [g for g in data.get("auth-extra-groups", "").split(",") if g]
        return User(f"system:bootstrap:{match.group(1)}", groups + ["system:authenticated"])

    def decorate(self, rt: ResourceType, obj: dict) -> dict:
        """What the bootstrap signer keeps in kube-public/cluster-info."""
        if (
            rt.plural != "configmaps"
            or rt.group
            or obj["metadata"].get("namespace") != "kube-public"
            or obj["metadata"]["name"] != "cluster-info"
        ):
            return obj
        obj = copy.deepcopy(obj)
        data = {k: v for k, v in (obj.get("data") or {}).items() if not k.startswith("jws-kubeconfig-")}
        if "kubeconfig" in data:
            for token_id, token in sorted(self.bootstrap_tokens().items()):
                if token.get("usage-bootstrap-signing") == "true":
                    data[f"jws-kubeconfig-{token_id}"] = pki.detached_jws(
                        data["kubeconfig"], token_id, token.get("token-secret", "")
                    )
        obj["data"] = data
        return obj

    # -- CRUD

    def get(self, rt: ResourceType, namespace: str, name: str) -> dict:
        obj = self.state["objects"].get(self.key(rt, namespace if rt.namespaced else "", name))
        if obj is None:
            raise not_found(rt, name)
        return self.present(rt, obj)

    def present(self, rt: ResourceType, obj: dict) -> dict:
        obj = self.decorate(rt, obj)
        if rt.crd:
            obj = dict(obj, apiVersion=rt.group_version)
        return obj

    def list(self, rt: ResourceType, namespace: str | None, labels: str, fields: str) -> dict:
        requirements = parse_label_selector(labels) if labels else []
        items = []
        for obj in self._objects(rt, namespace if rt.namespaced else None):
            obj = self.present(rt, obj)
            if labels_match(requirements, obj["metadata"].get("labels") or {}) and (
                not fields or fields_match(fields, obj)
            ):
                items.append(obj)
        return {
            "kind": f"{rt.kind}List",
            "apiVersion": rt.group_version,
            "metadata": {"resourceVersion": str(self.state["resourceVersion"])},
            "items": items,
        }

    def _check_body(self, rt: ResourceType, namespace: str, obj: dict, name: str | None) -> dict:
        if not isinstance(obj, dict):
            raise ApiError(400, "BadRequest", "the object provided is unrecognized (must be of type Object)")
        api_version = obj.get("apiVersion")
        if api_version and api_version != rt.group_version:
            raise ApiError(
                400,
                "BadRequest",
                f"the API version in the data ({api_version}) does not match the expected API version ({rt.group_version})",
            )
        if obj.get("kind") and obj["kind"] != rt.kind:
            raise ApiError(
                400, "BadRequest", f"the kind in the data ({obj['kind']}) does not match the expected kind ({rt.kind})"
            )
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ApiError(400, "BadRequest", "metadata must be an object")
        if rt.namespaced:
            if meta.get("namespace") not in (None, "", namespace):
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on the request",
                )
        else:
            meta.pop("namespace", None)
        if not meta.get("name") and meta.get("generateName") and name is None:
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        obj_name = meta.get("name") or ""
        if not obj_name:
            raise invalid(rt, "", [("metadata.name", "Required value: name or generateName is required")])
        if name is not None and obj_name != name:
            raise ApiError(
                400, "BadRequest", f"the name of the object ({obj_name}) does not match the name on the URL ({name})"
            )
        valid_name = NAME_RE.match(obj_name) and len(obj_name) <= 253
        if rt.plural == "nodes" or rt.crd or rt.group.startswith("rbac"):
            valid_name = valid_name or (rt.group.startswith("rbac") and ":" in obj_name)
        if not valid_name:
            raise invalid(
                rt,
                obj_name,
                [
                    (
                        "metadata.name",
                        f'Invalid value: "{obj_name}": {SUBDOMAIN_MESSAGE}',
                    )
                ],
            )
        if rt.namespaced and self.key(self.builtin("namespaces"), "", namespace) not in self.state["objects"]:
            raise not_found(self.builtin("namespaces"), namespace)
        for key in ("uid", "creationTimestamp", "selfLink", "managedFields", "deletionTimestamp"):
            meta.pop(key, None)
        return obj

    def create(self, rt: ResourceType, namespace: str, obj: dict, requester: User) -> dict:
        obj = self._check_body(rt, namespace, copy.deepcopy(obj), None)
        name = obj["metadata"]["name"]
        if self.key(rt, namespace if rt.namespaced else "", name) in self.state["objects"]:
            raise ApiError(409, "AlreadyExists", f'{rt.qualified} "{name}" already exists', _details(rt, name))
        if rt.plural == "certificatesigningrequests":
            spec = obj.setdefault("spec", {})
            spec["username"] = requester.name
            spec["groups"] = requester.groups
        obj["metadata"].pop("resourceVersion", None)
        stored = self._insert(rt, namespace if rt.namespaced else "", obj)
        self.save()
        return self.present(rt, stored)

    def update(self, rt: ResourceType, namespace: str, name: str, obj: dict, status_only: bool = False) -> dict:
        namespace = namespace if rt.namespaced else ""
        key = self.key(rt, namespace, name)
        old = self.state["objects"].get(key)
        if old is None:
            raise not_found(rt, name)
        obj = self._check_body(rt, namespace, copy.deepcopy(obj), name)
        given_rv = obj["metadata"].get("resourceVersion")
        if given_rv and given_rv != old["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {rt.qualified} "{name}": the object has been modified; '
                "please apply your changes to the latest version and try again",
                _details(rt, name),
            )
        if status_only:
            merged = copy.deepcopy(old)
            merged["status"] = obj.get("status")
            obj = merged
        elif rt.has_status and rt.crd:
            obj["status"] = old.get("status")
            if obj["status"] is None:
                obj.pop("status")
        meta = obj["metadata"]
        for key_name in ("uid", "creationTimestamp", "generation"):
            if key_name in old["metadata"]:
                meta[key_name] = old["metadata"][key_name]
        if "generation" in meta and obj.get("spec") != old.get("spec"):
            meta["generation"] += 1
        obj["apiVersion"], obj["kind"] = rt.group_version, rt.kind
        if rt.namespaced:
            meta["namespace"] = namespace
        self._admit(rt, obj, old)
        if _without_rv(obj) == _without_rv(old):
            return self.present(rt, old)
        meta["resourceVersion"] = self._next_rv()
        self.state["objects"][key] = obj
        self.save()
        return self.present(rt, obj)

    def delete(self, rt: ResourceType, namespace: str, name: str) -> dict:
        namespace = namespace if rt.namespaced else ""
        key = self.key(rt, namespace, name)
        obj = self.state["objects"].pop(key, None)
        if obj is None:
            raise not_found(rt, name)
        if rt.plural == "namespaces" and not rt.group:
            if name in DEFAULT_NAMESPACES:
                self.state["objects"][key] = obj
                raise ApiError(
                    403,
                    "Forbidden",
                    f'namespaces "{name}" is forbidden: this namespace may not be deleted',
                    _details(rt, name),
                )
            for other in list(self.state["objects"]):
                if other.split("/")[2] == name:
                    del self.state["objects"][other]
        if rt.plural == "customresourcedefinitions":
            group_plural = f"{obj['spec']['group']}/{obj['spec']['names']['plural']}/"
            for other in list(self.state["objects"]):
                if other.startswith(group_plural):
                    del self.state["objects"][other]
        self._next_rv()
        self.save()
        return self.present(rt, obj)


def _without_rv(obj: dict) -> dict:
    clone = copy.deepcopy(obj)
    clone.get("metadata", {}).pop("resourceVersion", None)
    return clone


# ---------------------------------------------------------------- authorization


def authorize(user: User, verb: str, rt: ResourceType, namespace: str, name: str) -> bool:
    if user.is_admin:
        return True
    if user.name.startswith("system:node:") and "system:nodes" in user.groups:
        node = user.name[len("system:node:") :]
        if rt.plural == "nodes" and not rt.group:
            return verb in ("get", "list") or (verb in ("create", "update", "patch") and name in ("", node))
        if rt.plural == "certificatesigningrequests":
            return verb in ("create", "get", "list")
        return (
            not rt.group
            and rt.plural in ("services", "namespaces", "configmaps", "pods", "endpoints")
            and verb in ("get", "list")
        )
    if NODE_BOOTSTRAP_GROUP in user.groups:
        if rt.plural == "certificatesigningrequests":
            return verb in ("create", "get", "list")
        if rt.plural == "nodes" and not rt.group:
            return verb == "get"
        if rt.plural == "configmaps" and namespace == "kube-system" and verb == "get":
            return name in ("kubeadm-config", "kubelet-config", "kube-proxy")
        if rt.plural == "secrets" and namespace == "kube-system" and verb == "get":
            return name == "kubeadm-certs"
    if rt.plural == "configmaps" and not rt.group and namespace == "kube-public" and name == "cluster-info":
        return verb == "get"
    return False


def forbidden(user: User, verb: str, rt: ResourceType, namespace: str, name: str) -> ApiError:
    subject = f'{rt.qualified} "{name}"' if name else rt.qualified
    scope = f'in the namespace "{namespace}"' if rt.namespaced and namespace else "at the cluster scope"
    message = (
        f'{subject} is forbidden: User "{user.name}" cannot {verb} resource "{rt.plural}" '
        f'in API group "{rt.group}" {scope}'
    )
    return ApiError(403, "Forbidden", message, _details(rt, name))


# ---------------------------------------------------------------- HTTP


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "kube-apiserver-double"
    timeout = 60

    @property
    def store(self) -> Store:
        return self.server.store  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        sys.stderr.write("%s %s\n" % (self.address_string(), format % args))

    def _send_json(self, code: int, body: object) -> None:
        payload = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _send_text(self, code: int, text: str) -> None:
        payload = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _authenticate(self) -> User:
        header = self.headers.get("Authorization", "")
        if header:
            scheme, _unused, token = header.partition(" ")
            user = self.store.authenticate_token(token.strip()) if scheme.lower() == "bearer" else None
            if user is None:
                raise ApiError(401, "Unauthorized", "Unauthorized")
            return user
        peer = None
        try:
            peer = self.connection.getpeercert()  # type: ignore[attr-defined]
        except (AttributeError, ValueError):
            peer = None
        if peer:
            subject = [entry for rdn in peer.get("subject", ()) for entry in rdn]
            common = [v for k, v in subject if k == "commonName"]
            orgs = [v for k, v in subject if k == "organizationName"]
            if common:
                return User(common[0], orgs + ["system:authenticated"])
        return ANONYMOUS

    def _body(self) -> object:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw or b"null")
        except json.JSONDecodeError as exc:
            raise ApiError(400, "BadRequest", f"the object provided is unrecognized: {exc}") from None

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        parsed = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(parsed.query))
        path = parsed.path.rstrip("/") or "/"
        try:
            # Read every body (DELETE may carry DeleteOptions) so a kept-alive connection stays in sync.
            body = self._body()
            if method not in ("POST", "PUT", "PATCH"):
                body = None
            with self.store.lock:
                self.store.clean_expired_tokens()
                user = self._authenticate()
                code, response = self._route(method, path, query, body, user)
            if isinstance(response, str):
                self._send_text(code, response)
            else:
                self._send_json(code, response)
        except ApiError as exc:
            self._send_json(exc.code, exc.status())
        except DoubleError as exc:
            self._send_json(500, ApiError(500, "InternalError", str(exc)).status())

    def _route(self, method: str, path: str, query: dict, body: object, user: User) -> tuple[int, object]:
        if path in ("/healthz", "/livez", "/readyz"):
            return 200, "ok"
        if path == "/version":
            return 200, version_info()
        nonresource = path in ("/", "/api", "/apis") or re.fullmatch(r"/apis/[^/]+(/[^/]+)?|/api/v1", path)
        if nonresource:
            if user is ANONYMOUS:
                raise ApiError(403, "Forbidden", f'forbidden: User "system:anonymous" cannot get path "{path}"', {})
            if method != "GET":
                raise ApiError(
                    405, "MethodNotAllowed", "the server does not allow this method on the requested resource", {}
                )
            return 200, self._discovery(path)
        match = re.fullmatch(r"/(?:api/(v1)|apis/([^/]+)/([^/]+))/(.+)", path)
        if not match:
            return 404, "404 page not found\n"
        group = match.group(2) or ""
        version = match.group(1) or match.group(3)
        parts = match.group(4).split("/")
        namespace = ""
        if parts[0] == "namespaces" and len(parts) >= 3:
            namespace = parts[1]
            parts = parts[2:]
        plural, name = parts[0], parts[1] if len(parts) > 1 else ""
        subresource = parts[2] if len(parts) > 2 else ""
        if len(parts) > 3 or subresource not in ("", "status"):
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        rt = self.store.lookup(group, version, plural)
        if rt is None or (namespace and not rt.namespaced):
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        if subresource and not rt.has_status:
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        verb = {
            "GET": "get" if name else "list",
            "POST": "create",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete" if name else "deletecollection",
        }[method]
        if query.get("watch") in ("true", "1"):
            raise ApiError(405, "MethodNotAllowed", "watch is not supported by the API server double", {})
        if method == "POST" and name:
            raise ApiError(
                405, "MethodNotAllowed", "the server does not allow this method on the requested resource", {}
            )
        if method in ("PUT", "PATCH") and not name:
            raise ApiError(
                405, "MethodNotAllowed", "the server does not allow this method on the requested resource", {}
            )
        if not authorize(user, verb, rt, namespace, name):
            raise forbidden(user, verb, rt, namespace, name)
        dry_run = "dryRun" in query
        if verb == "get":
            return 200, self.store.get(rt, namespace, name)
        if verb == "list":
            return 200, self.store.list(
                rt, namespace or None, query.get("labelSelector", ""), query.get("fieldSelector", "")
            )
        if verb == "create":
            if dry_run:
                return 201, body
            if rt.plural == "nodes" and user.name.startswith("system:node:") and not user.is_admin:
                node_name = (body or {}).get("metadata", {}).get("name") if isinstance(body, dict) else None
                if node_name != user.name[len("system:node:") :]:
                    raise forbidden(user, verb, rt, namespace, node_name or "")
            return 201, self.store.create(rt, namespace, body, user)
        if verb == "update":
            return 200, self.store.update(rt, namespace, name, body, status_only=subresource == "status")
        if verb == "patch":
            current = self.store.get(rt, namespace, name)
            content_type = self.headers.get("Content-Type", "").split(";")[0]
            if content_type == "application/json-patch+json":
                patched = json_patch(current, body if isinstance(body, list) else [])
            elif content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                patched = merge_patch(current, body)
            else:
                raise ApiError(
                    415,
                    "UnsupportedMediaType",
                    "the body of the request was in an unknown format - accepted media types include: "
                    "application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json",
                    {},
                )
            if isinstance(patched, dict):
                patched.get("metadata", {}).pop("resourceVersion", None)
            return 200, self.store.update(rt, namespace, name, patched, status_only=subresource == "status")
        if verb == "delete":
            return 200, self.store.delete(rt, namespace, name)
        listing = self.store.list(rt, namespace or None, query.get("labelSelector", ""), query.get("fieldSelector", ""))
        for item in listing["items"]:
            self.store.delete(rt, item["metadata"].get("namespace", ""), item["metadata"]["name"])
        return 200, listing

    def _discovery(self, path: str) -> dict:
        types = self.store.resource_types()
        if path == "/":
            paths = ["/api", "/api/v1", "/apis", "/healthz", "/livez", "/readyz", "/version"]
            paths += sorted(
                {f"/apis/{rt.group}" for rt in types if rt.group}
                | {f"/apis/{rt.group_version}" for rt in types if rt.group}
            )
            return {"paths": sorted(paths)}
        if path == "/api":
            host, port = self.server.server_address[:2]  # type: ignore[attr-defined]
            advertise = getattr(self.server, "advertise", f"{host}:{port}")
            return {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": advertise}],
            }
        groups: dict[str, list[str]] = {}
        for rt in types:
            if rt.group and rt.version not in groups.setdefault(rt.group, []):
                groups[rt.group].append(rt.version)

        def group_entry(name: str) -> dict:
            versions = sorted(groups[name], key=_version_priority)
            entries = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
            return {"name": name, "versions": entries, "preferredVersion": entries[0]}

        if path == "/apis":
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group_entry(g) for g in groups]}
        parts = path.split("/")[2:]
        if path == "/api/v1":
            group, version = "", "v1"
        elif len(parts) == 1:
            if parts[0] not in groups:
                raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
            return {"kind": "APIGroup", "apiVersion": "v1", **group_entry(parts[0])}
        else:
            group, version = parts
        resources = [
            entry for rt in types if rt.group == group and rt.version == version for entry in discovery_resource(rt)
        ]
        if not resources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": resources,
        }


def _version_priority(version: str) -> tuple:
    """Kubernetes version ordering: GA > beta > alpha, higher numbers first."""
    match = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if not match:
        return (3, version)
    major, stage, minor = match.groups()
    rank = {None: 0, "beta": 1, "alpha": 2}[stage]
    return (rank, -int(major), -int(minor or 0))


class ApiServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], context: ssl.SSLContext, store: Store, advertise: str) -> None:
        self.context = context
        self.store = store
        self.advertise = advertise
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, Handler)

    def finish_request(self, request: socket.socket, client_address: object) -> None:
        # The TLS handshake runs in the request thread so one slow client cannot stall the others.
        request.settimeout(30)
        # Headers and body go out in separate writes; without TCP_NODELAY each response waits for a delayed ACK.
        request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            return
        try:
            Handler(tls, client_address, self)
        finally:
            try:
                tls.close()
            except OSError:
                pass

    def handle_error(self, request: object, client_address: object) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, ssl.SSLError, TimeoutError)):
            return
        super().handle_error(request, client_address)


# ---------------------------------------------------------------- program

_REAL_FLAGS = {
    "advertise-address",
    "bind-address",
    "secure-port",
    "tls-cert-file",
    "tls-private-key-file",
    "client-ca-file",
    "service-cluster-ip-range",
    "allow-privileged",
    "authorization-mode",
    "enable-admission-plugins",
    "enable-bootstrap-token-auth",
    "etcd-cafile",
    "etcd-certfile",
    "etcd-keyfile",
    "etcd-servers",
    "kubelet-client-certificate",
    "kubelet-client-key",
    "kubelet-preferred-address-types",
    "proxy-client-cert-file",
    "proxy-client-key-file",
    "requestheader-allowed-names",
    "requestheader-client-ca-file",
    "requestheader-extra-headers-prefix",
    "requestheader-group-headers",
    "requestheader-username-headers",
    "service-account-issuer",
    "service-account-key-file",
    "service-account-signing-key-file",
    "v",
}
_DOUBLE_FLAGS = {"double-state-file", "double-pid-file", "double-cluster-signing-key-file"}


def parse_flags(argv: list[str]) -> dict[str, str]:
    flags: dict[str, str] = {}
    args = list(argv)
    while args:
        arg = args.pop(0)
        if not arg.startswith("--"):
            raise DoubleError(f'unknown command "{arg}" for "kube-apiserver"')
        name, has_value, value = arg[2:].partition("=")
        if name not in _REAL_FLAGS | _DOUBLE_FLAGS:
            raise DoubleError(f"unknown flag: --{name}")
        if not has_value:
            if not args:
                raise DoubleError(f"flag needs an argument: --{name}")
            value = args.pop(0)
        flags[name] = value
    return flags


def main(argv: list[str]) -> int:
    if argv in (["--version"], ["--version=true"]):
        print(f"Kubernetes {version_info()['gitVersion']}")
        return 0
    try:
        flags = parse_flags(argv)
    except DoubleError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    pki_dir = "/etc/kubernetes/pki"
    cert_file = flags.get("tls-cert-file", f"{pki_dir}/apiserver.crt")
    key_file = flags.get("tls-private-key-file", f"{pki_dir}/apiserver.key")
    ca_file = flags.get("client-ca-file", f"{pki_dir}/ca.crt")
    signing_key = flags.get("double-cluster-signing-key-file", os.path.join(os.path.dirname(ca_file), "ca.key"))
    state_file = flags.get("double-state-file", APISERVER_STATE_FILE)
    pid_file = flags.get("double-pid-file", "")
    bind = os.environ.get("K8S_DOUBLES_APISERVER_BIND_ADDRESS") or flags.get("bind-address", "0.0.0.0")
    port = int(flags.get("secure-port", "6443"))
    advertise = f"{flags.get('advertise-address', bind)}:{port}"

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(str(host_path(cert_file)), str(host_path(key_file)))
        context.load_verify_locations(str(host_path(ca_file)))
    except (OSError, ssl.SSLError) as exc:
        print(f'E0000 run.go:72] "command failed" err="unable to load server certificate: {exc}"', file=sys.stderr)
        return 1
    context.verify_mode = ssl.CERT_OPTIONAL

    store = Store(host_path(state_file), flags.get("service-cluster-ip-range", "10.96.0.0/12"), ca_file, signing_key)
    try:
        server = ApiServer((bind, port), context, store, advertise)
    except OSError as exc:
        print(f'E0000 run.go:72] "command failed" err="failed to listen on {bind}:{port}: {exc}"', file=sys.stderr)
        return 1
    if pid_file:
        atomic_write(host_path(pid_file), f"{os.getpid()}\n", 0o644)

    def stop(signum: int, frame: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"I0000 secure_serving.go:213] Serving securely on {bind}:{port}", file=sys.stderr, flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        if pid_file:
            try:
                host_path(pid_file).unlink()
            except FileNotFoundError:
                pass
    return 0
