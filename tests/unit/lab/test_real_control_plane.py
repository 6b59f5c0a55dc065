"""Real `kubeadm init` and `kubeadm join` (Kubernetes 1.20.2) on two lab nodes, the kubelet being the stand-in.

Boots its own lab (1 control plane, 1 worker) under a temporary CK_LAB_DIR with the current
CK_LAB_INDEX, drives kubeadm over the lab's SSH, checks with the real kubectl, prints the
figures (run with -s to see them) and tears the lab down. Marked `lab`.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from cklab import lab as lab_commands, plan
from cklab.paths import LabPaths

LAB = Path(__file__).resolve().parents[2] / "lab" / "lab"
# kubeadm, kubelet and kubectl come through the node role from the lab's mirror.
NODE_STACK = LAB.with_name("node-stack.yml")
ENDPOINT = "unix:///run/kubelet-standin/runtime.sock"
# kube-proxy, pause and coredns have no local binary, so the stand-in's crictl cannot pull them.
IGNORED_PREFLIGHT_ERRORS = ["ImagePull"]
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
ADMIN = "KUBECONFIG=/etc/kubernetes/admin.conf"
CP, WORKER = plan.plan_nodes(1, 1)

# kubeadm 1.20 gives its CA serial number 0, which cryptography warns about.
pytestmark = [pytest.mark.lab, pytest.mark.filterwarnings("ignore:Parsed a serial number which wasn't positive")]


class Lab:
    def __init__(self, lab_dir: Path) -> None:
        self.env = {**os.environ, "CK_LAB_DIR": str(lab_dir)}
        self.figures: dict[str, str] = {}
        self.results: dict[str, subprocess.CompletedProcess | str] = {}
        self.token_id = ""

    def lab(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(LAB), *args], env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def ssh(
        self, node: plan.NodeSpec, command: str, stdin: str | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(LAB), "ssh", node.name, command],
            env=self.env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def ok(self, node: plan.NodeSpec, command: str, stdin: str | None = None) -> str:
        done = self.ssh(node, command, stdin)
        assert done.returncode == 0, f"{node.name}: {command}: {done.stdout}{done.stderr}"
        return done.stdout

    def kubectl_json(self, *args: str) -> dict:
        return json.loads(self.ok(CP, f"{ADMIN} kubectl {' '.join(args)} -o json"))

    def timed(self, name: str, node: plan.NodeSpec, command: str, stdin: str | None = None):
        started = time.monotonic()
        done = self.ssh(node, command, stdin)
        self.figures[name] = f"{time.monotonic() - started:.1f} s"
        return done

    def join_config(self, pin: str) -> str:
        token = self.ok(CP, "kubeadm token create").strip()
        self.token_id = token.split(".")[0]
        return yaml.safe_dump(
            {
                "apiVersion": "kubeadm.k8s.io/v1beta2",
                "kind": "JoinConfiguration",
                "discovery": {
                    "bootstrapToken": {"apiServerEndpoint": f"{CP.address}:6443", "token": token, "caCertHashes": [pin]}
                },
                "nodeRegistration": {"name": WORKER.name, "criSocket": ENDPOINT},
            }
        )

    def join(self, pin: str, figure: str | None = None) -> subprocess.CompletedProcess:
        self.ok(WORKER, "umask 077 && cat > /root/join.yaml", self.join_config(pin))
        command = "kubeadm join --config /root/join.yaml; status=$?; rm -f /root/join.yaml; exit $status"
        return self.timed(figure, WORKER, command) if figure else self.ssh(WORKER, command)

    def ready(self, names: set[str], seconds: float = 90) -> dict[str, dict]:
        deadline = time.monotonic() + seconds
        while True:
            nodes = {n["metadata"]["name"]: n for n in self.kubectl_json("get", "nodes")["items"]}
            ready = {
                name
                for name, node in nodes.items()
                if any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
            }
            if names <= ready or time.monotonic() > deadline:
                assert names <= ready, f"not Ready after {seconds:g} s: {sorted(names - ready)}"
                return nodes
            time.sleep(2)

    def pids(self, node: plan.NodeSpec) -> dict[str, int]:
        # /proc/PID/comm holds 15 characters: kube-controller-manager is "kube-controller".
        return {name: int(self.ok(node, f"pgrep -x {name[:15]}").split()[0]) for name in CONTROL_PLANE}

    def csrs(self) -> dict[str, dict]:
        return {c["metadata"]["name"]: c for c in self.kubectl_json("get", "csr")["items"]}


def ca_pin(ca_pem: str) -> str:
    public = x509.load_pem_x509_certificate(ca_pem.encode()).public_key()
    return (
        "sha256:"
        + hashlib.sha256(
            public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        ).hexdigest()
    )


def node_certificate(ca_pem: str, ca_key_pem: str, node_name: str) -> tuple[str, int]:
    """A kubelet client certificate signed by the cluster CA, as the join service issues it: (cert + key PEM, serial)."""
    ca = x509.load_pem_x509_certificate(ca_pem.encode())
    ca_key = serialization.load_pem_private_key(ca_key_pem.encode(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
                    x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node_name}"),
                ]
            )
        )
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = certificate.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return pem.decode(), certificate.serial_number


def rss_kib(lab: Lab, node: plan.NodeSpec, pids: list[int]) -> int:
    text = lab.ok(node, "grep -h VmRSS " + " ".join(f"/proc/{pid}/status" for pid in pids))
    return sum(int(line.split()[1]) for line in text.splitlines())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A lab whose cp-0 ran kubeadm init; worker-0 tried a wrongly pinned join, then joined."""
    reason = lab_commands.cannot_boot(LabPaths.from_environment())
    if reason:
        pytest.skip(reason)
    lab = Lab(tmp_path_factory.mktemp("real-control-plane") / "lab")
    results = lab.results
    try:
        started = lab.lab("up", "--control-planes", "1", "--workers", "1")
        assert started.returncode == 0, started.stderr
        stack = subprocess.run(
            ["ansible-playbook", "-i", started.stdout.strip(), str(NODE_STACK)],
            env=lab.env,
            capture_output=True,
            text=True,
            timeout=1200,
            check=False,
        )
        assert stack.returncode == 0, stack.stdout[-3000:] + stack.stderr
        init = yaml.safe_dump_all(
            [
                {
                    "apiVersion": "kubeadm.k8s.io/v1beta2",
                    "kind": "InitConfiguration",
                    "localAPIEndpoint": {"advertiseAddress": CP.address, "bindPort": 6443},
                    "nodeRegistration": {"name": CP.name, "criSocket": ENDPOINT},
                },
                {
                    "apiVersion": "kubeadm.k8s.io/v1beta2",
                    "kind": "ClusterConfiguration",
                    "kubernetesVersion": "v1.20.2",
                },
                {
                    "apiVersion": "kubelet.config.k8s.io/v1beta1",
                    "kind": "KubeletConfiguration",
                    "cgroupDriver": "systemd",
                },
            ]
        )
        lab.ok(CP, "cat > /root/init.yaml", init)
        results["preflight"] = lab.ssh(CP, "kubeadm init phase preflight --config /root/init.yaml")
        ignored = ",".join(IGNORED_PREFLIGHT_ERRORS)
        results["init"] = lab.timed(
            "kubeadm init", CP, f"kubeadm init --config /root/init.yaml --ignore-preflight-errors={ignored}"
        )
        assert results["init"].returncode == 0, results["init"].stdout + results["init"].stderr
        results["ca"] = lab.ok(CP, "cat /etc/kubernetes/pki/ca.crt")
        wrong_pin = "sha256:" + hashlib.sha256(b"not the cluster CA").hexdigest()
        results["wrong join"] = lab.join(wrong_pin)
        results["left after wrong join"] = lab.ok(WORKER, "ls /etc/kubernetes /var/lib/kubelet 2>/dev/null; true")
        results["join"] = lab.join(ca_pin(results["ca"]), "kubeadm join")
        results["join token id"] = lab.token_id
        assert results["join"].returncode == 0, results["join"].stdout + results["join"].stderr
        yield lab
    finally:
        if lab.figures:
            print("\nfigures: " + "; ".join(f"{name} {value}" for name, value in lab.figures.items()))
        stopped = lab.lab("down", timeout=180)
        assert stopped.returncode == 0, stopped.stderr


