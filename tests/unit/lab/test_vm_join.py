"""The VM node through the real flow (issue 28): cp-0 (nspawn) and vm-0 (QEMU: UEFI measured boot, /dev/tpmrm0, a
virtio state disk), brought up by site.yml and driven through a node's life.

Slow (minutes under TCG), so it runs only with CK_LAB_VM_TEST=1 (scripts/test.sh sets it in its VM stage):

    CK_LAB_VM_TEST=1 CK_LAB_INDEX=7 CK_LAB_DIR=/var/tmp/ckv7 python -m pytest -q tests/unit/lab/test_vm_join.py

In order, on one lab (the tests share it and depend on the order they are written in):
1. site.yml joins vm-0 as a worker: evidence from /dev/tpmrm0 (TCTI auto), the join ticket, the node lock, the
   state disk mapped with dm-crypt and holding /var/lib/kubelet and /var/lib/containerd, the real kubelet with the
   ticket's certificate: the node is Ready with containerd as its runtime.
2. Every pod scheduled on vm-0 runs (the CNI stand-in's agent, from the lab's tools image); a test pod's logs are read
   with `kubectl logs` and `kubectl exec` runs in it (the kubelet's serving TLS).
3. site.yml again changes nothing.
4. A real reboot (`systemctl reboot` in the guest: the TPM resets PCR 15): the boot agent rejoins and gets the state
   disk's key, the node is Ready again with its pods and its PCR 15 is the cluster's mark again; verify.yml passes.
5. vm-0 restarted with another kernel command line (`lab up --tamper vm-0`): the join service refuses the boot
   agent's rejoin (no key: the state disk stays locked, no kubelet) and verify.yml refuses the node, both naming
   PCR 9 and the EFI stub's LoadOptions event.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from cklab import lab as lab_commands, plan, vmruntime
from cklab.paths import LabPaths

REPO = Path(__file__).resolve().parents[3]
LAB = REPO / "tests" / "lab" / "lab"
CP = plan.plan_nodes(1, 0)[0]
VM = plan.plan_nodes(1, 0, vm_workers=1)[-1]
KUBECTL = "kubectl --kubeconfig=/etc/kubernetes/admin.conf"
TEST_POD = "vm-probe"
_RECAP = re.compile(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.MULTILINE)

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(os.environ.get("CK_LAB_VM_TEST") != "1", reason="slow (minutes under TCG): CK_LAB_VM_TEST=1"),
]


class VmLab:
    def __init__(self) -> None:
        self.paths = LabPaths.from_environment()
        self.env = dict(os.environ)
        self.runs = 0

    def lab(self, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(LAB), *args], env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def ssh(
        self, node: plan.NodeSpec, command: str, timeout: float = 300, connect_timeout: int = 60
    ) -> subprocess.CompletedProcess:
        # An emulated guest can take more than the lab's usual 5 s to send its SSH banner.
        return subprocess.run(
            lab_commands.ssh_command(self.paths, node.address, command, connect_timeout=connect_timeout),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def ok(self, node: plan.NodeSpec, command: str, timeout: float = 300) -> str:
        done = self.ssh(node, command, timeout)
        assert done.returncode == 0, f"{node.name}: {command}: {done.stdout}{done.stderr}"
        return done.stdout

    def kubectl(self, arguments: str) -> str:
        return self.ok(CP, f"{KUBECTL} {arguments}")

    def playbook(self, name: str) -> subprocess.CompletedProcess:
        # With bench/callback_plugins' play_times enabled, CK_VM_PLAY_TIMES=<prefix> keeps each run's task times.
        self.runs += 1
        prefix = self.env.get("CK_VM_PLAY_TIMES")
        extra = {"CK_BENCH_PLAY_TIMES": f"{prefix}-{self.runs}-{name}.json"} if prefix else {}
        return subprocess.run(
            ["ansible-playbook", "-i", str(self.paths.inventory), f"confidential.kubernetes.{name}"],
            env={**self.env, **extra},
            capture_output=True,
            text=True,
            timeout=2400,
            check=False,
        )

    def wait(self, what: str, condition, timeout: float = 900, every: float = 5):
        """Poll `condition` until it returns something true; fail naming `what` and the last value after `timeout`."""
        started = time.monotonic()
        deadline = started + timeout
        value = None
        while time.monotonic() < deadline:
            value = condition()
            if value:
                print(f"{what}: {time.monotonic() - started:.0f} s")
                return value
            time.sleep(every)
        pytest.fail(f"{what}: not within {timeout:.0f} s (last: {value!r})")

    def ready(self) -> bool:
        done = self.ssh(CP, f"{KUBECTL} get node {VM.name} -o json")
        if done.returncode != 0:
            return False
        conditions = json.loads(done.stdout)["status"].get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def kubelet_active(self) -> bool:
        done = self.ssh(VM, "systemctl is-active kubelet", timeout=120)
        return done.returncode == 0 and done.stdout.strip() == "active"

    def pods_on_vm(self) -> dict[str, str]:
        """Pod (namespace/name) -> phase, with a container not ready marked."""
        pods = json.loads(self.kubectl(f"get pods -A --field-selector spec.nodeName={VM.name} -o json"))["items"]
        found = {}
        for pod in pods:
            statuses = pod["status"].get("containerStatuses", [])
            ready = statuses and all(status["ready"] for status in statuses)
            phase = pod["status"].get("phase", "?")
            found[f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"] = (
                phase if ready else f"{phase}, not ready"
            )
        return found

    def all_pods_running(self):
        pods = self.pods_on_vm()
        return pods if pods and all(phase == "Running" for phase in pods.values()) else False

    def probe_started(self) -> str:
        """When the probe pod's container last started, as the API reports it (empty while it is not ready)."""
        pod = json.loads(self.kubectl(f"get pod {TEST_POD} -o json"))
        statuses = pod["status"].get("containerStatuses", [])
        if not statuses or not statuses[0]["ready"]:
            return ""
        return statuses[0]["state"].get("running", {}).get("startedAt", "")

    def pcr15(self) -> str:
        return self.ok(VM, "tpm2_pcrread sha256:15").split("15:")[1].split()[0].lower()

    def mount_source(self, path: str) -> str:
        return self.ok(VM, f"findmnt -n -o SOURCE {path}").strip()


