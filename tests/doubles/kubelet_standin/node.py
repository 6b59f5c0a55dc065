"""The Node object, its status heartbeat and its Lease in kube-node-lease, as the kubelet keeps them."""
from __future__ import annotations

import datetime
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

from . import RUNTIME, RUNTIME_VERSION, StandinError
from .api import ApiError, Client

LEASE_SECONDS = 40
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_labels(text: str) -> dict[str, str]:
    """--node-labels: key=value,key=value."""
    labels = {}
    for item in filter(None, text.split(",")):
        key, equals, value = item.partition("=")
        if not equals or not key:
            raise StandinError(f"--node-labels: {item!r} is not key=value")
        labels[key] = value
    return labels


def parse_taints(text: str) -> list[dict]:
    """--register-with-taints: key=value:Effect or key:Effect, comma separated."""
    taints = []
    for item in filter(None, text.split(",")):
        key_value, colon, effect = item.rpartition(":")
        key, _, value = key_value.partition("=")
        if not colon or not key or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise StandinError(f"--register-with-taints: {item!r} is not key[=value]:NoSchedule|PreferNoSchedule|NoExecute")
        taints.append({"key": key, "effect": effect, **({"value": value} if value else {})})
    return taints


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


@dataclass
class NodeAgent:
    client: Client
    name: str
    hostname: str
    address: str
    version: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict] = field(default_factory=list)
    max_pods: int = 110
    uid: str = ""
    ready_since: str = field(default_factory=now)

    def status(self) -> dict:
        beat = now()
        memory_kib = next((line.split()[1] for line in _read("/proc/meminfo").splitlines()
                           if line.startswith("MemTotal:")), "0")
        capacity = {"cpu": str(os.cpu_count()), "memory": f"{memory_kib}Ki", "pods": str(self.max_pods)}

        def condition(kind: str, status: str, reason: str, message: str) -> dict:
            return {"type": kind, "status": status, "reason": reason, "message": message,
                    "lastHeartbeatTime": beat, "lastTransitionTime": self.ready_since}

        os_image = next((line.split("=", 1)[1].strip('"') for line in _read("/etc/os-release").splitlines()
                         if line.startswith("PRETTY_NAME=")), "")
        return {
            "capacity": capacity, "allocatable": capacity,
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                condition("Ready", "True", "KubeletReady", "kubelet-standin is posting ready status (runs static pods only)"),
            ],
            "addresses": [{"type": "InternalIP", "address": self.address}, {"type": "Hostname", "address": self.hostname}],
            "nodeInfo": {
                "machineID": _read("/etc/machine-id"), "systemUUID": _read("/etc/machine-id"),
                "bootID": _read("/proc/sys/kernel/random/boot_id"), "kernelVersion": platform.release(),
                "osImage": os_image, "containerRuntimeVersion": f"{RUNTIME}://{RUNTIME_VERSION}",
                "kubeletVersion": self.version, "kubeProxyVersion": self.version,
                "operatingSystem": "linux", "architecture": ARCH,
            },
        }

    def register(self) -> None:
        """Create the Node (an existing one is kept, as the kubelet does) and remember its uid for the Lease."""
        labels = {"kubernetes.io/hostname": self.hostname, "kubernetes.io/os": "linux", "kubernetes.io/arch": ARCH,
                  "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": ARCH, **self.labels}
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": self.name, "labels": labels,
                             "annotations": {"volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
                "spec": {"taints": self.taints} if self.taints else {}, "status": self.status()}
        try:
            self.uid = self.client.request("POST", "/api/v1/nodes", node)["metadata"]["uid"]
        except ApiError as exc:
            if exc.status != 409:
                raise
            self.uid = self.client.request("GET", f"/api/v1/nodes/{self.name}")["metadata"]["uid"]

    def heartbeat(self) -> None:
        """Fresh conditions on the Node status and a renewed Lease."""
        self.client.request("PATCH", f"/api/v1/nodes/{self.name}/status", {"status": self.status()},
                            "application/strategic-merge-patch+json")
        renew = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.name}"
        try:
            self.client.request("PATCH", path, {"spec": {"renewTime": renew, "holderIdentity": self.name}},
                                "application/merge-patch+json")
        except ApiError as exc:
            if exc.status != 404:
                raise
            self.client.request("POST", path.rsplit("/", 1)[0], {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": "kube-node-lease", "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": self.name, "uid": self.uid}]},
                "spec": {"holderIdentity": self.name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": renew}})