def test_preflight_fails_only_on_images_without_a_local_binary(cluster):
    preflight = cluster.results["preflight"]
    errors = re.findall(r"\[ERROR ([^\]]+)\]: (.*)", preflight.stdout + preflight.stderr)
    assert preflight.returncode == 1
    assert {name for name, _text in errors} == set(IGNORED_PREFLIGHT_ERRORS)
    assert sorted(re.search(r"image \S+/([a-z-]+):", text).group(1) for _name, text in errors) == [
        "coredns",
        "kube-proxy",
        "pause",
    ]
    assert "[WARNING" not in preflight.stdout + preflight.stderr


def test_kubeadm_init_passes_every_phase(cluster):
    out = cluster.results["init"].stdout
    for phase in (
        "[wait-control-plane]",
        "[upload-config]",
        "[mark-control-plane]",
        "[bootstrap-token]",
        "[kubelet-finalize]",
        "[addons] Applied essential addon: kube-proxy",
    ):
        assert phase in out
    assert "Your Kubernetes control-plane has initialized successfully!" in out


def test_join_with_a_wrong_ca_pin_is_refused_and_leaves_nothing(cluster):
    wrong = cluster.results["wrong join"]
    assert wrong.returncode == 1
    assert "none of the public keys" in wrong.stdout + wrong.stderr and "are pinned" in wrong.stdout + wrong.stderr
    left = cluster.results["left after wrong join"]
    assert "kubelet.conf" not in left and "bootstrap-kubelet.conf" not in left and "config.yaml" not in left