def recap(run: subprocess.CompletedProcess) -> dict[str, tuple[int, int, int]]:
    """Host -> (changed, unreachable, failed) from a playbook's recap."""
    tail = run.stdout.rsplit("PLAY RECAP", 1)[-1]
    return {host: (int(c), int(u), int(f)) for host, c, u, f in _RECAP.findall(tail)}


def changed_tasks(run: subprocess.CompletedProcess) -> list[str]:
    """Each task that reported a change, with the hosts it changed: what a failed `changed=0` names."""
    changed = []
    for block in run.stdout.split("\nTASK [")[1:]:
        hosts = re.findall(r"^changed: \[([^\]]+)\]", block, re.MULTILINE)
        if hosts:
            changed.append(f"{block.split(']', 1)[0]}: {', '.join(sorted(set(hosts)))}")
    return changed


@pytest.fixture(scope="module")
def vmlab():
    paths = LabPaths.from_environment()
    reason = lab_commands.cannot_boot(paths)
    if reason:
        pytest.skip(reason)
    lab = VmLab()
    try:
        started = lab.lab("up", "--control-planes", "1", "--workers", "0", "--vm-workers", "1")
        assert started.returncode == 0, started.stderr[-3000:]
        yield lab
    finally:
        stopped = lab.lab("down", timeout=300)
        assert stopped.returncode == 0, stopped.stderr


