# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Drill: Kubernetes upgraded in place, on the real control plane.

THE TARGET IS A RELABELLED 1.20.2: v1.20.3-lab.1 is the lab's second build of the same v1.20.2 source with another
version stamp (tests/lab/README.md), the only "newer" Kubernetes this machine can build. The drill proves the
orchestration (order, kubeadm upgrade apply/node, drain, the new stack, kubelet restarts, resumption, the API
answering throughout), not that anything of a newer Kubernetes works.

1. ConfigMaps are created; kubernetes_version is changed in the inventory, as an operator would; site.yml refuses and
   points at upgrade_kubernetes.yml.
2. upgrade_kubernetes.yml runs while a thread polls every control plane's /readyz twice a second (the longest time
   in which no control plane answered is reported, and cp-0's own).
3. Every node's kubelet (nodeInfo.kubeletVersion) and every control plane's kube-* static pod (its mirror pod's
   image tag) report the new version; the ConfigMaps are all there; the bootstrap tokens' certificate bindings that
   kubeadm upgrade apply re-creates are absent; verify.yml passes; a re-run changes nothing.

It runs before `ha`, which powers a control plane off for good (the upgrade's preflight wants every node Ready).
"""

from __future__ import annotations

import json
import ssl
import threading
import time
import urllib.request

import yaml

TARGET = "1.20.3-lab.1"
NAMESPACE = "upgrade-drill"
CONFIGMAPS = 20
# Lab-only: the target is a pre-release (kubeadm wants --allow-experimental-upgrades); kubeadm's image pre-pull cannot
# pull the images the kubelet stand-in has no binary for (pause, CoreDNS, kube-proxy), and its CreateJob health check
# waits for a Job's Pod, which the stand-in does not run. The lab's init skips the CoreDNS addon, and kubeadm 1.20's
# CoreDNS migration checks then fail on the missing ConfigMap's empty version ("start version '' not supported").
LAB_ARGS = (
    "-e",
    json.dumps(
        {
            "upgrade_kubernetes_allow_pre_release": True,
            "upgrade_kubernetes_ignore_preflight_errors": [
                "ImagePull",
                "CreateJob",
                "CoreDNSUnsupportedPlugins",
                "CoreDNSMigration",
            ],
        }
    ),
)
TOKEN_BINDINGS = ("kubeadm:node-autoapprove-bootstrap", "kubeadm:kubelet-bootstrap")
STATIC_PODS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")


class ApiPoller(threading.Thread):
    """Asks each control plane's /readyz (anonymous, as the API allows) every POLL seconds until stopped."""

    POLL = 0.5

    def __init__(self, addresses: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.addresses = addresses
        self.answers: dict[str, list[float]] = {name: [] for name in addresses}
        self.stopping = threading.Event()
        self.context = ssl.create_default_context()
        self.context.check_hostname = False
        self.context.verify_mode = ssl.CERT_NONE

    def _ready(self, address: str) -> bool:
        try:
            with urllib.request.urlopen(f"https://{address}:6443/readyz", timeout=2, context=self.context) as answer:
                return answer.status == 200
        except OSError:
            return False

    def run(self) -> None:
        self.started = time.monotonic()
        while not self.stopping.is_set():
            for name, address in self.addresses.items():
                if self._ready(address):
                    self.answers[name].append(time.monotonic())
            self.stopping.wait(self.POLL)
        self.stopped = time.monotonic()

    def longest_gap(self, times: list[float]) -> float:
        """The longest time without an answer, from the start to the end of the polling."""
        marks = [self.started, *sorted(times), self.stopped]
        return max(later - earlier for earlier, later in zip(marks, marks[1:]))

    def any_answer(self) -> list[float]:
        return sorted(t for times in self.answers.values() for t in times)


def _set_inventory_version(lab, version: str) -> None:
    inventory = yaml.safe_load(lab.inventory.read_text())
    inventory["all"]["vars"]["kubernetes_version"] = version
    lab.inventory.write_text(
        "# kubernetes_version changed by the upgrade drill.\n" + yaml.safe_dump(inventory, sort_keys=False)
    )


def _configmaps(lab) -> set[str]:
    listing = lab.kubectl("get", "configmaps", "-n", NAMESPACE, "-l", "drill=upgrade", "-o", "name")
    return set(listing.split())


def drill(lab) -> dict:
    planes = lab.control_planes()
    lab.kubectl("create", "namespace", NAMESPACE)
    for index in range(CONFIGMAPS):
        lab.kubectl("create", "configmap", f"before-upgrade-{index}", "-n", NAMESPACE, f"--from-literal=index={index}")
    # By name: the namespace has kube-root-ca.crt of its own.
    lab.kubectl(
        "label", "configmaps", "-n", NAMESPACE, *(f"before-upgrade-{i}" for i in range(CONFIGMAPS)), "drill=upgrade"
    )
    before = _configmaps(lab)
    assert len(before) == CONFIGMAPS, f"created {len(before)} ConfigMaps, not {CONFIGMAPS}"

    running = yaml.safe_load(lab.inventory.read_text())["all"]["vars"]["kubernetes_version"]
    _set_inventory_version(lab, TARGET)
    refused = lab.playbook("site", check=False)
    assert refused.rc != 0, "site.yml with a changed kubernetes_version on a running cluster did not refuse"
    assert "run playbooks/upgrade_kubernetes.yml" in " ".join(refused.output.split()), refused.last_failure()

    poller = ApiPoller({name: lab.hosts()[name] for name in planes})
    poller.start()
    try:
        upgrade = lab.playbook("upgrade_kubernetes", *LAB_ARGS, check=False)
    finally:
        poller.stopping.set()
        poller.join()
    assert upgrade.rc == 0, f"upgrade_kubernetes.yml failed on {upgrade.failed_hosts}:\n{upgrade.last_failure()}"
    silent = [name for name, times in poller.answers.items() if not times]
    assert not silent, f"/readyz of {', '.join(silent)} never answered during the upgrade: the poll saw nothing"
    api_gap = round(poller.longest_gap(poller.any_answer()), 1)
    first_gap = round(poller.longest_gap(poller.answers[planes[0]]), 1)
    lab.log(
        f"upgrade {running} -> {TARGET}: {upgrade.seconds:.1f} s; no control plane answered for at most {api_gap} s"
    )

    nodes = json.loads(lab.kubectl("get", "nodes", "-o", "json"))["items"]
    kubelets = {node["metadata"]["name"]: node["status"]["nodeInfo"]["kubeletVersion"] for node in nodes}
    assert set(kubelets) == set(lab.hosts()), f"nodes {sorted(kubelets)} are not the inventory's {sorted(lab.hosts())}"
    behind = {name: version for name, version in kubelets.items() if version != f"v{TARGET}"}
    assert not behind, f"kubelets not at v{TARGET}: {behind}"
    pods = json.loads(lab.kubectl("get", "pods", "-n", "kube-system", "-o", "json"))["items"]
    mirror = {
        (pod["spec"]["nodeName"], pod["metadata"]["labels"].get("component")): pod["spec"]["containers"][0]["image"]
        for pod in pods
        if "kubernetes.io/config.mirror" in pod["metadata"].get("annotations", {})
    }
    wanted = {(plane, component) for plane in planes for component in STATIC_PODS}
    assert wanted <= set(mirror), f"static pods without a mirror pod: {sorted(wanted - set(mirror))}"
    stale = {key: image for key, image in mirror.items() if key in wanted and not image.endswith(f":v{TARGET}")}
    assert not stale, f"static pods not at v{TARGET}: {stale}"
    assert _configmaps(lab) == before, f"ConfigMaps lost in the upgrade: {sorted(before - _configmaps(lab))}"
    for binding in TOKEN_BINDINGS:
        found = lab.kubectl("get", "clusterrolebinding", binding, "--ignore-not-found", "-o", "name")
        assert not found.strip(), f"{binding} (re-created by kubeadm upgrade apply) is still there"

    verify = lab.playbook("verify", check=False)
    assert verify.rc == 0, f"verify.yml failed after the upgrade on {verify.failed_hosts}:\n{verify.last_failure()}"
    again = lab.playbook("upgrade_kubernetes", *LAB_ARGS, check=False)
    assert again.rc == 0 and again.changed == 0, (
        f"the re-run after the upgrade: rc {again.rc}, changed={again.changed}:\n{again.output[-4000:]}"
    )
    lab.kubectl("delete", "namespace", NAMESPACE, "--wait=false")
    return {
        "from": running,
        "to": f"{TARGET} (a relabelled 1.20.2)",
        "nodes": len(kubelets),
        "upgrade_s": round(upgrade.seconds, 1),
        "longest_api_gap_s": api_gap,
        "longest_gap_of_first_control_plane_s": first_gap,
        "configmaps_kept": f"{len(before)}/{CONFIGMAPS}",
        "site_refusal_s": round(refused.seconds, 1),
        "verify_s": round(verify.seconds, 1),
        "rerun_s": round(again.seconds, 1),
    }