def test_both_nodes_are_ready_with_the_real_binaries_version(cluster):
    nodes = cluster.ready({CP.name, WORKER.name})
    for name, address in ((CP.name, CP.address), (WORKER.name, WORKER.address)):
        info = nodes[name]["status"]["nodeInfo"]
        assert info["kubeletVersion"] == "v1.20.2"
        assert {"type": "InternalIP", "address": address} in nodes[name]["status"]["addresses"]
        annotation = nodes[name]["metadata"]["annotations"]["kubeadm.alpha.kubernetes.io/cri-socket"]
        assert annotation == ENDPOINT
    assert {t["key"] for t in nodes[CP.name]["spec"]["taints"]} == {"node-role.kubernetes.io/master"}
    lease = cluster.kubectl_json("-n", "kube-node-lease", "get", "lease", WORKER.name)
    renewed = datetime.datetime.fromisoformat(lease["spec"]["renewTime"].replace("Z", "+00:00"))
    assert abs(datetime.datetime.now(datetime.timezone.utc) - renewed) < datetime.timedelta(seconds=30)


def test_the_four_control_plane_processes_run_and_serve(cluster):
    pids = cluster.pids(CP)
    assert len(set(pids.values())) == 4
    assert cluster.ok(CP, f"{ADMIN} kubectl get --raw /readyz").strip() == "ok"
    assert len(cluster.ok(CP, f"crictl -r {ENDPOINT} pods -q").split()) == 4
    mirrors = {
        p["metadata"]["name"]: p
        for p in cluster.kubectl_json("-n", "kube-system", "get", "pods")["items"]
        if "kubernetes.io/config.mirror" in p["metadata"].get("annotations", {})
    }
    assert set(mirrors) == {f"{name}-{CP.name}" for name in CONTROL_PLANE}
    assert all(p["status"]["phase"] == "Running" and p["spec"]["nodeName"] == CP.name for p in mirrors.values())
    assert {c["type"]: c["status"] for c in mirrors[f"kube-apiserver-{CP.name}"]["status"]["conditions"]}[
        "Ready"
    ] == "True"
    etcd_annotations = mirrors[f"etcd-{CP.name}"]["metadata"]["annotations"]
    assert etcd_annotations["kubeadm.kubernetes.io/etcd.advertise-client-urls"] == f"https://{CP.address}:2379"
    healthz = cluster.ok(
        WORKER,
        'python3 -c "import urllib.request; '
        "print(urllib.request.urlopen('http://127.0.0.1:10248/healthz').read().decode())\"",
    )
    assert healthz.strip() == "ok"
    cluster.figures["control plane RSS"] = f"{rss_kib(cluster, CP, list(pids.values())) // 1024} MiB"
    for node in (CP, WORKER):
        standin = int(cluster.ok(node, "systemctl show kubelet -p MainPID --value"))
        cluster.figures[f"stand-in RSS on {node.name}"] = f"{rss_kib(cluster, node, [standin]) // 1024} MiB"


