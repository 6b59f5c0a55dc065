# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The in-place Kubernetes upgrade: the preflight's decisions (pure, over what the API reports) and the kubeadm steps.

The decisions collect every problem, not just the first, so that an operator fixes them in one go; each names the node
or the version it is about.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import ADMIN_CONF, Kubeadm, KubeadmError

_SEMVER = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$")
KUBE_APISERVER_MANIFEST = "/etc/kubernetes/manifests/kube-apiserver.yaml"


class UpgradeRefused(ValueError):
    """The upgrade may not start; the message lists every reason."""


@dataclass(frozen=True, order=True)
class Version:
    """A Kubernetes version as semver orders it: a pre-release sorts before its release."""

    major: int
    minor: int
    patch: int
    release: bool  # False for a pre-release (v1.20.3-lab.1 < v1.20.3)
    pre_release: str

    @classmethod
    def parse(cls, text: str) -> Version:
        match = _SEMVER.match(str(text).strip())
        if not match:
            raise UpgradeRefused(f"{text!r} is not a Kubernetes version (vMAJOR.MINOR.PATCH[-PRE-RELEASE])")
        pre = match.group(4) or ""
        return cls(int(match.group(1)), int(match.group(2)), int(match.group(3)), not pre, pre)

    def __str__(self) -> str:
        return f"v{self.major}.{self.minor}.{self.patch}" + (f"-{self.pre_release}" if self.pre_release else "")


@dataclass(frozen=True)
class NodeReport:
    """What the API says about one node: its kubelet's version and whether it is Ready."""

    name: str
    kubelet_version: str
    ready: bool


def nodes_from_api(node_list: dict) -> list[NodeReport]:
    """The NodeReports of `kubectl get nodes -o json`."""
    reports = []
    for item in node_list.get("items", []):
        conditions = item.get("status", {}).get("conditions", [])
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        reports.append(
            NodeReport(
                name=item["metadata"]["name"],
                kubelet_version=item.get("status", {}).get("nodeInfo", {}).get("kubeletVersion", ""),
                ready=ready,
            )
        )
    return reports


def upgrade_problems(
    server_version: str, nodes: list[NodeReport], target: str, allow_pre_release: bool = False
) -> list[str]:
    """Every reason the upgrade from what the API reports to `target` may not start; [] when it may.

    The target is a patch of the control plane's minor or the next minor, never lower than what any node runs (a
    resumed upgrade finds some nodes at the target already); a pre-release target needs allow_pre_release (kubeadm
    upgrade treats it as unstable); every node is Ready.
    """
    problems = []
    try:
        wanted = Version.parse(target)
    except UpgradeRefused as exc:
        return [f"kubernetes_version: {exc}"]
    try:
        server = Version.parse(server_version)
    except UpgradeRefused as exc:
        return [f"the API server's version: {exc}"]
    if wanted.pre_release and not allow_pre_release:
        problems.append(
            f"{wanted} is a pre-release, which kubeadm upgrade treats as unstable: set "
            "upgrade_kubernetes_allow_pre_release: true to upgrade to it"
        )
    if (wanted.major, wanted.minor) > (server.major, server.minor + 1) or wanted.major != server.major:
        problems.append(
            f"{wanted} is more than one minor above the control plane's {server}: upgrade one minor at a time "
            f"(first to a v{server.major}.{server.minor + 1} patch)"
        )
    if wanted < server:
        problems.append(f"{wanted} is lower than the control plane's {server}: a downgrade is not an upgrade")
    for node in nodes:
        try:
            kubelet = Version.parse(node.kubelet_version)
        except UpgradeRefused as exc:
            problems.append(f"node {node.name}: its kubelet version: {exc}")
            continue
        if kubelet > wanted:
            problems.append(f"node {node.name} runs kubelet {kubelet}, newer than the target {wanted}")
        if not node.ready:
            problems.append(f"node {node.name} is not Ready: fix or remove it before an upgrade")
    return problems


def pending_nodes(nodes: list[NodeReport], target: str) -> list[str]:
    """The nodes whose kubelet does not yet run the target version, in the API's order."""
    wanted = Version.parse(target)
    return [node.name for node in nodes if Version.parse(node.kubelet_version) != wanted]


def static_pod_version(manifest: dict) -> str:
    """The version of a kubeadm static pod: its first container's image tag (kube-apiserver:v1.20.2 -> v1.20.2)."""
    containers = manifest.get("spec", {}).get("containers") or [{}]
    image = str(containers[0].get("image", ""))
    return image.rpartition(":")[2] if ":" in image.rpartition("/")[2] else ""


class Upgrade:
    """`kubeadm upgrade apply` on the first control plane and `kubeadm upgrade node` on every other node."""

    def __init__(self, kubeadm: Kubeadm) -> None:
        self.kubeadm = kubeadm

    def apply(self, target: str, allow_pre_release: bool, ignore_preflight_errors: list[str]) -> str:
        """`kubeadm upgrade apply <target> -y`; kubeadm's own version policy runs again inside it."""
        args = ["upgrade", "apply", str(Version.parse(target)), "--yes"]
        if allow_pre_release:
            args.append("--allow-experimental-upgrades")
        if ignore_preflight_errors:
            args.append("--ignore-preflight-errors=" + ",".join(ignore_preflight_errors))
        return self.kubeadm.run(*args, what=f"kubeadm upgrade apply {target}")

    def node(self, ignore_preflight_errors: list[str]) -> str:
        """`kubeadm upgrade node`: a control plane's static pods (after pulling their images) and every node's kubelet
        configuration."""
        args = ["upgrade", "node"]
        if ignore_preflight_errors:
            args.append("--ignore-preflight-errors=" + ",".join(ignore_preflight_errors))
        return self.kubeadm.run(*args, what="kubeadm upgrade node")

    def revoke_token_rights(self, check_mode: bool = False) -> list[str]:
        """`kubeadm upgrade apply` re-creates the bindings that give bootstrap tokens certificate rights (its
        post-upgrade RBAC step, as `kubeadm init` does); they are removed again, as after init and joins."""
        return self.kubeadm.revoke_token_certificate_rights(ADMIN_CONF, check_mode)


__all__ = [
    "KubeadmError",
    "NodeReport",
    "Upgrade",
    "UpgradeRefused",
    "Version",
    "nodes_from_api",
    "pending_nodes",
    "static_pod_version",
    "upgrade_problems",
]
