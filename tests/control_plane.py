"""A real Kubernetes control plane on loopback for tests: etcd, kube-apiserver and kube-controller-manager.

The binaries are the lab's real Kubernetes build (``tests/lab/lab kubernetes``): ``CK_KUBERNETES_BIN`` or
``$CK_LAB_CACHE/kubernetes/v1.20.2/bin``. The PKI and kubeconfigs are made by the real kubeadm
(``init phase certs``/``kubeconfig``) with the ECDSA P-256 CAs the collection makes for kubeadm 1.20 on the lab's
default (``init_ca_key_algorithm: ecdsa-p256``), the bootstrap-token RBAC and ``cluster-info`` by ``init phase
bootstrap-token`` less the tokens' certificate rights (as ``kubeadm_init`` leaves them), so what the tests meet is what
the collection's cluster serves: Node authorizer, NodeRestriction, bootstrap-token authentication, the CSR approver and
signer, the bootstrap signer and the token cleaner.
No kubelet and no scheduler: pods stay Pending.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import Kubeadm
from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm.ca import make_missing_cas, missing_cas

KUBERNETES_VERSION = "v1.20.2"
READY_TIMEOUT = 90.0
# A TEST-NET address (RFC 5737) for kubeadm's advertise address: it lands in certificates only and is never dialled.
ADVERTISE_ADDRESS = "192.0.2.10"


def binaries_dir() -> Path:
    configured = os.environ.get("CK_KUBERNETES_BIN")
    if configured:
        return Path(configured)
    cache = Path(os.environ.get("CK_LAB_CACHE") or "/var/cache/confidential-kubernetes-lab")
    return cache / "kubernetes" / KUBERNETES_VERSION / "bin"


def missing_binaries() -> list[str]:
    wanted = ("etcd", "kube-apiserver", "kube-controller-manager", "kubeadm", "kubectl", "helm-3.17.2", "helm-4.1.4")
    return [name for name in wanted if not os.access(binaries_dir() / name, os.X_OK)]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class ControlPlane:
    """A running control plane; ``admin_kubeconfig`` is cluster-admin, ``pki`` holds kubeadm's PKI."""

    root: Path
    api_port: int
    bin: Path
    processes: dict = field(default_factory=dict)
    argvs: dict = field(default_factory=dict)
    # More kube-apiserver flags (e.g. --encryption-provider-config), and etcd's client URL once started.
    api_server_args: list = field(default_factory=list)
    etcd_url: str = ""

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.root / "admin.conf"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    def user_kubeconfig(self, path: Path, user: dict) -> Path:
        """A kubeconfig (0600) at ``path`` with this API server, its CA and ``user``'s credentials only."""
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "c",
                    "clusters": [
                        {
                            "name": "k",
                            "cluster": {"server": self.server, "certificate-authority": str(self.pki / "ca.crt")},
                        }
                    ],
                    "users": [{"name": "u", "user": user}],
                    "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
                }
            )
        )
        path.chmod(0o600)
        return path

    def kubectl(
        self, *args: str, kubeconfig: Path | None = None, stdin: bytes | None = None, check: bool = True
    ) -> subprocess.CompletedProcess:
        argv = [str(self.bin / "kubectl"), f"--kubeconfig={kubeconfig or self.admin_kubeconfig}", *args]
        done = subprocess.run(argv, input=stdin, capture_output=True, timeout=120, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr.decode(errors='replace')}")
        return done

    def kubeadm(self, *args: str) -> str:
        done = subprocess.run([str(self.bin / "kubeadm"), *args], capture_output=True, timeout=120, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"kubeadm {' '.join(args)} failed: {done.stderr.decode(errors='replace')[-2000:]}")
        return done.stdout.decode()

    def _start(self, name: str, argv: list[str]) -> None:
        self.argvs[name] = argv
        log = open(self.root / f"{name}.log", "ab")  # pylint: disable=consider-using-with
        self.processes[name] = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
        )
        log.close()

    def _ready(self) -> bool:
        context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        try:
            with urllib.request.urlopen(f"{self.server}/readyz", context=context, timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def start(self) -> ControlPlane:
        etcd_client, etcd_peer = _free_port(), _free_port()
        config = self.root / "kubeadm.yaml"
        config.write_text(
            "apiVersion: kubeadm.k8s.io/v1beta2\nkind: InitConfiguration\n"
            f"localAPIEndpoint: {{advertiseAddress: {ADVERTISE_ADDRESS}, bindPort: {self.api_port}}}\n"
            "nodeRegistration: {name: test-control-plane}\n---\n"
            "apiVersion: kubeadm.k8s.io/v1beta2\nkind: ClusterConfiguration\n"
            f"kubernetesVersion: {KUBERNETES_VERSION}\ncertificatesDir: {self.pki}\n"
            f"controlPlaneEndpoint: 127.0.0.1:{self.api_port}\n"
            "apiServer: {certSANs: [127.0.0.1, localhost]}\n"
        )
        # The lab's default: the collection's ECDSA CAs, which kubeadm 1.20 must take as its own (kubeadm_init does the same).
        make_missing_cas(str(self.pki), missing_cas(str(self.pki)))
        self.kubeadm("init", "phase", "certs", "all", f"--config={config}")
        self.kubeadm("init", "phase", "kubeconfig", "admin", f"--config={config}", f"--kubeconfig-dir={self.root}")
        self.kubeadm(
            "init", "phase", "kubeconfig", "controller-manager", f"--config={config}", f"--kubeconfig-dir={self.root}"
        )
        # kubeadm points the controller-manager at the advertise address; here the API server is on loopback only.
        manager_conf = self.root / "controller-manager.conf"
        manager_conf.write_text(manager_conf.read_text().replace(f"https://{ADVERTISE_ADDRESS}:", "https://127.0.0.1:"))
        pki = self.pki
        self.etcd_url = f"http://127.0.0.1:{etcd_client}"
        self._start(
            "etcd",
            [
                str(self.bin / "etcd"),
                f"--data-dir={self.root / 'etcd'}",
                "--name=test",
                f"--listen-client-urls=http://127.0.0.1:{etcd_client}",
                f"--advertise-client-urls=http://127.0.0.1:{etcd_client}",
                f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-cluster=test=http://127.0.0.1:{etcd_peer}",
            ],
        )
        self._start(
            "kube-apiserver",
            [
                str(self.bin / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{etcd_client}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.api_port}",
                "--advertise-address=127.0.0.1",
                "--insecure-port=0",
                "--endpoint-reconciler-type=none",
                "--authorization-mode=Node,RBAC",
                "--enable-bootstrap-token-auth=true",
                "--enable-admission-plugins=NodeRestriction",
                "--allow-privileged=true",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--service-cluster-ip-range=10.96.0.0/12",
                *self.api_server_args,
            ],
        )
        deadline = time.monotonic() + READY_TIMEOUT
        while not self._ready():
            exited = [name for name, process in self.processes.items() if process.poll() is not None]
            if exited or time.monotonic() > deadline:
                self.stop()
                logs = "\n".join(
                    f"--- {name}:\n" + (self.root / f"{name}.log").read_text(errors="replace")[-1500:]
                    for name in self.processes
                )
                raise RuntimeError(
                    f"the control plane did not become ready ({', '.join(exited) or 'timeout'}):\n{logs}"
                )
            time.sleep(0.3)
        # Started once the API server answers: it gives the API server 10 s, which a loaded machine can exceed.
        self._start(
            "kube-controller-manager",
            [
                str(self.bin / "kube-controller-manager"),
                f"--kubeconfig={self.root / 'controller-manager.conf'}",
                f"--authentication-kubeconfig={self.root / 'controller-manager.conf'}",
                f"--authorization-kubeconfig={self.root / 'controller-manager.conf'}",
                "--controllers=*,bootstrapsigner,tokencleaner",
                "--leader-elect=false",
                "--port=0",
                "--secure-port=0",
                "--use-service-account-credentials=true",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
            ],
        )
        # kubeadm's bootstrap-token RBAC, CSR auto-approval and cluster-info, as kubeadm init makes them, then without
        # the tokens' certificate rights, as kubeadm_init leaves them (CK_TOKEN_CSR_RIGHTS=kubeadm keeps kubeadm's).
        self.kubeadm("init", "phase", "bootstrap-token", f"--config={config}", f"--kubeconfig={self.admin_kubeconfig}")
        if os.environ.get("CK_TOKEN_CSR_RIGHTS") != "kubeadm":
            Kubeadm(str(self.bin / "kubeadm")).revoke_token_certificate_rights(str(self.admin_kubeconfig))
        if self.processes["kube-controller-manager"].poll() is not None:
            self.stop()
            log = (self.root / "kube-controller-manager.log").read_text(errors="replace")[-1500:]
            raise RuntimeError(f"kube-controller-manager exited:\n{log}")
        return self

    def stop_api_server(self) -> None:
        """Stop kube-apiserver (SIGTERM, as a static pod's restart does), and the controller-manager with it: without
        the API server it exits fatally by itself sooner or later (where a kubelet would restart it), which left later
        tests without a controller-manager. etcd stays."""
        self._stop("kube-controller-manager", "kube-apiserver")

    def start_api_server(self) -> float:
        """Start kube-apiserver again with the same flags on the same port, then the controller-manager; seconds until
        the API server is ready."""
        started = time.monotonic()
        self._start("kube-apiserver", self.argvs["kube-apiserver"])
        deadline = started + READY_TIMEOUT
        while not self._ready():
            if self.processes["kube-apiserver"].poll() is not None or time.monotonic() > deadline:
                log = (self.root / "kube-apiserver.log").read_text(errors="replace")[-1500:]
                raise RuntimeError(f"kube-apiserver did not become ready again:\n{log}")
            time.sleep(0.2)
        ready = time.monotonic() - started
        self._start("kube-controller-manager", self.argvs["kube-controller-manager"])
        return ready

    def stop(self) -> None:
        self._stop(*self.processes)

    def _stop(self, *names: str) -> None:
        """SIGTERM to each running process named, then wait for each (SIGKILL after 15 s)."""
        for name in names:
            if self.processes[name].poll() is None:
                self.processes[name].terminate()
        for name in names:
            try:
                self.processes[name].wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.processes[name].kill()
                self.processes[name].wait(timeout=5)


def start_control_plane(api_server_args: list[str] | None = None) -> ControlPlane:
    root = Path(tempfile.mkdtemp(prefix="ck-kube-"))
    try:
        return ControlPlane(
            root=root, api_port=_free_port(), bin=binaries_dir(), api_server_args=list(api_server_args or [])
        ).start()
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise


def stop_control_plane(control_plane: ControlPlane) -> None:
    control_plane.stop()
    shutil.rmtree(control_plane.root, ignore_errors=True)