def test_site_joins_the_vm_through_the_real_flow(vmlab):
    site = vmlab.playbook("site")
    assert site.returncode == 0, site.stdout[-5000:] + site.stderr[-2000:]
    assert vmlab.ready()
    node = json.loads(vmlab.kubectl(f"get node {VM.name} -o json"))
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://1.6.20")
    # The runtime is the one the node role installed from the lab's row (no containerd package in the image), with the
    # collection's configuration; the images its pods run were imported by the role, pinned by the lab's lock file.
    assert "/usr/local/bin/containerd" in vmlab.ok(VM, "systemctl show -p ExecStart containerd")
    assert vmlab.ssh(VM, "dpkg-query -W containerd").returncode != 0
    assert "BinaryName" not in vmlab.ok(VM, "cat /etc/containerd/config.toml")
    imported = vmlab.ok(VM, "ctr -n k8s.io images ls -q").split()
    assert "k8s.gcr.io/pause:3.2" in imported and vmruntime.TOOLS_IMAGE in imported, imported
    locked = vmlab.paths.lab_dir / "images.lock.yml"
    assert "k8s.gcr.io/pause:3.2" in locked.read_text() and vmruntime.TOOLS_IMAGE in locked.read_text()
    # The TPM the join used is the device (TCTI auto), and the node lock is on it.
    assert vmlab.ok(VM, "ls /dev/tpmrm0").strip() == "/dev/tpmrm0"
    assert vmlab.pcr15() != "0x" + "00" * 32
    # The kubelet's and containerd's state is on the dm-crypt mapping of the virtio state disk.
    assert "type:    LUKS2" in vmlab.ok(VM, "cryptsetup status state")
    backing = vmlab.ok(VM, "cryptsetup status state | sed -n 's/^ *device: *//p'").strip()
    assert backing == vmlab.ok(VM, "readlink -f /dev/disk/by-id/virtio-cklab-state").strip()
    for path in ("/var/lib/kubelet", "/var/lib/containerd", "/etc/kubernetes"):
        assert vmlab.mount_source(path) == f"/dev/mapper/state[{path}]"
    # The kubelet's client certificate is the one the join ticket brought (signed by the cluster CA, the node's name).
    subject = vmlab.ok(VM, "openssl x509 -noout -subject -in /var/lib/kubelet/pki/kubelet-client-current.pem")
    assert f"CN = system:node:{VM.name}" in subject or f"CN=system:node:{VM.name}" in subject


def test_pods_on_the_vm_run_and_answer_logs_and_exec(vmlab):
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": TEST_POD, "namespace": "default"},
        "spec": {
            "nodeName": VM.name,
            "containers": [
                {
                    "name": "probe",
                    "image": vmruntime.TOOLS_IMAGE,
                    "imagePullPolicy": "Never",
                    # PID 1 ends on TERM (a shell ignores it otherwise): the reboot does not wait for it.
                    "command": [
                        "sh",
                        "-c",
                        "trap 'exit 0' TERM; echo probe-started-on-$(hostname); sleep 2147483647 & wait",
                    ],
                }
            ],
        },
    }
    vmlab.ok(CP, f"{KUBECTL} apply -f - <<'EOF'\n{json.dumps(manifest)}\nEOF")
    pods = vmlab.wait("every pod on vm-0 Running", vmlab.all_pods_running, timeout=600)
    assert f"default/{TEST_POD}" in pods and any(name.startswith("kube-system/cilium-") for name in pods), pods
    # kube-proxy (kubeadm's DaemonSet, the lab's build in an image with Debian's iptables) runs on the VM and programs
    # its Service rules, which the guest's own iptables (nf_tables) reads.
    assert any(name.startswith("kube-system/kube-proxy-") for name in pods), pods
    rules = vmlab.ok(VM, "iptables -t nat -S KUBE-SERVICES")
    assert "default/kubernetes:https" in rules, rules
    # The CNI's agent runs the image the lab's row names for the chart, which the node role imported (the upgrade role
    # set the chart's image.override; the chart's own default cannot be pulled here).
    agent = vmlab.kubectl("-n kube-system get daemonset cilium -o 'jsonpath={.spec.template.spec.containers[0].image}'")
    assert agent.strip() == vmruntime.TOOLS_IMAGE, agent
    assert f"probe-started-on-{TEST_POD}" in vmlab.kubectl(f"logs {TEST_POD}")
    assert vmlab.kubectl(f"exec {TEST_POD} -- cat /proc/1/cmdline").startswith("sh\0-c\0trap")


