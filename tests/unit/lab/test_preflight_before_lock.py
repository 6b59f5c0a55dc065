"""Preflight before the point of no return, and the boot-time join's re-run, on real lab nodes (real kubeadm 1.20.2,
kubelet stand-in).

Boots one lab (1 control plane, 1 worker) under a temporary CK_LAB_DIR with the current CK_LAB_INDEX and runs
`site.yml`: a preflight failure (an occupied port 6443, a wrong Kubernetes version, a leftover static pod manifest)
fails the play before the node lock, so PCR 15 stays 32 zero bytes and there is no lock record; once the cause is
gone the same nodes come up without a reset or a reboot.

The cluster they leave (site.yml run once more, so that the tests after them start from a converged cluster whatever
the preflight tests did) then shows the boot-time join's re-run: one stamp check decides it, so on converged nodes the
join playbook changes nothing and runs none of the install's tasks. A unit edited on the node, a drop-in removed, a
file's or a directory's mode changed, a code file edited, the CA copy edited, or a changed template input are each
found and repaired (changed > 0, systemd reloaded), and the run after the repair changes nothing again. Both halves
share the one lab (a second 1 + 1 bring-up cost about 900 s of CI's pytest stage). Marked `lab`.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils import _versions
from cklab import kubernetes, lab as lab_commands, plan, tpm
from cklab.paths import LabPaths

ROOT = Path(__file__).resolve().parents[3]
LAB = ROOT / "tests" / "lab" / "lab"
LOCK_RECORD = "/var/lib/confidential-kubernetes/nodelock.json"
CP, WORKER = plan.plan_nodes(1, 1)
# Holds port 6443 the way a stray API server would.
PORT_HOLDER = (
    'nohup python3 -c \'import socket, time; s = socket.socket(); s.bind(("0.0.0.0", 6443)); s.listen(); '
    "time.sleep(3600)' >/dev/null 2>&1 & echo $! > /run/port-holder.pid"
)
UNIT = "/etc/systemd/system/confidential-join.service"
GATE = "/etc/systemd/system/kubelet.service.d/10-confidential-join.conf"
CONFIG = "/etc/confidential-kubernetes/join.yml"
CA_COPY = "/etc/confidential-kubernetes/cluster-ca.crt"
CODE = (
    "/opt/confidential-kubernetes/lib/ansible_collections/confidential/kubernetes/plugins/module_utils/_ticket/boot.py"
)
# The boot-time join's install's first task: it runs only when the stamp check finds something to do.
INSTALL_TASK = "Read the node's own cluster CA"
_RECAP = re.compile(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)", re.MULTILINE)

pytestmark = pytest.mark.lab


class Lab:
    def __init__(self, lab_dir: Path) -> None:
        self.dir = lab_dir
        self.env = {**os.environ, "CK_LAB_DIR": str(lab_dir)}

    def lab(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(LAB), *args], env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def ok(self, node: plan.NodeSpec, command: str) -> str:
        done = self.lab("ssh", node.name, command, timeout=300)
        assert done.returncode == 0, f"{node.name}: {command}: {done.stdout}{done.stderr}"
        return done.stdout

    def site(self, *extra: str, playbook: str = "confidential.kubernetes.site") -> subprocess.CompletedProcess:
        return subprocess.run(
            ["ansible-playbook", "-i", str(self.dir / "inventory.yml"), playbook, *extra],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=1200,
            check=False,
        )

    def pcr15(self, node: plan.NodeSpec) -> str:
        out = self.ok(node, "TPM2TOOLS_TCTI=swtpm:path=/run/tpm/swtpm.sock tpm2_pcrread sha256:15")
        return tpm.parse_pcrread(out)[15]

    def join(self, *extra: str) -> dict[str, int]:
        """The join playbook's changes per host; the output is kept for the assertions that follow."""
        run = self.site(*extra, playbook="confidential.kubernetes.join")
        assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
        self.output = run.stdout
        return {host: int(changed) for host, changed in _RECAP.findall(self.output.split("PLAY RECAP", 1)[1])}

    def digest(self, node: plan.NodeSpec, path: str) -> list[str]:
        return self.ok(node, f"stat -c %a {path}; sha256sum {path}").split()[0:2]

    def unlocked(self, node: plan.NodeSpec) -> bool:
        return (
            self.pcr15(node) == "00" * 32
            and self.ok(node, f"test -e {LOCK_RECORD} && echo locked || echo none").strip() == "none"
        )


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    reason = lab_commands.cannot_boot(LabPaths.from_environment())
    if reason:
        pytest.skip(reason)
    created = Lab(tmp_path_factory.mktemp("preflight") / "lab")
    try:
        started = created.lab("up", "--control-planes", "1", "--workers", "1")
        assert started.returncode == 0, started.stderr
        # The node stack (site.yml's node play) up front, so that init.yml can run alone.
        stack = created.site(playbook=str(LAB.with_name("node-stack.yml")))
        assert stack.returncode == 0, stack.stdout[-3000:] + stack.stderr
        yield created
    finally:
        stopped = created.lab("down", timeout=180)
        assert stopped.returncode == 0, stopped.stderr


def _failure(run: subprocess.CompletedProcess) -> str:
    assert run.returncode != 0, "site.yml passed although a preflight check must fail"
    return run.stdout + run.stderr


