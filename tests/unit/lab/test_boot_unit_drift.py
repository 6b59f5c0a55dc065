"""The boot-time join's re-run on real lab nodes: one stamp check decides it, and drift is still repaired.

Boots its own lab (1 control plane, 1 worker) under a temporary CK_LAB_DIR with the current CK_LAB_INDEX and runs
`site.yml`, then the join playbook again: on converged nodes it changes nothing and runs none of the install's tasks.
A unit edited on the node, a drop-in removed, a file's or a directory's mode changed, a code file edited, the CA copy
edited, or a changed template input are each found and repaired (changed > 0, systemd reloaded), and the run after
the repair changes nothing again. Marked `lab`.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path

import pytest

from cklab import lab as lab_commands, plan
from cklab.paths import LabPaths

ROOT = Path(__file__).resolve().parents[3]
LAB = ROOT / "tests" / "lab" / "lab"
CP, WORKER = plan.plan_nodes(1, 1)
UNIT = "/etc/systemd/system/confidential-join.service"
GATE = "/etc/systemd/system/kubelet.service.d/10-confidential-join.conf"
CONFIG = "/etc/confidential-kubernetes/join.yml"
CA_COPY = "/etc/confidential-kubernetes/cluster-ca.crt"
CODE = (
    "/opt/confidential-kubernetes/lib/ansible_collections/confidential/kubernetes/plugins/module_utils/_ticket/boot.py"
)
# The install's first task: it runs only when the stamp check finds something to do.
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

    def run(self, playbook: str, *extra: str) -> str:
        done = subprocess.run(
            ["ansible-playbook", "-i", str(self.dir / "inventory.yml"), playbook, *extra],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        return done.stdout

    def join(self, *extra: str) -> dict[str, int]:
        """The join playbook's changes per host; the output is kept for the assertions that follow."""
        self.output = self.run("confidential.kubernetes.join", *extra)
        return {host: int(changed) for host, changed in _RECAP.findall(self.output.split("PLAY RECAP", 1)[1])}

    def digest(self, node: plan.NodeSpec, path: str) -> list[str]:
        return self.ok(node, f"stat -c %a {path}; sha256sum {path}").split()[0:2]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    reason = lab_commands.cannot_boot(LabPaths.from_environment())
    if reason:
        pytest.skip(reason)
    created = Lab(tmp_path_factory.mktemp("bootunit") / "lab")
    try:
        started = created.lab("up", "--control-planes", "1", "--workers", "1")
        assert started.returncode == 0, started.stderr
        created.run("confidential.kubernetes.site")
        yield created
    finally:
        stopped = created.lab("down", timeout=180)
        assert stopped.returncode == 0, stopped.stderr


def test_a_converged_node_runs_no_install_task(lab):
    assert lab.join() == {CP.name: 0, WORKER.name: 0}
    assert INSTALL_TASK not in lab.output
    stamps = lab.ok(WORKER, "ls /var/lib/confidential-kubernetes/").split()
    assert len([name for name in stamps if name.startswith("boot-unit-") and name.endswith(".sha256")]) == 1


def test_drift_on_the_node_is_repaired_and_systemd_reloaded(lab):
    before = {path: lab.digest(WORKER, path) for path in (UNIT, GATE, CONFIG, CA_COPY, CODE)}
    lab.ok(
        WORKER,
        f"echo '# edited' >> {UNIT} && rm {GATE} && chmod 0644 {CONFIG} && chmod 0755 /etc/confidential-kubernetes"
        f" && echo '# edited' >> {CODE} && echo edited > {CA_COPY}",
    )
    changes = lab.join()
    assert changes[WORKER.name] > 0 and changes[CP.name] == 0, lab.output
    assert {path: lab.digest(WORKER, path) for path in before} == before
    assert lab.ok(WORKER, "stat -c %a /etc/confidential-kubernetes").strip() == "700"
    for unit in ("confidential-join.service", "kubelet.service"):
        assert lab.ok(WORKER, f"systemctl show -p NeedDaemonReload --value {unit}").strip() == "no", unit
    assert lab.join() == {CP.name: 0, WORKER.name: 0}


def test_a_changed_template_input_is_installed_and_the_default_again(lab):
    # The join playbook installs the boot-time join on the nodes that join (the first control plane's is init.yml's).
    assert lab.join("-e", "join_boot_total_timeout=301")[WORKER.name] > 0
    assert "total_timeout: 301" in lab.ok(WORKER, f"cat {CONFIG}")
    assert lab.join()[WORKER.name] > 0
    assert "total_timeout: 300" in lab.ok(WORKER, f"cat {CONFIG}")
    assert lab.join() == {CP.name: 0, WORKER.name: 0}


def test_a_changed_cluster_ca_reaches_the_copy(lab):
    # The CA the node's join pinned changes (a CA rotation): the stamp lists it, so its copy follows.
    original = lab.ok(WORKER, "cat /etc/kubernetes/pki/ca.crt")
    lab.ok(WORKER, "cp /etc/kubernetes/pki/ca.crt /root/ca.crt.orig && echo '# rotated' >> /etc/kubernetes/pki/ca.crt")
    try:
        assert lab.join()[WORKER.name] > 0
        copied = lab.ok(WORKER, f"cat {CA_COPY}")
        assert copied == original + "# rotated\n"
        assert hashlib.sha256(copied.encode()).hexdigest() in lab.ok(
            WORKER, "cat /var/lib/confidential-kubernetes/boot-unit-*.sha256"
        )
    finally:
        lab.ok(WORKER, "cp /root/ca.crt.orig /etc/kubernetes/pki/ca.crt")
    assert lab.join()[WORKER.name] > 0
    assert lab.join() == {CP.name: 0, WORKER.name: 0}
