# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Outage drill: every node loses power, every swtpm restarts (PCRs reset), the nodes boot, and recover.yml brings the
cluster back with what it held. Then (unless CK_DRILL_OUTAGE_TAMPER=0) a control plane boots tampered after another
outage and gets nothing, its PCR named, while the others recover; booted untampered, it rejoins by itself.

Figures: objects before and after, seconds from recover.yml's start to the API's /readyz, to every node Ready, and the
re-run's changed count."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time

NAMESPACE = "drill-outage"
CONFIGMAPS = 200
NODE_PYTHON = "PYTHONPATH=/opt/confidential-kubernetes/lib /opt/confidential-kubernetes/venv/bin/python"
STATUS_FILE = "/run/confidential-kubernetes/boot-status.json"
WAIT_SECONDS = 180.0
READYZ = "kubectl --kubeconfig=/etc/kubernetes/admin.conf --request-timeout=2s get --raw=/readyz"
READ_PCR15 = (
    f"{NODE_PYTHON} -c 'from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.issuer "
    'import Tpm\nwith Tpm("auto") as tpm: print(tpm.read_pcrs("sha256", (15,))[15].hex())\''
)


def _objects() -> bytes:
    documents = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}]
    documents += [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"cm-{i:03d}", "namespace": NAMESPACE},
            "data": {"index": str(i)},
        }
        for i in range(CONFIGMAPS)
    ]
    documents.append(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "stringData": {"token": "outage-drill"},
            "metadata": {"name": "drill-secret", "namespace": NAMESPACE},
        }
    )
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": documents}).encode()


def _count(lab) -> tuple[int, bool]:
    names = lab.kubectl("-n", NAMESPACE, "get", "configmaps", "-o", "name").split()
    secret = lab.kubectl("-n", NAMESPACE, "get", "secret", "drill-secret", "-o", "jsonpath={.data.token}", check=False)
    return sum(1 for name in names if name.startswith("configmap/cm-")), secret.strip() != ""


def _pcr15(lab, node: str) -> str:
    return lab.ssh(node, READ_PCR15).stdout.decode().strip()


def _boot_state(lab, node: str) -> str:
    done = lab.ssh(node, f"cat {STATUS_FILE} 2>/dev/null || echo '{{}}'", check=False)
    try:
        return json.loads(done.stdout.decode() or "{}").get("state", "none")
    except ValueError:
        return "unreadable"


def _wait_for(what: str, predicate, timeout: float = WAIT_SECONDS) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():
            return time.monotonic() - started
        time.sleep(2)
    raise AssertionError(f"{what} not within {timeout:.0f} s")


def _readyz_watch(lab, started: float, result: dict, stop: threading.Event) -> None:
    """Seconds from recover.yml's start until the API server of any control plane answers /readyz."""
    nodes = lab.control_planes()
    while not stop.is_set():
        for node in nodes:
            done = lab.ssh(node, READYZ, check=False)
            if done.returncode == 0:
                result["api_ready_seconds"] = round(time.monotonic() - started, 1)
                return
        time.sleep(1)


def _power_cycle(lab) -> None:
    lab.log("outage: every node loses power")
    lab.lab("stop")
    lab.lab("start")


def _lock_marks(lab) -> dict[str, str]:
    """Each node's expected PCR 15: the mark of the cluster ID in its lock record (DESIGN section 5)."""
    marks = {}
    for node in lab.hosts():
        record = json.loads(lab.ssh(node, "cat /var/lib/confidential-kubernetes/nodelock.json").stdout)
        cluster_id = bytes.fromhex(record["cluster_id"])
        marks[node] = hashlib.sha256(bytes(32) + hashlib.sha256(cluster_id).digest()).hexdigest()
    return marks


def drill(lab) -> dict:
    figures: dict = {}
    lab.ssh(
        lab.control_planes()[0],
        "kubectl --kubeconfig=/etc/kubernetes/admin.conf apply -f - >/dev/null",
        stdin=_objects(),
    )
    before = _count(lab)
    assert before == (CONFIGMAPS, True), f"before the outage: {before[0]}/{CONFIGMAPS} ConfigMaps, secret {before[1]}"
    marks = _lock_marks(lab)

    _power_cycle(lab)
    zero = "00" * 32
    reset = {node: _pcr15(lab, node) for node in lab.hosts()}
    assert all(value == zero for value in reset.values()), f"PCR 15 not reset by the power cycle: {reset}"
    # The circle: every control plane's boot-time join reaches no join service and waits for keys.
    _wait_for(
        "every control plane waiting for keys",
        lambda: all(_boot_state(lab, node) == "waiting-for-keys" for node in lab.control_planes()),
    )
    figures["waiting_control_planes"] = len(lab.control_planes())

    started = time.monotonic()
    stop = threading.Event()
    watch = threading.Thread(target=_readyz_watch, args=(lab, started, figures, stop), daemon=True)
    watch.start()
    try:
        recovered = lab.playbook("recover")
    finally:
        stop.set()
        watch.join(timeout=30)
    figures["recover_seconds"] = round(recovered.seconds, 1)
    figures["recover_changed"] = recovered.changed
    assert "api_ready_seconds" in figures, "no API server answered /readyz while recover.yml ran"
    figures["all_ready_seconds"] = round(time.monotonic() - started + lab.wait_ready(WAIT_SECONDS), 1)

    marked = {node: _pcr15(lab, node) for node in lab.hosts()}
    wrong = {node: value for node, value in marked.items() if value != marks[node]}
    assert not wrong, f"PCR 15 does not carry the cluster's mark after recover: {wrong}"
    lab.playbook("verify")
    after = _count(lab)
    figures["configmaps"] = f"{after[0]}/{CONFIGMAPS}"
    figures["secret"] = after[1]
    assert after == (CONFIGMAPS, True), f"after recover: {after[0]}/{CONFIGMAPS} ConfigMaps, secret present: {after[1]}"

    again = lab.playbook("recover")
    figures["rerun_changed"] = again.changed
    assert again.changed == 0, f"a second recover.yml reported changed={again.changed}"
    if os.environ.get("CK_DRILL_OUTAGE_TAMPER", "1") != "0":
        figures.update(_tampered_control_plane(lab))
    lab.kubectl("delete", "namespace", NAMESPACE, "--wait=false")
    return figures


def _tampered_control_plane(lab) -> dict:
    """The last control plane boots with another kernel command line (PCR 8): recover names it and its PCR, and gives it
    nothing; the others serve. Then it boots untampered and rejoins by itself."""
    victim = lab.control_planes()[-1]
    inventory = lab.inventory.read_text()
    workers = len(lab.workers())
    planes = len(lab.control_planes())
    lab.lab("stop")
    lab.lab("up", "--control-planes", str(planes), "--workers", str(workers), "--tamper", victim)
    lab.inventory.write_text(inventory)
    refused = lab.playbook("recover", check=False)
    assert victim in refused.failed_hosts, f"recover.yml did not refuse the tampered {victim}: {refused.failed_hosts}"
    assert "PCR 8" in refused.output and "gets nothing" in refused.output, refused.last_failure()
    assert _pcr15(lab, victim) == "00" * 32, f"the tampered {victim} was marked"
    lab.lab("up", "--control-planes", str(planes), "--workers", str(workers))
    lab.inventory.write_text(inventory)
    _wait_for(f"{victim} rejoining by itself", lambda: _boot_state(lab, victim) == "member")
    lab.wait_ready(WAIT_SECONDS)
    lab.playbook("verify")
    return {"tampered_refused": victim}