def test_occupied_api_server_port_fails_init_before_the_lock(lab):
    lab.ok(CP, PORT_HOLDER)
    try:
        output = _failure(lab.site())
    finally:
        lab.ok(CP, "kill $(cat /run/port-holder.pid)")
    assert "kubeadm's init preflight failed" in output and "Port-6443" in output and "the node was not locked" in output
    assert lab.unlocked(CP)
    assert not (lab.dir / "secrets" / "cluster-secrets.json").exists(), (
        "no root secrets before the first node passed preflight"
    )


def test_wrong_kubernetes_version_fails_init_before_the_lock(lab):
    # site.yml: the node role finds no such row, before anything is installed.
    output = _failure(lab.site("-e", "kubernetes_version=v1.20.3"))
    # The lab's rows: its 1.20.2 build and the relabelled one the upgrade drill targets.
    lab_rows = {release.version.lstrip("v"): {} for release in kubernetes.RELEASES}
    supported = ", ".join(_versions.supported(_versions.merged_table(_versions.load_table(), lab_rows)))
    assert f"Kubernetes 1.20.3 is not in the versions table; supported: {supported}" in output
    assert lab.unlocked(CP)
    # init.yml alone over the installed 1.20.2 stack: init's preflight compares the installed binaries.
    output = _failure(lab.site("-e", "kubernetes_version=v1.20.3", playbook="confidential.kubernetes.init"))
    assert "kubeadm is v1.20.2, kubelet is v1.20.2 but kubernetes_version is v1.20.3" in output
    assert lab.unlocked(CP)


def test_join_preflight_failure_leaves_the_worker_unlocked_and_the_next_run_joins_it(lab):
    lab.ok(WORKER, "mkdir -p /etc/kubernetes/manifests && echo '{}' > /etc/kubernetes/manifests/stray.yaml")
    output = _failure(lab.site())
    assert "kubeadm's join preflight failed" in output and "DirAvailable--etc-kubernetes-manifests" in output
    assert lab.unlocked(WORKER)
    assert not lab.unlocked(CP), "the control plane passed its preflight and initialised"
    lab.ok(WORKER, "rm /etc/kubernetes/manifests/stray.yaml")
    run = lab.site()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr
    assert not lab.unlocked(WORKER)
    assert "worker-0" in lab.ok(CP, "KUBECONFIG=/etc/kubernetes/admin.conf kubectl get nodes -o name")


@pytest.fixture(scope="module")
def converged(lab):
    """The preflight tests' cluster, converged by one more site.yml run."""
    run = lab.site()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr
    return lab


def test_a_converged_node_runs_no_install_task(converged):
    assert converged.join() == {CP.name: 0, WORKER.name: 0}
    assert INSTALL_TASK not in converged.output
    stamps = converged.ok(WORKER, "ls /var/lib/confidential-kubernetes/").split()
    assert len([name for name in stamps if name.startswith("boot-unit-") and name.endswith(".sha256")]) == 1


def test_drift_on_the_node_is_repaired_and_systemd_reloaded(converged):
    before = {path: converged.digest(WORKER, path) for path in (UNIT, GATE, CONFIG, CA_COPY, CODE)}
    converged.ok(
        WORKER,
        f"echo '# edited' >> {UNIT} && rm {GATE} && chmod 0644 {CONFIG} && chmod 0755 /etc/confidential-kubernetes"
        f" && echo '# edited' >> {CODE} && echo edited > {CA_COPY}",
    )
    changes = converged.join()
    assert changes[WORKER.name] > 0 and changes[CP.name] == 0, converged.output
    assert {path: converged.digest(WORKER, path) for path in before} == before
    assert converged.ok(WORKER, "stat -c %a /etc/confidential-kubernetes").strip() == "700"
    for unit in ("confidential-join.service", "kubelet.service"):
        assert converged.ok(WORKER, f"systemctl show -p NeedDaemonReload --value {unit}").strip() == "no", unit
    assert converged.join() == {CP.name: 0, WORKER.name: 0}


def test_a_changed_template_input_is_installed_and_the_default_again(converged):
    # The join playbook installs the boot-time join on the nodes that join (the first control plane's is init.yml's).
    assert converged.join("-e", "join_boot_total_timeout=301")[WORKER.name] > 0
    assert "total_timeout: 301" in converged.ok(WORKER, f"cat {CONFIG}")
    assert converged.join()[WORKER.name] > 0
    assert "total_timeout: 300" in converged.ok(WORKER, f"cat {CONFIG}")
    assert converged.join() == {CP.name: 0, WORKER.name: 0}


def test_a_changed_cluster_ca_reaches_the_copy(converged):
    # The CA the node's join pinned changes (a CA rotation): the stamp lists it, so its copy follows.
    original = converged.ok(WORKER, "cat /etc/kubernetes/pki/ca.crt")
    converged.ok(
        WORKER, "cp /etc/kubernetes/pki/ca.crt /root/ca.crt.orig && echo '# rotated' >> /etc/kubernetes/pki/ca.crt"
    )
    try:
        assert converged.join()[WORKER.name] > 0
        copied = converged.ok(WORKER, f"cat {CA_COPY}")
        assert copied == original + "# rotated\n"
        assert hashlib.sha256(copied.encode()).hexdigest() in converged.ok(
            WORKER, "cat /var/lib/confidential-kubernetes/boot-unit-*.sha256"
        )
    finally:
        converged.ok(WORKER, "cp /root/ca.crt.orig /etc/kubernetes/pki/ca.crt")
    assert converged.join()[WORKER.name] > 0
    assert converged.join() == {CP.name: 0, WORKER.name: 0}
