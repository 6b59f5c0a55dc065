"""The Node object with its status heartbeat, its Lease in kube-node-lease and the mirror pods of the static pods."""

from __future__ import annotations

import datetime
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import RUNTIME, StandinError
from .api import ApiError, Client
from .pods import read_states, running

ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
STRATEGIC = "application/strategic-merge-patch+json"
CONDITIONS = (
    ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
    ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    ("Ready", "True", "KubeletReady", "kubelet-standin is posting ready status (static pods only)"),
)


def now(micro: bool = False, at: float | None = None) -> str:
    return datetime.datetime.fromtimestamp(time.time() if at is None else at, datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%S" + (".%fZ" if micro else "Z")
    )


def parse_labels(text: str) -> dict[str, str]:
    """--node-labels: key=value,key=value."""
    items = [item.partition("=") for item in filter(None, text.split(","))]
    if any(not key or not equals for key, equals, _value in items):
        raise StandinError(f"--node-labels {text!r}: not key=value[,key=value...]")
    return {key: value for key, _equals, value in items}


def parse_taints(text: str) -> list[dict]:
    """--register-with-taints: key=value:Effect or key:Effect, comma separated."""
    taints = []
    for item in filter(None, text.split(",")):
        key_value, _colon, effect = item.rpartition(":")
        key, _equals, value = key_value.partition("=")
        if not key or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise StandinError(f"--register-with-taints: {item!r} is not key[=value]:<effect>")
        taints.append({"key": key, "effect": effect, **({"value": value} if value else {})})
    return taints


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
    since: str = field(default_factory=now)
    mirrored: dict[str, str] = field(default_factory=dict)

    def status(self) -> dict:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 1024
        capacity = {"cpu": str(os.cpu_count()), "memory": f"{memory}Ki", "pods": str(self.max_pods)}
        machine_id = Path("/etc/machine-id").read_text().strip() if Path("/etc/machine-id").exists() else ""
        info = {
            "machineID": machine_id,
            "systemUUID": machine_id,
            "kernelVersion": platform.release(),
            "bootID": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
            "osImage": platform.freedesktop_os_release().get("PRETTY_NAME", ""),
            "containerRuntimeVersion": RUNTIME,
            "kubeletVersion": self.version,
            "kubeProxyVersion": self.version,
            "operatingSystem": "linux",
            "architecture": ARCH,
        }
        return {
            "capacity": capacity,
            "allocatable": capacity,
            "nodeInfo": info,
            "conditions": [
                {
                    "type": kind,
                    "status": status,
                    "reason": reason,
                    "message": message,
                    "lastHeartbeatTime": now(),
                    "lastTransitionTime": self.since,
                }
                for kind, status, reason, message in CONDITIONS
            ],
            "addresses": [
                {"type": "InternalIP", "address": self.address},
                {"type": "Hostname", "address": self.hostname},
            ],
        }

    def register(self) -> None:
        """Create the Node (an existing one is kept, as the kubelet does) and remember its uid for the Lease."""
        labels = {
            "kubernetes.io/hostname": self.hostname,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": ARCH,
            "beta.kubernetes.io/os": "linux",
            "beta.kubernetes.io/arch": ARCH,
            **self.labels,
        }
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "spec": {"taints": self.taints} if self.taints else {},
            "status": self.status(),
            "metadata": {
                "name": self.name,
                "labels": labels,
                "annotations": {"volumes.kubernetes.io/controller-managed-attach-detach": "true"},
            },
        }
        try:
            self.uid = self.client.request("POST", "/api/v1/nodes", node)["metadata"]["uid"]
        except ApiError as exc:
            if exc.status != 409:
                raise
            self.uid = self.client.request("GET", f"/api/v1/nodes/{self.name}")["metadata"]["uid"]

    def heartbeat(self) -> None:
        """Fresh Node conditions, the Lease renewed (created when missing), the mirror pods in line."""
        self.client.request("PATCH", f"/api/v1/nodes/{self.name}/status", {"status": self.status()}, STRATEGIC)
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.name}"
        spec = {"holderIdentity": self.name, "leaseDurationSeconds": 40, "renewTime": now(micro=True)}
        try:
            self.client.request("PATCH", path, {"spec": spec}, "application/merge-patch+json")
        except ApiError as exc:
            if exc.status != 404:
                raise
            self.client.request(
                "POST",
                path.rsplit("/", 1)[0],
                {
                    "kind": "Lease",
                    "spec": spec,
                    "metadata": {"name": self.name, "ownerReferences": [self.owner()]},
                    "apiVersion": "coordination.k8s.io/v1",
                },
            )
        # A pod bound here never ran (no containers do): its deletion is final at once, as the kubelet makes it.
        for pod in self.client.request("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{self.name}")["items"]:
            if (meta := pod["metadata"]).get(
                "deletionTimestamp"
            ) and f"{meta['namespace']}/{meta['name']}" not in self.mirrored:
                self._pod("DELETE", f"{meta['namespace']}/{meta['name']}", {"gracePeriodSeconds": 0}, missing_ok=True)
        for gone in set(self.mirrored) - {f"{s['namespace']}/{s['name']}" for s in read_states().values()}:
            self._pod("DELETE", gone, missing_ok=True)
            del self.mirrored[gone]
        for state in read_states().values():
            self.mirror(state)

    def owner(self) -> dict:
        return {"apiVersion": "v1", "kind": "Node", "name": self.name, "uid": self.uid}

    def _pod(self, method: str, path: str, *args, missing_ok: bool = False) -> dict:  # path: namespace/name
        namespace, _slash, name = path.partition("/")
        try:
            return self.client.request(method, f"/api/v1/namespaces/{namespace}/pods/{name}", *args)
        except ApiError as exc:
            if not (missing_ok and exc.status == 404):
                raise
            return {}

    def mirror(self, state: dict) -> None:
        """The static pod's mirror pod (kubeadm reads their annotations, e.g. etcd's client URL) and its status."""
        path, manifest, mirror_hash = f"{state['namespace']}/{state['name']}", state["manifest"], state["hash"][:32]
        if self.mirrored.get(path) != mirror_hash:
            meta = manifest["metadata"]
            annotations = {
                **meta.get("annotations", {}),
                "kubernetes.io/config.source": "file",
                "kubernetes.io/config.hash": mirror_hash,
                "kubernetes.io/config.mirror": mirror_hash,
            }
            pod = {
                **manifest,
                "spec": {**manifest["spec"], "nodeName": self.name},
                "metadata": {
                    **meta,
                    "name": state["name"],
                    "annotations": annotations,
                    "ownerReferences": [{**self.owner(), "controller": True}],
                },
            }
            try:
                self.client.request("POST", f"/api/v1/namespaces/{state['namespace']}/pods", pod)
            except ApiError as exc:
                # One left by an earlier stand-in is kept when it mirrors this manifest, else replaced.
                existing = self._pod("GET", path) if exc.status == 409 else {}
                if (
                    existing.get("metadata", {}).get("annotations", {}).get("kubernetes.io/config.mirror")
                    != mirror_hash
                ):
                    # At once, as the kubelet deletes a stale mirror pod: a graceful deletion would wait for a
                    # kubelet to confirm it, and this one keeps the path mirrored, so it never would (a changed
                    # manifest, e.g. after kubeadm upgrade, would never get its mirror pod).
                    self._pod("DELETE", path, {"gracePeriodSeconds": 0}, missing_ok=True)
                    raise
            self.mirrored[path] = mirror_hash
        statuses = [
            {
                "name": spec["name"],
                "image": spec["image"],
                "imageID": "",
                "ready": running(c),
                "started": running(c),
                "restartCount": c["restarts"],
                "containerID": f"{RUNTIME[:15]}://{c['pid']}",
                "state": {"running": {"startedAt": now(at=c["started_at"])}} if running(c) else {"waiting": {}},
            }
            for spec, c in zip(manifest["spec"]["containers"], state["containers"])
        ]
        ready = "True" if all(status["ready"] for status in statuses) else "False"
        status = {
            "phase": "Running",
            "hostIP": self.address,
            "podIP": self.address,
            "podIPs": [{"ip": self.address}],
            "startTime": now(at=state["created"]),
            "containerStatuses": statuses,
            "conditions": [
                {"type": kind, "status": ready if "Ready" in kind else "True"}
                for kind in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
        }
        try:
            self._pod("PATCH", path + "/status", {"status": status}, STRATEGIC)
        except ApiError:
            del self.mirrored[path]  # a mirror pod deleted by someone is made again next time
            raise