def test_worker_bootstrapped_with_a_csr_signed_by_the_controller_manager(cluster):
    requestor = f"system:bootstrap:{cluster.results['join token id']}"
    mine = [c for c in cluster.csrs().values() if c["spec"]["username"] == requestor]
    assert len(mine) == 1
    assert mine[0]["spec"]["signerName"] == "kubernetes.io/kube-apiserver-client-kubelet"
    assert {c["type"] for c in mine[0]["status"]["conditions"]} == {"Approved"}
    assert mine[0]["status"]["certificate"]
    pem = cluster.ok(WORKER, "cat /var/lib/kubelet/pki/kubelet-client-current.pem")
    issued = x509.load_pem_x509_certificate(pem.encode())
    assert issued.subject.rfc4514_string() == f"CN=system:node:{WORKER.name},O=system:nodes"
    assert issued.issuer == x509.load_pem_x509_certificate(cluster.results["ca"].encode()).subject
    kubelet_conf = yaml.safe_load(cluster.ok(WORKER, "cat /etc/kubernetes/kubelet.conf"))
    assert kubelet_conf["users"][0]["user"]["client-certificate"] == "/var/lib/kubelet/pki/kubelet-client-current.pem"


def test_a_kubelet_restart_adopts_the_running_static_pods(cluster):
    before = cluster.pids(CP)
    cluster.ok(CP, "systemctl restart kubelet")
    time.sleep(5)
    assert cluster.pids(CP) == before
    assert "adopting pod kube-system_kube-apiserver" in cluster.ok(CP, "journalctl -u kubelet --no-pager -n 30")
    cluster.ready({CP.name})


def test_a_preplaced_client_certificate_is_used_without_a_csr(cluster):
    cluster.ok(WORKER, "kubeadm reset --force")
    cluster.ok(CP, f"{ADMIN} kubectl delete node {WORKER.name}")
    before = set(cluster.csrs())
    pem, serial = node_certificate(cluster.results["ca"], cluster.ok(CP, "cat /etc/kubernetes/pki/ca.key"), WORKER.name)
    cluster.ok(
        WORKER,
        "mkdir -p /var/lib/kubelet/pki && umask 077 && cat > /var/lib/kubelet/pki/kubelet-client-current.pem",
        pem,
    )
    joined = cluster.join(ca_pin(cluster.results["ca"]), "kubeadm join with a pre-placed certificate")
    assert joined.returncode == 0, joined.stdout + joined.stderr
    cluster.ready({WORKER.name})
    assert set(cluster.csrs()) == before
    current = cluster.ok(WORKER, "cat /var/lib/kubelet/pki/kubelet-client-current.pem")
    assert x509.load_pem_x509_certificate(current.encode()).serial_number == serial
    kubelet_conf = yaml.safe_load(cluster.ok(WORKER, "cat /etc/kubernetes/kubelet.conf"))
    assert kubelet_conf["users"][0]["user"]["client-key"] == "/var/lib/kubelet/pki/kubelet-client-current.pem"


def test_kubeadm_reset_on_the_control_plane_finds_etcd_and_stops_the_static_pods(cluster):
    pids = cluster.pids(CP)
    reset = cluster.timed("kubeadm reset on cp-0", CP, "kubeadm reset --force --v=1")
    assert reset.returncode == 0, reset.stdout + reset.stderr
    assert "This is the only remaining etcd member in the etcd cluster, skip removing it" in reset.stderr
    assert "failed to remove etcd member" not in reset.stdout + reset.stderr
    assert cluster.ok(CP, "ls /run/kubelet-standin/pods; ls /etc/kubernetes/manifests").split() == []
    alive = cluster.ok(CP, "ps -o pid= -p " + ",".join(map(str, pids.values())) + "; true")
    assert alive.split() == []
