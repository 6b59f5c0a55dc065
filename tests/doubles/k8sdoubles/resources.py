"""The resource types the API double serves, and the CRD-derived ones."""

from __future__ import annotations

from dataclasses import dataclass, field

ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update"]


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    singular: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    has_status: bool = True
    crd: str = ""
    printer_columns: tuple = field(default=(), compare=False)

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """`deployments.apps` style name used in API error messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def kind_qualified(self) -> str:
        """`deployment.apps` style name kubectl prints."""
        return f"{self.kind.lower()}.{self.group}" if self.group else self.kind.lower()

    @property
    def storage_key(self) -> str:
        return f"{self.group}/{self.plural}"


def _rt(group: str, plural: str, kind: str, namespaced: bool, *short: str, status: bool = True) -> ResourceType:
    singular = "endpoints" if kind == "Endpoints" else kind.lower()
    return ResourceType(group, "v1", plural, singular, kind, namespaced, tuple(short), has_status=status)


BUILTIN: list[ResourceType] = [
    _rt("", "namespaces", "Namespace", False, "ns"),
    _rt("", "nodes", "Node", False, "no"),
    _rt("", "secrets", "Secret", True, status=False),
    _rt("", "configmaps", "ConfigMap", True, "cm", status=False),
    _rt("", "services", "Service", True, "svc"),
    _rt("", "serviceaccounts", "ServiceAccount", True, "sa", status=False),
    _rt("", "pods", "Pod", True, "po"),
    _rt("", "endpoints", "Endpoints", True, "ep", status=False),
    _rt("", "events", "Event", True, "ev", status=False),
    _rt("apps", "deployments", "Deployment", True, "deploy"),
    _rt("apps", "daemonsets", "DaemonSet", True, "ds"),
    _rt("apps", "statefulsets", "StatefulSet", True, "sts"),
    _rt("batch", "jobs", "Job", True),
    _rt("apiextensions.k8s.io", "customresourcedefinitions", "CustomResourceDefinition", False, "crd", "crds"),
    _rt("certificates.k8s.io", "certificatesigningrequests", "CertificateSigningRequest", False, "csr"),
    _rt("rbac.authorization.k8s.io", "clusterroles", "ClusterRole", False, status=False),
    _rt("rbac.authorization.k8s.io", "clusterrolebindings", "ClusterRoleBinding", False, status=False),
    _rt("rbac.authorization.k8s.io", "roles", "Role", True, status=False),
    _rt("rbac.authorization.k8s.io", "rolebindings", "RoleBinding", True, status=False),
    _rt("coordination.k8s.io", "leases", "Lease", True, status=False),
]


def from_crd(crd: dict) -> list[ResourceType]:
    """One ResourceType per served version of an established CRD."""
    spec = crd.get("spec", {})
    names = spec.get("names", {})
    result = []
    for version in spec.get("versions", []):
        if not version.get("served"):
            continue
        columns = tuple(
            (col.get("name", ""), col.get("jsonPath", ""), col.get("type", "string"))
            for col in version.get("additionalPrinterColumns", []) or []
        )
        result.append(
            ResourceType(
                group=spec["group"],
                version=version["name"],
                plural=names["plural"],
                singular=names.get("singular") or names["kind"].lower(),
                kind=names["kind"],
                namespaced=spec.get("scope") == "Namespaced",
                short_names=tuple(names.get("shortNames", []) or []),
                categories=tuple(names.get("categories", []) or []),
                has_status="status" in (version.get("subresources") or {}),
                crd=crd["metadata"]["name"],
                printer_columns=columns,
            )
        )
    return result


def discovery_resource(rt: ResourceType) -> list[dict]:
    entry: dict = {
        "name": rt.plural,
        "singularName": rt.singular,
        "namespaced": rt.namespaced,
        "kind": rt.kind,
        "verbs": ALL_VERBS,
    }
    if rt.short_names:
        entry["shortNames"] = list(rt.short_names)
    if rt.categories:
        entry["categories"] = list(rt.categories)
    entries = [entry]
    if rt.has_status:
        entries.append(
            {
                "name": f"{rt.plural}/status",
                "singularName": "",
                "namespaced": rt.namespaced,
                "kind": rt.kind,
                "verbs": ["get", "patch", "update"],
            }
        )
    return entries