def test_site_again_changes_nothing(vmlab):
    site = vmlab.playbook("site")
    assert site.returncode == 0, site.stdout[-5000:]
    assert recap(site) == {CP.name: (0, 0, 0), VM.name: (0, 0, 0)}, changed_tasks(site)


def test_a_real_reboot_rejoins_with_the_state_disk_and_its_pods(vmlab):
    mark = vmlab.pcr15()
    boot_id = vmlab.ok(VM, "cat /proc/sys/kernel/random/boot_id").strip()
    started = vmlab.probe_started()
    assert started
    vmlab.ssh(VM, "systemctl reboot", timeout=60)  # the connection may drop before an exit status
    # Short connection attempts, polled every 2 s, so that the guest's return is seen when it happens.
    vmlab.wait(
        "vm-0 back with a new boot id",
        lambda: (
            (done := vmlab.ssh(VM, "cat /proc/sys/kernel/random/boot_id", timeout=90, connect_timeout=15)).returncode
            == 0
            and done.stdout.strip() != boot_id
        ),
        every=2,
    )
    vmlab.wait("the kubelet running again", vmlab.kubelet_active)
    assert vmlab.pcr15() == mark
    rejoin = vmlab.ok(VM, "journalctl -b -u confidential-join -o cat")
    assert '"result": "rejoined"' in rejoin and '"keyed": true' in rejoin, rejoin
    assert vmlab.mount_source("/var/lib/kubelet") == "/dev/mapper/state[/var/lib/kubelet]"
    vmlab.wait("vm-0 Ready after the reboot", vmlab.ready)
    # The API keeps the pods' last statuses through the reboot: the probe's container must have started again.
    vmlab.wait("the probe pod's container started again", lambda: vmlab.probe_started() not in ("", started), 600)
    pods = vmlab.wait("its pods Running after the reboot", vmlab.all_pods_running, timeout=600)
    assert f"default/{TEST_POD}" in pods
    verify = vmlab.playbook("verify")
    assert verify.returncode == 0, verify.stdout[-5000:]


def test_another_kernel_command_line_is_refused_naming_the_event(vmlab):
    # `lab up --tamper` restarts the VM (QEMU and swtpm) on the enrolled disks with another kernel command line.
    tampered = vmlab.lab("up", "--control-planes", "1", "--workers", "0", "--vm-workers", "1", "--tamper", VM.name)
    assert tampered.returncode == 0, tampered.stderr[-3000:]
    assert "has joined a cluster" in tampered.stderr + tampered.stdout
    # The boot agent's rejoin is refused: no key, so the state disk is not mapped and the kubelet does not run.
    vmlab.wait(
        "the boot agent's refused rejoin on the tampered boot",
        lambda: vmlab.ssh(VM, "systemctl is-failed confidential-join", timeout=90).stdout.strip() == "failed",
    )
    refusal = vmlab.ok(VM, "journalctl -b -u confidential-join -o cat")
    assert "PERMISSION_DENIED" in refusal and "LOADED_IMAGE::LoadOptions" in refusal, refusal[-3000:]
    assert vmlab.ssh(VM, "test -e /dev/mapper/state").returncode != 0
    assert not vmlab.kubelet_active()
    # verify.yml replays the VM's real event log and names the changed event.
    verify = vmlab.playbook("verify")
    assert verify.returncode != 0
    assert "PCR 9" in verify.stdout and "LOADED_IMAGE::LoadOptions" in verify.stdout, verify.stdout[-5000:]
