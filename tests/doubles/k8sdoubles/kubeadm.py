"""kubeadm double: version, config validate, init, join, token, upload-certs, reset."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from cryptography.exceptions import InvalidSignature

from . import KUBERNETES_VERSION, pki
from .cli import Parsed, UsageError, parse
from .client import ApiStatusError, Client, Connection, load_kubeconfig, resource_path
from .common import (
    APISERVER_LOG_FILE,
    APISERVER_PID_FILE,
    APISERVER_STATE_DIR,
    APISERVER_STATE_FILE,
    APISERVER_UNIT,
    APISERVER_UNIT_FILE,
    DOUBLES_DIR,
    DEFAULT_PKI_DIR,
    KUBELET_DIR,
    KUBERNETES_DIR,
    MANIFESTS_DIR,
    DoubleError,
    atomic_write,
    format_duration,
    host_path,
    now,
    parse_duration,
    parse_rfc3339,
    rfc3339,
    root,
    short_human_duration,
    tabulate,
    version_info,
)
from .kubeadm_config import (
    BOOTSTRAP_GROUP_RE,
    DEFAULT_NODE_GROUP,
    DEFAULT_TOKEN_DESCRIPTION,
    TOKEN_RE,
    ConfigSet,
    args_map,
    generate_token,
    klog,
    load_config,
    normalize_kubernetes_version,
    parse_config,
    parse_kubernetes_version,
    split_host_port,
    validate,
)

STACK_HINT = "To see the stack trace of this error execute with --v=5 or higher"
CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"
EXCLUDE_LB_LABEL = "node.kubernetes.io/exclude-from-external-load-balancers"
DEFAULT_CRI_SOCKET = "unix:///var/run/containerd/containerd.sock"
KUBELET_CLIENT_CURRENT = "/var/lib/kubelet/pki/kubelet-client-current.pem"
KUBECONFIG_FILES = (
    "admin.conf",
    "super-admin.conf",
    "kubelet.conf",
    "bootstrap-kubelet.conf",
    "controller-manager.conf",
    "scheduler.conf",
)
SHARED_CERTS = (
    "ca.crt",
    "ca.key",
    "front-proxy-ca.crt",
    "front-proxy-ca.key",
    "sa.key",
    "sa.pub",
    "etcd/ca.crt",
    "etcd/ca.key",
)
DISCOVERY_RETRY_INTERVAL = 5.0

INIT_PHASES = [
    "preflight",
    "certs",
    "certs/ca",
    "certs/apiserver",
    "certs/apiserver-kubelet-client",
    "certs/front-proxy-ca",
    "certs/front-proxy-client",
    "certs/etcd-ca",
    "certs/etcd-server",
    "certs/etcd-peer",
    "certs/etcd-healthcheck-client",
    "certs/apiserver-etcd-client",
    "certs/sa",
    "kubeconfig",
    "kubeconfig/admin",
    "kubeconfig/super-admin",
    "kubeconfig/kubelet",
    "kubeconfig/controller-manager",
    "kubeconfig/scheduler",
    "etcd",
    "etcd/local",
    "control-plane",
    "control-plane/apiserver",
    "control-plane/controller-manager",
    "control-plane/scheduler",
    "kubelet-start",
    "wait-control-plane",
    "upload-config",
    "upload-config/kubeadm",
    "upload-config/kubelet",
    "upload-certs",
    "mark-control-plane",
    "bootstrap-token",
    "kubelet-finalize",
    "kubelet-finalize/enable-client-cert-rotation",
    "addon",
    "addon/coredns",
    "addon/kube-proxy",
    "show-join-command",
]
JOIN_PHASES = [
    "preflight",
    "control-plane-prepare",
    "control-plane-prepare/download-certs",
    "control-plane-prepare/certs",
    "control-plane-prepare/kubeconfig",
    "control-plane-prepare/control-plane",
    "kubelet-start",
    "control-plane-join",
    "control-plane-join/etcd",
    "control-plane-join/mark-control-plane",
    "wait-control-plane",
]


class PhaseError(DoubleError):
    def __init__(self, phase: str, message: str) -> None:
        super().__init__(message)
        self.phase = phase


class PreflightError(DoubleError):
    """Fatal preflight checks, printed as kubeadm does."""


# ---------------------------------------------------------------- helpers


def say(text: str = "") -> None:
    print(text, flush=True)


def skipped(phase: str, skip: set[str]) -> bool:
    parts = phase.split("/")
    return any("/".join(parts[: i + 1]) in skip for i in range(len(parts)))


def check_phases(skip: set[str], known: list[str]) -> None:
    for phase in sorted(skip):
        if phase not in known:
            raise DoubleError(f"invalid phase name: {phase}")


def check_name(path: str) -> str:
    return "FileAvailable-" + path.replace("/", "-")


def run_preflight(checks: list[tuple[str, str, bool]], ignore: set[str]) -> None:
    """checks: (name, message, is_error). Prints warnings, raises on errors not ignored."""
    lowered = {item.lower() for item in ignore}
    if "all" in lowered and len(lowered) > 1:
        raise DoubleError("don't specify individual checks if 'all' is used")
    fatal = []
    for name, message, is_error in checks:
        if not is_error or "all" in lowered or name.lower() in lowered:
            print(f"\t[WARNING {name}]: {message}", file=sys.stderr)
        else:
            fatal.append(f"\t[ERROR {name}]: {message}")
    if fatal:
        raise PreflightError(
            "[preflight] Some fatal errors occurred:\n"
            + "\n".join(fatal)
            + "\n[preflight] If you know what you are doing, you can make a check non-fatal with "
            "`--ignore-preflight-errors=...`"
        )


def port_in_use(address: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError:
            return True
    return False


def default_ip(target: str = "10.255.255.255") -> str:
    """The address of the interface that routes to target (kubeadm/kubelet choose the default-route one)."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in target else socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((target, 1))
            return probe.getsockname()[0]
    except OSError:
        raise DoubleError("unable to select an IP from default routes.") from None


def host_name() -> str:
    return socket.gethostname().split(".")[0].lower()


def dir_not_empty(path: str) -> bool:
    target = host_path(path)
    return target.is_dir() and any(target.iterdir())


def write_yaml(path: str, document: object, mode: int = 0o600) -> None:
    atomic_write(host_path(path), yaml.safe_dump(document, default_flow_style=False, sort_keys=True), mode)


def service_ip(subnet: str, index: int) -> str:
    network = ipaddress.ip_network(subnet.split(",")[0].strip(), strict=False)
    return str(network[index])


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def server_url(endpoint: str) -> str:
    return f"https://{endpoint}"


def os_image() -> str:
    for candidate in (host_path("/etc/os-release"), Path("/etc/os-release")):
        try:
            for line in candidate.read_text().splitlines():
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip('"')
        except OSError:
            continue
    return "Linux"


# ---------------------------------------------------------------- the API double process


def use_systemd() -> bool:
    """sd_booted(): run the API double as a systemd service where systemd is PID 1 and the root is real."""
    if os.environ.get("K8S_DOUBLES_NO_SYSTEMD") or str(root()) != "/":
        return False
    return Path("/run/systemd/system").is_dir() and shutil.which("systemctl") is not None


def _systemctl(*args: str) -> subprocess.CompletedProcess[str]:
    """The one seam to systemd; tests replace it."""
    return subprocess.run(["systemctl", *args], capture_output=True, text=True, check=False)


def apiserver_unit(command: list[str]) -> str:
    """A persistent, enabled unit: like kubelet-run static pods, the API double comes back after a reboot."""
    environment = "".join(
        f"Environment={name}={os.environ[name]}\n"
        for name in ("K8S_DOUBLES_ROOT", "K8S_DOUBLES_APISERVER_BIND_ADDRESS")
        if os.environ.get(name)
    )
    return (
        "[Unit]\n"
        "Description=kube-apiserver test double (k8s-doubles), written by the kubeadm double\n"
        "After=network-online.target\n"
        "Wants=network-online.target\n\n"
        "[Service]\n"
        f"{environment}"
        f"ExecStart={' '.join(command)}\n"
        "Restart=always\n"
        "RestartSec=1\n\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def _pid_alive(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"kube-apiserver" in cmdline


def apiserver_pid() -> int | None:
    try:
        pid = int(host_path(APISERVER_PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _pid_alive(pid) else None


def apiserver_running() -> bool:
    if use_systemd():
        return _systemctl("is-active", "--quiet", APISERVER_UNIT).returncode == 0
    return apiserver_pid() is not None


def start_apiserver(advertise: str, port: int, pki_dir: str, service_subnet: str) -> None:
    """Start the API double (systemd unit or daemon with pid file); leave a running one alone."""
    if apiserver_running():
        return
    args = [
        f"--advertise-address={advertise}",
        f"--secure-port={port}",
        f"--client-ca-file={pki_dir}/ca.crt",
        f"--tls-cert-file={pki_dir}/apiserver.crt",
        f"--tls-private-key-file={pki_dir}/apiserver.key",
        f"--service-cluster-ip-range={service_subnet}",
        f"--double-state-file={APISERVER_STATE_FILE}",
        f"--double-pid-file={APISERVER_PID_FILE}",
    ]
    program = [sys.executable, str(DOUBLES_DIR / "k8sdoubles" / "run.py"), "kube-apiserver"]
    if use_systemd():
        atomic_write(host_path(APISERVER_UNIT_FILE), apiserver_unit(program + args), 0o644)
        _systemctl("reset-failed", APISERVER_UNIT)
        for step in (("daemon-reload",), ("enable", "--now", f"{APISERVER_UNIT}.service")):
            result = _systemctl(*step)
            if result.returncode != 0:
                raise DoubleError(
                    f"failed to start the kube-apiserver double: systemctl {' '.join(step)}: "
                    f"{result.stderr.strip()}"
                )
        return
    log = host_path(APISERVER_LOG_FILE)
    log.parent.mkdir(parents=True, exist_ok=True)
    host_path(APISERVER_PID_FILE).parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as handle:
        subprocess.Popen(
            program + args,
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=handle,
            start_new_session=True,
            close_fds=True,
        )


def stop_apiserver() -> bool:
    if use_systemd():
        active = _systemctl("is-active", "--quiet", APISERVER_UNIT).returncode == 0
        _systemctl("disable", "--now", f"{APISERVER_UNIT}.service")
        # A transient unit (systemd-run) cannot be disabled, only stopped.
        _systemctl("stop", APISERVER_UNIT)
        host_path(APISERVER_UNIT_FILE).unlink(missing_ok=True)
        _systemctl("daemon-reload")
        _systemctl("reset-failed", APISERVER_UNIT)
        return active
    pid = apiserver_pid()
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _pid_alive(pid):
        os.kill(pid, signal.SIGKILL)
    host_path(APISERVER_PID_FILE).unlink(missing_ok=True)
    return True


def wait_healthy(client: Client, timeout: float = 20.0) -> float:
    start = time.monotonic()
    while True:
        try:
            if client.get("/healthz") == "ok":
                return time.monotonic() - start
        except DoubleError:
            pass
        if time.monotonic() - start > timeout:
            raise PhaseError(
                "wait-control-plane",
                "could not initialize a Kubernetes cluster: the API server double "
                f"did not become healthy after {format_duration(timeout)} (see {APISERVER_LOG_FILE})",
            )
        time.sleep(0.05)


# ---------------------------------------------------------------- API helpers


def api_get(client: Client, group: str, plural: str, namespace: str, name: str, version: str = "v1") -> dict | None:
    try:
        return client.get(resource_path(group, version, plural, namespace, name))  # type: ignore[return-value]
    except ApiStatusError as exc:
        if exc.code == 404:
            return None
        raise


def api_apply(client: Client, group: str, plural: str, obj: dict, version: str = "v1") -> dict:
    """Create, or replace if it exists (kubeadm's CreateOrUpdate helpers)."""
    namespace = obj["metadata"].get("namespace", "")
    try:
        return client.request("POST", resource_path(group, version, plural, namespace), obj)  # type: ignore[return-value]
    except ApiStatusError as exc:
        if exc.code != 409:
            raise
    current = client.get(resource_path(group, version, plural, namespace, obj["metadata"]["name"]))
    obj = dict(obj, metadata=dict(obj["metadata"], resourceVersion=current["metadata"]["resourceVersion"]))  # type: ignore[index]
    return client.request("PUT", resource_path(group, version, plural, namespace, obj["metadata"]["name"]), obj)  # type: ignore[return-value]


def token_secret(
    token: str, description: str, ttl: float | None, usages: list[str], groups: list[str], expires: str | None = None
) -> dict:
    token_id, token_secret_value = token.split(".")
    data = {"token-id": token_id, "token-secret": token_secret_value}
    if description:
        data["description"] = description
    if expires:
        data["expiration"] = rfc3339(parse_rfc3339(expires))
    elif ttl:
        data["expiration"] = rfc3339(now() + datetime.timedelta(seconds=ttl))
    for usage in usages:
        data[f"usage-bootstrap-{usage}"] = "true"
    if groups:
        data["auth-extra-groups"] = ",".join(groups)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"bootstrap-token-{token_id}", "namespace": "kube-system"},
        "type": "bootstrap.kubernetes.io/token",
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


def node_object(name: str, ip: str, control_plane: bool, taints: list[dict], extra_labels: dict[str, str]) -> dict:
    labels = {
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
    }
    labels.update(extra_labels)
    if control_plane:
        labels[CONTROL_PLANE_LABEL] = ""
        labels[EXCLUDE_LB_LABEL] = ""
    stamp = rfc3339(now())
    conditions = [
        ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ]
    spec: dict = {}
    if taints:
        spec["taints"] = [{k: v for k, v in t.items() if k in ("key", "value", "effect")} for t in taints]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
        },
        "spec": spec,
        "status": {
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
            "conditions": [
                {
                    "type": t,
                    "status": s,
                    "reason": r,
                    "message": m,
                    "lastHeartbeatTime": stamp,
                    "lastTransitionTime": stamp,
                }
                for t, s, r, m in conditions
            ],
            "capacity": {"cpu": str(os.cpu_count() or 1), "memory": "4026532Ki", "pods": "110"},
            "allocatable": {"cpu": str(os.cpu_count() or 1), "memory": "3924132Ki", "pods": "110"},
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": "",
                "containerRuntimeVersion": "containerd://1.7.24",
                "kernelVersion": platform.release(),
                "kubeProxyVersion": KUBERNETES_VERSION,
                "kubeletVersion": KUBERNETES_VERSION,
                "machineID": "",
                "operatingSystem": "linux",
                "osImage": os_image(),
                "systemUUID": "",
            },
        },
    }


def node_labels_from_args(kubelet_args: dict[str, str]) -> dict[str, str]:
    labels = {}
    for item in filter(None, kubelet_args.get("node-labels", "").split(",")):
        key, _unused, value = item.partition("=")
        labels[key] = value
    return labels


# ---------------------------------------------------------------- PKI phases


@dataclass
class PkiPlan:
    pki_dir: str
    node_name: str
    advertise: str
    algorithm: str
    dns_domain: str
    service_subnet: str
    cp_endpoint_host: str
    cert_sans: list[str] = field(default_factory=list)
    skip: set[str] = field(default_factory=set)
    skip_prefix: str = "certs"


def _load_ca(pki_dir: str, base: str, ux_name: str) -> tuple | None:
    cert_path, key_path = f"{pki_dir}/{base}.crt", f"{pki_dir}/{base}.key"
    if not host_path(cert_path).exists():
        return None
    try:
        cert = pki.load_cert(cert_path)
    except DoubleError as exc:
        raise DoubleError(f"failure loading certificate for {ux_name}: {exc}") from None
    try:
        key = pki.load_key(key_path)
    except DoubleError as exc:
        raise DoubleError(f"failure loading key for {ux_name}: {exc}") from None
    if not pki.is_ca(cert):
        raise DoubleError(f"certificate {base} is not a CA")
    if not pki.key_matches(cert, key):
        raise DoubleError(
            f"failure loading {ux_name} certificate authority: tls: private key does not match public key"
        )
    return cert, key


def _ensure_ca(plan: PkiPlan, base: str, phase: str, common_name: str, ux_name: str) -> tuple:
    existing = _load_ca(plan.pki_dir, base, ux_name)
    if existing:
        say(f"[certs] Using existing {base} certificate authority")
        return existing
    if skipped(f"{plan.skip_prefix}/{phase}", plan.skip):
        raise DoubleError(
            f"failure loading certificate for {ux_name}: couldn't load the certificate file "
            f"{plan.pki_dir}/{base}.crt: open {plan.pki_dir}/{base}.crt: no such file or directory"
        )
    say(f'[certs] Generating "{base}" certificate and key')
    cert, key = pki.new_ca(common_name, plan.algorithm)
    pki.write_pair(plan.pki_dir, base, cert, key)
    return cert, key


def _ensure_leaf(plan: PkiPlan, base: str, phase: str, spec: pki.CertSpec, ca: tuple) -> None:
    if skipped(f"{plan.skip_prefix}/{phase}", plan.skip):
        return
    cert_path = f"{plan.pki_dir}/{base}.crt"
    if host_path(cert_path).exists():
        cert = pki.load_cert(cert_path)
        key = pki.load_key(f"{plan.pki_dir}/{base}.key")
        try:
            cert.verify_directly_issued_by(ca[0])
        except (ValueError, TypeError, InvalidSignature):
            raise DoubleError(f"certificate {base} is not signed by corresponding CA") from None
        if not pki.key_matches(cert, key):
            raise DoubleError(f"failure loading {base} certificate: tls: private key does not match public key")
        say(f"[certs] Using existing {base} certificate and key on disk")
        return
    say(f'[certs] Generating "{base}" certificate and key')
    if spec.server:
        say(
            f"[certs] {base} serving cert is signed for DNS names [{' '.join(dict.fromkeys(spec.dns_names))}] "
            f"and IPs [{' '.join(dict.fromkeys(spec.ips))}]"
        )
    cert, key = pki.new_cert(spec, ca[0], ca[1], plan.algorithm)
    pki.write_pair(plan.pki_dir, base, cert, key)


def _split_sans(values: list[str]) -> tuple[list[str], list[str]]:
    dns, ips = [], []
    for value in values:
        if not value:
            continue
        try:
            ipaddress.ip_address(value)
            ips.append(value)
        except ValueError:
            dns.append(value)
    return dns, ips


def create_pki(plan: PkiPlan, shared_only_existing: bool = False) -> None:
    """kubeadm's certs phase; existing files are validated and reused."""
    say(f'[certs] Using certificateDir folder "{plan.pki_dir}"')
    ca = _ensure_ca(plan, "ca", "ca", "kubernetes", "CA")
    extra_dns, extra_ips = _split_sans(plan.cert_sans + [plan.cp_endpoint_host])
    _ensure_leaf(
        plan,
        "apiserver",
        "apiserver",
        pki.CertSpec(
            "kube-apiserver",
            server=True,
            dns_names=[
                plan.node_name,
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                f"kubernetes.default.svc.{plan.dns_domain}",
            ]
            + extra_dns,
            ips=[service_ip(plan.service_subnet, 1), plan.advertise] + extra_ips,
        ),
        ca,
    )
    _ensure_leaf(
        plan,
        "apiserver-kubelet-client",
        "apiserver-kubelet-client",
        pki.CertSpec("kube-apiserver-kubelet-client", ["kubeadm:cluster-admins"], client=True),
        ca,
    )
    front = _ensure_ca(plan, "front-proxy-ca", "front-proxy-ca", "front-proxy-ca", "front-proxy CA")
    _ensure_leaf(
        plan, "front-proxy-client", "front-proxy-client", pki.CertSpec("front-proxy-client", client=True), front
    )
    etcd = _ensure_ca(plan, "etcd/ca", "etcd-ca", "etcd-ca", "etcd CA")
    etcd_names = [plan.node_name, "localhost"]
    etcd_ips = [plan.advertise, "127.0.0.1", "::1"]
    _ensure_leaf(
        plan,
        "etcd/server",
        "etcd-server",
        pki.CertSpec(plan.node_name, server=True, client=True, dns_names=etcd_names, ips=etcd_ips),
        etcd,
    )
    _ensure_leaf(
        plan,
        "etcd/peer",
        "etcd-peer",
        pki.CertSpec(plan.node_name, server=True, client=True, dns_names=etcd_names, ips=etcd_ips),
        etcd,
    )
    _ensure_leaf(
        plan,
        "etcd/healthcheck-client",
        "etcd-healthcheck-client",
        pki.CertSpec("kube-etcd-healthcheck-client", client=True),
        etcd,
    )
    _ensure_leaf(
        plan,
        "apiserver-etcd-client",
        "apiserver-etcd-client",
        pki.CertSpec("kube-apiserver-etcd-client", client=True),
        etcd,
    )
    sa_key_path = f"{plan.pki_dir}/sa.key"
    if host_path(sa_key_path).exists():
        key = pki.load_key(sa_key_path)
        if host_path(f"{plan.pki_dir}/sa.pub").exists():
            if host_path(f"{plan.pki_dir}/sa.pub").read_bytes().strip() != pki.public_pem(key).strip():
                raise DoubleError(
                    "failure loading key for service account: the public key does not match the private key"
                )
        say('[certs] Using the existing "sa" key')
    elif skipped(f"{plan.skip_prefix}/sa", plan.skip) or shared_only_existing:
        raise DoubleError(
            f"failure loading key for service account: couldn't load the private key file {sa_key_path}: "
            f"open {sa_key_path}: no such file or directory"
        )
    else:
        say('[certs] Generating "sa" key and public key')
        key = pki.generate_key(plan.algorithm if plan.algorithm.startswith("RSA") else "RSA-2048")
        atomic_write(host_path(sa_key_path), pki.key_pem(key), 0o600)
        atomic_write(host_path(f"{plan.pki_dir}/sa.pub"), pki.public_pem(key), 0o644)


def shared_certificate_errors(pki_dir: str) -> list[str]:
    """kubeadm's SharedCertificateExists checks for a control-plane join without download-certs."""
    errors = []
    for base, ux_name in (("ca", "CA"), ("front-proxy-ca", "front-proxy CA"), ("etcd/ca", "etcd CA")):
        for suffix, what, loader in (("crt", "certificate", pki.load_cert), ("key", "key", pki.load_key)):
            try:
                loader(f"{pki_dir}/{base}.{suffix}")
            except DoubleError as exc:
                errors.append(f"failure loading {what} for {ux_name}: {exc}")
        if base == "ca":
            for name in ("sa.key", "sa.pub"):
                path = f"{pki_dir}/{name}"
                if not host_path(path).exists():
                    kind = "private" if name.endswith("key") else "public"
                    errors.append(
                        f"failure loading key for service account: couldn't load the {kind} key file {path}: "
                        f"open {path}: no such file or directory"
                    )
    return errors


def client_kubeconfig(
    pki_dir: str,
    cluster_name: str,
    server: str,
    user: str,
    orgs: list[str],
    algorithm: str,
    cert_file: str | None = None,
) -> dict:
    ca_cert = pki.load_cert(f"{pki_dir}/ca.crt")
    ca_key = pki.load_key(f"{pki_dir}/ca.key")
    cert, key = pki.new_cert(pki.CertSpec(user, orgs, client=True), ca_cert, ca_key, algorithm)
    if cert_file:
        atomic_write(host_path(cert_file), pki.cert_pem(cert) + pki.key_pem(key), 0o600)
        return pki.kubeconfig(cluster_name, server, pki.cert_pem(ca_cert), user, client_cert_file=cert_file)
    return pki.kubeconfig(cluster_name, server, pki.cert_pem(ca_cert), user, pki.cert_pem(cert), pki.key_pem(key))


def write_kubelet_client_pem(cert_pem: bytes, key_pem: bytes) -> None:
    stamp = time.strftime("%Y-%m-%d-%H-%M-%S", time.gmtime())
    target = f"/var/lib/kubelet/pki/kubelet-client-{stamp}.pem"
    atomic_write(host_path(target), cert_pem + key_pem, 0o600)
    link = host_path(KUBELET_CLIENT_CURRENT)
    link.unlink(missing_ok=True)
    link.symlink_to(Path(target).name)


def ensure_kubeconfig(name: str, document: dict, ca_pem: bytes) -> None:
    path = f"{KUBERNETES_DIR}/{name}"
    if host_path(path).exists():
        existing = yaml.safe_load(host_path(path).read_text()) or {}
        clusters = existing.get("clusters") or [{}]
        current = base64.b64decode(clusters[0].get("cluster", {}).get("certificate-authority-data", ""))
        if current.strip() != ca_pem.strip():
            raise DoubleError(f'a kubeconfig file "{path}" exists already but has got the wrong CA cert')
        say(f'[kubeconfig] Using existing kubeconfig file: "{path}"')
        return
    say(f'[kubeconfig] Writing "{name}" kubeconfig file')
    write_yaml(path, document)


# ---------------------------------------------------------------- manifests


def _pod(name: str, image: str, command: list[str], host_paths: dict[str, str], extra_env: list | None = None) -> dict:
    volumes = [{"name": n, "hostPath": {"path": p, "type": "DirectoryOrCreate"}} for n, p in host_paths.items()]
    mounts = [{"name": n, "mountPath": p, "readOnly": n != "etcd-data"} for n, p in host_paths.items()]
    container = {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "volumeMounts": mounts,
        "resources": {"requests": {"cpu": "250m" if name == "kube-apiserver" else "100m"}},
    }
    if extra_env:
        container["env"] = extra_env
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "kube-system", "labels": {"component": name, "tier": "control-plane"}},
        "spec": {
            "containers": [container],
            "hostNetwork": True,
            "priority": 2000001000,
            "priorityClassName": "system-node-critical",
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "volumes": volumes,
        },
        "status": {},
    }


def write_manifests(
    cluster: dict, advertise: str, port: int, node_name: str, pki_dir: str, skip: set[str], prefix: str, version: str
) -> None:
    repo = cluster.get("imageRepository") or "registry.k8s.io"
    networking = cluster.get("networking") or {}
    service_subnet = networking.get("serviceSubnet") or "10.96.0.0/12"
    etcd_local = (cluster.get("etcd") or {}).get("local") or {}
    data_dir = etcd_local.get("dataDir") or "/var/lib/etcd"
    host_paths = {"k8s-certs": pki_dir, "ca-certs": "/etc/ssl/certs"}

    def flags(base: dict[str, str], component: str) -> list[str]:
        base.update(args_map((cluster.get(component) or {}).get("extraArgs")))
        return [f"--{k}={v}" for k, v in sorted(base.items())]

    if not skipped(f"{prefix}etcd", skip) and not (cluster.get("etcd") or {}).get("external"):
        if prefix == "":
            say(f'[etcd] Creating static Pod manifest for local etcd in "{MANIFESTS_DIR}"')
        etcd_flags = {
            "advertise-client-urls": f"https://{url_host(advertise)}:2379",
            "cert-file": f"{pki_dir}/etcd/server.crt",
            "client-cert-auth": "true",
            "data-dir": data_dir,
            "key-file": f"{pki_dir}/etcd/server.key",
            "listen-client-urls": f"https://127.0.0.1:2379,https://{url_host(advertise)}:2379",
            "name": node_name,
            "peer-cert-file": f"{pki_dir}/etcd/peer.crt",
            "peer-key-file": f"{pki_dir}/etcd/peer.key",
            "trusted-ca-file": f"{pki_dir}/etcd/ca.crt",
            "peer-trusted-ca-file": f"{pki_dir}/etcd/ca.crt",
        }
        etcd_flags.update(args_map(etcd_local.get("extraArgs")))
        write_yaml(
            f"{MANIFESTS_DIR}/etcd.yaml",
            _pod(
                "etcd",
                f"{repo}/etcd:3.5.15-0",
                ["etcd"] + [f"--{k}={v}" for k, v in sorted(etcd_flags.items())],
                {"etcd-certs": f"{pki_dir}/etcd", "etcd-data": data_dir},
            ),
        )
    cp_phase = "control-plane" if prefix == "" else "control-plane-prepare/control-plane"
    if skipped(cp_phase, skip):
        return
    say(f'[control-plane] Using manifest folder "{MANIFESTS_DIR}"')
    say('[control-plane] Creating static Pod manifest for "kube-apiserver"')
    apiserver = flags(
        {
            "advertise-address": advertise,
            "allow-privileged": "true",
            "authorization-mode": "Node,RBAC",
            "client-ca-file": f"{pki_dir}/ca.crt",
            "enable-admission-plugins": "NodeRestriction",
            "enable-bootstrap-token-auth": "true",
            "etcd-servers": "https://127.0.0.1:2379",
            "kubelet-client-certificate": f"{pki_dir}/apiserver-kubelet-client.crt",
            "kubelet-client-key": f"{pki_dir}/apiserver-kubelet-client.key",
            "secure-port": str(port),
            "service-account-issuer": "https://kubernetes.default.svc.cluster.local",
            "service-account-key-file": f"{pki_dir}/sa.pub",
            "service-account-signing-key-file": f"{pki_dir}/sa.key",
            "service-cluster-ip-range": service_subnet,
            "tls-cert-file": f"{pki_dir}/apiserver.crt",
            "tls-private-key-file": f"{pki_dir}/apiserver.key",
        },
        "apiServer",
    )
    write_yaml(
        f"{MANIFESTS_DIR}/kube-apiserver.yaml",
        _pod("kube-apiserver", f"{repo}/kube-apiserver:{version}", ["kube-apiserver"] + apiserver, host_paths),
    )
    say('[control-plane] Creating static Pod manifest for "kube-controller-manager"')
    manager = flags(
        {
            "authentication-kubeconfig": "/etc/kubernetes/controller-manager.conf",
            "authorization-kubeconfig": "/etc/kubernetes/controller-manager.conf",
            "bind-address": "127.0.0.1",
            "client-ca-file": f"{pki_dir}/ca.crt",
            "cluster-name": cluster.get("clusterName") or "kubernetes",
            "cluster-signing-cert-file": f"{pki_dir}/ca.crt",
            "cluster-signing-key-file": f"{pki_dir}/ca.key",
            "controllers": "*,bootstrapsigner,tokencleaner",
            "kubeconfig": "/etc/kubernetes/controller-manager.conf",
            "leader-elect": "true",
            "root-ca-file": f"{pki_dir}/ca.crt",
            "service-account-private-key-file": f"{pki_dir}/sa.key",
            "use-service-account-credentials": "true",
        },
        "controllerManager",
    )
    write_yaml(
        f"{MANIFESTS_DIR}/kube-controller-manager.yaml",
        _pod(
            "kube-controller-manager",
            f"{repo}/kube-controller-manager:{version}",
            ["kube-controller-manager"] + manager,
            host_paths,
        ),
    )
    say('[control-plane] Creating static Pod manifest for "kube-scheduler"')
    scheduler = flags(
        {
            "authentication-kubeconfig": "/etc/kubernetes/scheduler.conf",
            "authorization-kubeconfig": "/etc/kubernetes/scheduler.conf",
            "bind-address": "127.0.0.1",
            "kubeconfig": "/etc/kubernetes/scheduler.conf",
            "leader-elect": "true",
        },
        "scheduler",
    )
    write_yaml(
        f"{MANIFESTS_DIR}/kube-scheduler.yaml",
        _pod(
            "kube-scheduler",
            f"{repo}/kube-scheduler:{version}",
            ["kube-scheduler"] + scheduler,
            {"kubeconfig": "/etc/kubernetes/scheduler.conf"},
        ),
    )


def kubelet_configuration(cluster: dict, user: dict | None) -> dict:
    networking = cluster.get("networking") or {}
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"cacheTTL": "0s", "enabled": True},
            "x509": {"clientCAFile": f"{cluster.get('certificatesDir') or DEFAULT_PKI_DIR}/ca.crt"},
        },
        "authorization": {"mode": "Webhook", "webhook": {"cacheAuthorizedTTL": "0s", "cacheUnauthorizedTTL": "0s"}},
        "cgroupDriver": "systemd",
        "clusterDNS": [service_ip(networking.get("serviceSubnet") or "10.96.0.0/12", 10)],
        "clusterDomain": networking.get("dnsDomain") or "cluster.local",
        "containerRuntimeEndpoint": "",
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "rotateCertificates": True,
        "staticPodPath": MANIFESTS_DIR,
    }
    if user:
        config.update(user)
    return config


def write_kubelet_files(kubelet_config: dict, cri_socket: str, kubelet_args: dict[str, str]) -> None:
    flags = {"container-runtime-endpoint": cri_socket, "pod-infra-container-image": "registry.k8s.io/pause:3.10"}
    flags.update(kubelet_args)
    line = " ".join(f"--{k}={v}" for k, v in flags.items())
    say(f'[kubelet-start] Writing kubelet environment file with flags to file "{KUBELET_DIR}/kubeadm-flags.env"')
    atomic_write(host_path(f"{KUBELET_DIR}/kubeadm-flags.env"), f'KUBELET_KUBEADM_ARGS="{line}"\n', 0o644)
    say(f'[kubelet-start] Writing kubelet configuration to file "{KUBELET_DIR}/config.yaml"')
    write_yaml(f"{KUBELET_DIR}/config.yaml", kubelet_config, 0o644)


# ---------------------------------------------------------------- init


@dataclass
class InitPlan:
    config: ConfigSet
    init: dict
    cluster: dict
    node_name: str
    advertise: str
    port: int
    version: str
    pki_dir: str
    cluster_name: str
    cp_endpoint: str
    skip: set[str]
    ignore: set[str]
    upload_certs: bool
    certificate_key: str
    tokens: list[dict]
    taints: list[dict]
    kubelet_args: dict[str, str]
    cri_socket: str
    algorithm: str


INIT_FLAGS = {
    "config": "str",
    "skip-phases": "list",
    "upload-certs": "bool",
    "ignore-preflight-errors": "list",
    "certificate-key": "str",
    "skip-token-print": "bool",
    "skip-certificate-key-print": "bool",
    "dry-run": "bool",
    "apiserver-advertise-address": "str",
    "apiserver-bind-port": "str",
    "control-plane-endpoint": "str",
    "pod-network-cidr": "str",
    "service-cidr": "str",
    "service-dns-domain": "str",
    "kubernetes-version": "str",
    "node-name": "str",
    "token": "str",
    "token-ttl": "str",
    "cert-dir": "str",
    "apiserver-cert-extra-sans": "list",
    "cri-socket": "str",
    "image-repository": "str",
    "feature-gates": "str",
    "patches": "str",
    "v": "str",
}
_INIT_CONFIG_COMPATIBLE = {
    "config",
    "skip-phases",
    "upload-certs",
    "ignore-preflight-errors",
    "certificate-key",
    "skip-token-print",
    "skip-certificate-key-print",
    "dry-run",
    "v",
}


def _config_from_flags(kind_init: bool, flags: Parsed) -> ConfigSet:
    init: dict = {"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "InitConfiguration"}
    cluster: dict = {"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "ClusterConfiguration"}
    if flags.get("apiserver-advertise-address") or flags.get("apiserver-bind-port"):
        init["localAPIEndpoint"] = {}
        if flags.get("apiserver-advertise-address"):
            init["localAPIEndpoint"]["advertiseAddress"] = flags.get("apiserver-advertise-address")
        if flags.get("apiserver-bind-port"):
            init["localAPIEndpoint"]["bindPort"] = int(str(flags.get("apiserver-bind-port")))
    if flags.get("node-name") or flags.get("cri-socket"):
        init["nodeRegistration"] = {
            k: flags.get(f) for k, f in (("name", "node-name"), ("criSocket", "cri-socket")) if flags.get(f)
        }
    if flags.get("token"):
        token: dict = {"token": flags.get("token")}
        if flags.get("token-ttl"):
            token["ttl"] = flags.get("token-ttl")
        init["bootstrapTokens"] = [token]
    elif flags.get("token-ttl"):
        init["bootstrapTokens"] = [{"token": generate_token(), "ttl": flags.get("token-ttl")}]
    if flags.get("certificate-key"):
        init["certificateKey"] = flags.get("certificate-key")
    mapping = {
        "control-plane-endpoint": "controlPlaneEndpoint",
        "kubernetes-version": "kubernetesVersion",
        "cert-dir": "certificatesDir",
        "image-repository": "imageRepository",
    }
    for flag, key in mapping.items():
        if flags.get(flag):
            cluster[key] = flags.get(flag)
    networking = {
        k: flags.get(f)
        for k, f in (
            ("podSubnet", "pod-network-cidr"),
            ("serviceSubnet", "service-cidr"),
            ("dnsDomain", "service-dns-domain"),
        )
        if flags.get(f)
    }
    if networking:
        cluster["networking"] = networking
    if flags.get("apiserver-cert-extra-sans"):
        cluster["apiServer"] = {"certSANs": flags.get("apiserver-cert-extra-sans")}
    return parse_config(yaml.safe_dump_all([init, cluster]))


def _load(flags: Parsed, compatible: set[str], kind: str) -> ConfigSet:
    if flags.get("config"):
        mixed = sorted(name for name in flags.given if name not in compatible)
        if mixed:
            raise DoubleError(f"can not mix '--config' with arguments [{' '.join(mixed)}]")
        config = load_config(str(flags.get("config")))
    else:
        config = _config_from_flags(kind == "init", flags)
    for warning in config.warnings:
        klog("W", warning)
    validate(config)
    return config


def plan_init(flags: Parsed) -> InitPlan:
    config = _load(flags, _INIT_CONFIG_COMPATIBLE, "init")
    init = config.get("InitConfiguration") or {}
    cluster = dict(config.get("ClusterConfiguration") or {})
    node_registration = init.get("nodeRegistration") or {}
    endpoint = init.get("localAPIEndpoint") or {}
    version, warnings = normalize_kubernetes_version(cluster.get("kubernetesVersion"))
    for warning in warnings:
        klog("W", warning, "version.go:109")
    cluster["kubernetesVersion"] = version
    advertise = endpoint.get("advertiseAddress") or default_ip()
    port = int(endpoint.get("bindPort") or 6443)
    cp_endpoint = cluster.get("controlPlaneEndpoint") or ""
    if cp_endpoint and not split_host_port(cp_endpoint)[1]:
        cp_endpoint = f"{cp_endpoint}:{port}"
    tokens = init.get("bootstrapTokens")
    if not tokens:
        tokens = [{"token": generate_token(), "description": DEFAULT_TOKEN_DESCRIPTION}]
    skip = set(init.get("skipPhases") or []) | set(flags.get("skip-phases") or [])  # type: ignore[arg-type]
    check_phases(skip, INIT_PHASES)
    taints = node_registration.get("taints")
    if taints is None:
        taints = [{"key": CONTROL_PLANE_LABEL, "effect": "NoSchedule"}]
    return InitPlan(
        config=config,
        init=init,
        cluster=cluster,
        node_name=node_registration.get("name") or host_name(),
        advertise=advertise,
        port=port,
        version=version,
        pki_dir=cluster.get("certificatesDir") or DEFAULT_PKI_DIR,
        cluster_name=cluster.get("clusterName") or "kubernetes",
        cp_endpoint=cp_endpoint,
        skip=skip,
        ignore=set(node_registration.get("ignorePreflightErrors") or []) | set(flags.get("ignore-preflight-errors") or []),  # type: ignore[arg-type]
        upload_certs=bool(flags.get("upload-certs")),
        certificate_key=str(flags.get("certificate-key") or init.get("certificateKey") or ""),
        tokens=tokens,
        taints=taints,
        kubelet_args=args_map(node_registration.get("kubeletExtraArgs")),
        cri_socket=node_registration.get("criSocket") or DEFAULT_CRI_SOCKET,
        algorithm=cluster.get("encryptionAlgorithm") or "RSA-2048",
    )


def init_preflight(plan: InitPlan) -> None:
    say("[preflight] Running pre-flight checks")
    checks: list[tuple[str, str, bool]] = []
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd"):
        path = f"{MANIFESTS_DIR}/{name}.yaml"
        if host_path(path).exists():
            checks.append((check_name(path), f"{path} already exists", True))
    admin = f"{KUBERNETES_DIR}/admin.conf"
    if host_path(admin).exists():
        checks.append((check_name(admin), f"{admin} already exists", True))
    if port_in_use(os.environ.get("K8S_DOUBLES_APISERVER_BIND_ADDRESS") or "0.0.0.0", plan.port):
        checks.append((f"Port-{plan.port}", f"Port {plan.port} is in use", True))
    data_dir = ((plan.cluster.get("etcd") or {}).get("local") or {}).get("dataDir") or "/var/lib/etcd"
    if dir_not_empty(data_dir):
        checks.append(("DirAvailable-" + data_dir.replace("/", "-"), f"{data_dir} is not empty", True))
    parsed = parse_kubernetes_version(plan.version)
    own = parse_kubernetes_version(KUBERNETES_VERSION)
    if parsed and own and parsed[:2] > own[:2]:
        checks.append(
            (
                "KubernetesVersion",
                f"Kubernetes version is greater than kubeadm version. Please consider to "
                f"upgrade kubeadm. Kubernetes version: {plan.version.lstrip('v')}. Kubeadm version: "
                f"{own[0]}.{own[1]}.x",
                False,
            )
        )
    run_preflight(checks, plan.ignore)
    say("[preflight] Pulling images required for setting up a Kubernetes cluster")
    say("[preflight] This might take a minute or two, depending on the speed of your internet connection")
    say("[preflight] You can also perform this action beforehand using 'kubeadm config images pull'")


def upload_certs(client: Client, pki_dir: str, certificate_key: str) -> str:
    key = certificate_key or pki.new_certificate_key()
    pki.decode_certificate_key(key)
    data = {}
    for name in SHARED_CERTS:
        path = f"{pki_dir}/{name}"
        if host_path(path).exists():
            data[name.replace("/", "-")] = base64.b64encode(
                pki.encrypt_with_certificate_key(key, host_path(path).read_bytes())
            ).decode()
    say('[upload-certs] Storing the certificates in Secret "kubeadm-certs" in the "kube-system" Namespace')
    api_apply(
        client,
        "",
        "secrets",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {"name": "kubeadm-certs", "namespace": "kube-system"},
            "data": data,
        },
    )
    say("[upload-certs] Using certificate key:")
    say(key)
    return key


def _cluster_info_kubeconfig(ca_pem: bytes, server: str) -> str:
    document = {
        "apiVersion": "v1",
        "clusters": [
            {"cluster": {"certificate-authority-data": base64.b64encode(ca_pem).decode(), "server": server}, "name": ""}
        ],
        "contexts": None,
        "current-context": "",
        "kind": "Config",
        "preferences": {},
        "users": None,
    }
    return yaml.safe_dump(document, default_flow_style=False, sort_keys=True)


def _cluster_configuration_document(cluster: dict) -> str:
    document = {k: v for k, v in cluster.items() if k not in ("apiVersion", "kind")}
    document.update({"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "ClusterConfiguration"})
    for component in ("apiServer", "controllerManager", "scheduler"):
        section = document.get(component)
        if isinstance(section, dict) and isinstance(section.get("extraArgs"), dict):
            section = dict(section)
            section["extraArgs"] = [{"name": k, "value": v} for k, v in section["extraArgs"].items()]
            section.pop("timeoutForControlPlane", None)
            document[component] = section
    document.setdefault("certificatesDir", DEFAULT_PKI_DIR)
    document.setdefault("clusterName", "kubernetes")
    document.setdefault("imageRepository", "registry.k8s.io")
    networking = dict(document.get("networking") or {})
    networking.setdefault("dnsDomain", "cluster.local")
    networking.setdefault("serviceSubnet", "10.96.0.0/12")
    document["networking"] = networking
    return yaml.safe_dump(document, default_flow_style=False, sort_keys=True)


def _rbac(client: Client) -> None:
    rbac = "rbac.authorization.k8s.io"

    def binding(name: str, role: str, group: str, kind: str = "ClusterRoleBinding", namespace: str = "") -> None:
        metadata = {"name": name, **({"namespace": namespace} if namespace else {})}
        api_apply(
            client,
            rbac,
            "rolebindings" if namespace else "clusterrolebindings",
            {
                "apiVersion": f"{rbac}/v1",
                "kind": kind,
                "metadata": metadata,
                "roleRef": {"apiGroup": rbac, "kind": "Role" if namespace else "ClusterRole", "name": role},
                "subjects": [
                    {"apiGroup": rbac, "kind": "User" if group == "system:anonymous" else "Group", "name": group}
                ],
            },
        )

    api_apply(
        client,
        rbac,
        "clusterroles",
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "kubeadm:get-nodes"},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}],
        },
    )
    binding("kubeadm:cluster-admins", "cluster-admin", "kubeadm:cluster-admins")
    binding("kubeadm:get-nodes", "kubeadm:get-nodes", DEFAULT_NODE_GROUP)
    binding("kubeadm:kubelet-bootstrap", "system:node-bootstrapper", DEFAULT_NODE_GROUP)
    binding(
        "kubeadm:node-autoapprove-bootstrap",
        "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
        DEFAULT_NODE_GROUP,
    )
    binding(
        "kubeadm:node-autoapprove-certificate-rotation",
        "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
        "system:nodes",
    )
    api_apply(
        client,
        rbac,
        "roles",
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "Role",
            "metadata": {"name": "kubeadm:bootstrap-signer-clusterinfo", "namespace": "kube-public"},
            "rules": [
                {"apiGroups": [""], "resourceNames": ["cluster-info"], "resources": ["configmaps"], "verbs": ["get"]}
            ],
        },
    )
    binding(
        "kubeadm:bootstrap-signer-clusterinfo",
        "kubeadm:bootstrap-signer-clusterinfo",
        "system:anonymous",
        "RoleBinding",
        "kube-public",
    )


def _addons(client: Client, plan: InitPlan, skip: set[str]) -> None:
    repo = plan.cluster.get("imageRepository") or "registry.k8s.io"
    networking = plan.cluster.get("networking") or {}
    if not skipped("addon/coredns", skip) and not (plan.cluster.get("dns") or {}).get("disabled"):
        labels = {"k8s-app": "kube-dns"}
        api_apply(
            client,
            "",
            "configmaps",
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "coredns", "namespace": "kube-system"},
                "data": {
                    "Corefile": ".:53 {\n    kubernetes cluster.local in-addr.arpa ip6.arpa\n    forward . /etc/resolv.conf\n}\n"
                },
            },
        )
        api_apply(
            client,
            "apps",
            "deployments",
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "coredns", "namespace": "kube-system", "labels": labels},
                "spec": {
                    "replicas": 2,
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {"containers": [{"name": "coredns", "image": f"{repo}/coredns/coredns:v1.11.3"}]},
                    },
                },
            },
        )
        api_apply(
            client,
            "",
            "services",
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {
                    "name": "kube-dns",
                    "namespace": "kube-system",
                    "labels": {
                        "k8s-app": "kube-dns",
                        "kubernetes.io/cluster-service": "true",
                        "kubernetes.io/name": "CoreDNS",
                    },
                },
                "spec": {
                    "clusterIP": service_ip(networking.get("serviceSubnet") or "10.96.0.0/12", 10),
                    "selector": labels,
                    "ports": [
                        {"name": "dns", "port": 53, "protocol": "UDP"},
                        {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
                        {"name": "metrics", "port": 9153, "protocol": "TCP"},
                    ],
                },
            },
        )
        say("[addons] Applied essential addon: CoreDNS")
    if not skipped("addon/kube-proxy", skip) and not (plan.cluster.get("proxy") or {}).get("disabled"):
        labels = {"k8s-app": "kube-proxy"}
        proxy_config = plan.config.get("KubeProxyConfiguration") or {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clusterCIDR": networking.get("podSubnet", ""),
            "mode": "",
        }
        api_apply(
            client,
            "",
            "configmaps",
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "kube-proxy", "namespace": "kube-system", "labels": {"app": "kube-proxy"}},
                "data": {"config.conf": yaml.safe_dump(proxy_config, sort_keys=True)},
            },
        )
        api_apply(
            client,
            "apps",
            "daemonsets",
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "metadata": {"name": "kube-proxy", "namespace": "kube-system", "labels": labels},
                "spec": {
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {"containers": [{"name": "kube-proxy", "image": f"{repo}/kube-proxy:{plan.version}"}]},
                    },
                },
            },
        )
        say("[addons] Applied essential addon: kube-proxy")


def run_init(flags: Parsed) -> int:
    plan = plan_init(flags)
    skip = plan.skip
    say(f"[init] Using Kubernetes version: {plan.version}")
    if not skipped("preflight", skip):
        try:
            init_preflight(plan)
        except PreflightError as exc:
            raise PhaseError("preflight", str(exc)) from None
    endpoint = plan.cp_endpoint or f"{url_host(plan.advertise)}:{plan.port}"
    local_server = server_url(f"{url_host(plan.advertise)}:{plan.port}")
    cp_host = split_host_port(plan.cp_endpoint)[0] if plan.cp_endpoint else ""
    networking = plan.cluster.get("networking") or {}
    pki_plan = PkiPlan(
        pki_dir=plan.pki_dir,
        node_name=plan.node_name,
        advertise=plan.advertise,
        algorithm=plan.algorithm,
        dns_domain=networking.get("dnsDomain") or "cluster.local",
        service_subnet=networking.get("serviceSubnet") or "10.96.0.0/12",
        cp_endpoint_host=cp_host,
        cert_sans=list((plan.cluster.get("apiServer") or {}).get("certSANs") or []),
        skip=skip,
    )
    if not skipped("certs", skip):
        try:
            create_pki(pki_plan)
        except DoubleError as exc:
            raise PhaseError("certs", f"error creating PKI assets: {exc}") from None
    try:
        ca_pem = pki.cert_pem(pki.load_cert(f"{plan.pki_dir}/ca.crt"))
    except DoubleError as exc:
        raise PhaseError("kubeconfig", f"failure loading certificate for CA: {exc}") from None
    if not skipped("kubeconfig", skip):
        say(f'[kubeconfig] Using kubeconfig folder "{KUBERNETES_DIR}"')
        documents = [
            ("admin", "admin.conf", server_url(endpoint), "kubernetes-admin", ["kubeadm:cluster-admins"]),
            ("super-admin", "super-admin.conf", server_url(endpoint), "kubernetes-super-admin", ["system:masters"]),
            ("kubelet", "kubelet.conf", server_url(endpoint), f"system:node:{plan.node_name}", ["system:nodes"]),
            ("controller-manager", "controller-manager.conf", local_server, "system:kube-controller-manager", []),
            ("scheduler", "scheduler.conf", local_server, "system:kube-scheduler", []),
        ]
        for phase, name, server, user, orgs in documents:
            if skipped(f"kubeconfig/{phase}", skip):
                continue
            try:
                if host_path(f"{KUBERNETES_DIR}/{name}").exists():
                    ensure_kubeconfig(name, {}, ca_pem)
                    continue
                document = client_kubeconfig(plan.pki_dir, plan.cluster_name, server, user, orgs, plan.algorithm)
                ensure_kubeconfig(name, document, ca_pem)
            except DoubleError as exc:
                raise PhaseError("kubeconfig", str(exc)) from None
    write_manifests(plan.cluster, plan.advertise, plan.port, plan.node_name, plan.pki_dir, skip, "", plan.version)
    kubelet_config = kubelet_configuration(plan.cluster, plan.config.get("KubeletConfiguration"))
    if not skipped("kubelet-start", skip):
        write_kubelet_files(kubelet_config, plan.cri_socket, plan.kubelet_args)
        say("[kubelet-start] Starting the kubelet")
    if skipped("wait-control-plane", skip):
        return 0
    say(
        f'[wait-control-plane] Waiting for the kubelet to boot up the control plane as static Pods from directory "{MANIFESTS_DIR}"'
    )
    say("[kubelet-check] Waiting for a healthy kubelet at http://127.0.0.1:10248/healthz. This can take up to 4m0s")
    say("[kubelet-check] The kubelet is healthy after 501.24ms")
    say("[api-check] Waiting for a healthy API server. This can take up to 4m0s")
    try:
        start_apiserver(plan.advertise, plan.port, plan.pki_dir, networking.get("serviceSubnet") or "10.96.0.0/12")
    except DoubleError as exc:
        raise PhaseError("wait-control-plane", str(exc)) from None
    admin_path = host_path(f"{KUBERNETES_DIR}/admin.conf")
    client = Client(load_kubeconfig(admin_path)[1]) if admin_path.exists() else None
    if client is None:
        raise PhaseError("wait-control-plane", f"couldn't load the admin kubeconfig {KUBERNETES_DIR}/admin.conf")
    elapsed = wait_healthy(Client(Connection(server=local_server, ca_pem=ca_pem)))
    say(f"[api-check] The API server is healthy after {elapsed:.3f}s")
    try:
        _init_cluster_objects(plan, client, ca_pem, endpoint, kubelet_config)
    except ApiStatusError as exc:
        raise PhaseError("upload-config", str(exc)) from None
    certificate_key = ""
    if plan.upload_certs and not skipped("upload-certs", skip):
        certificate_key = upload_certs(client, plan.pki_dir, plan.certificate_key)
    elif not skipped("upload-certs", skip):
        say("[upload-certs] Skipping phase. Please see --upload-certs")
    if not skipped("mark-control-plane", skip):
        _mark_control_plane(client, plan.node_name, plan.taints)
    if not skipped("bootstrap-token", skip):
        _bootstrap_tokens(client, plan, ca_pem, endpoint)
    if not skipped("kubelet-finalize", skip):
        say(
            f'[kubelet-finalize] Updating "{KUBERNETES_DIR}/kubelet.conf" to point to a rotatable kubelet client certificate and key'
        )
        kubelet_conf = host_path(f"{KUBERNETES_DIR}/kubelet.conf")
        if kubelet_conf.exists():
            document = yaml.safe_load(kubelet_conf.read_text())
            user = document["users"][0]["user"]
            if "client-certificate-data" in user:
                write_kubelet_client_pem(
                    base64.b64decode(user.pop("client-certificate-data")), base64.b64decode(user.pop("client-key-data"))
                )
                user["client-certificate"] = user["client-key"] = KUBELET_CLIENT_CURRENT
                write_yaml(f"{KUBERNETES_DIR}/kubelet.conf", document)
    _addons(client, plan, skip)
    if not skipped("show-join-command", skip):
        _print_init_success(plan, ca_pem, endpoint, certificate_key)
    return 0


def _init_cluster_objects(plan: InitPlan, client: Client, ca_pem: bytes, endpoint: str, kubelet_config: dict) -> None:
    if not skipped("upload-config/kubeadm", plan.skip):
        say(
            '[upload-config] Storing the configuration used in ConfigMap "kubeadm-config" in the "kube-system" Namespace'
        )
        api_apply(
            client,
            "",
            "configmaps",
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "kubeadm-config", "namespace": "kube-system"},
                "data": {"ClusterConfiguration": _cluster_configuration_document(plan.cluster)},
            },
        )
    if not skipped("upload-config/kubelet", plan.skip):
        say(
            '[kubelet] Creating a ConfigMap "kubelet-config" in namespace kube-system with the configuration for the kubelets in the cluster'
        )
        api_apply(
            client,
            "",
            "configmaps",
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "kubelet-config", "namespace": "kube-system"},
                "data": {"kubelet": yaml.safe_dump(kubelet_config, sort_keys=True)},
            },
        )
    # The kubelet registers its node; the double does it on the kubelet's behalf.
    if api_get(client, "", "nodes", "", plan.node_name) is None:
        labels = node_labels_from_args(plan.kubelet_args)
        client.request("POST", "/api/v1/nodes", node_object(plan.node_name, plan.advertise, False, [], labels))


def _mark_control_plane(client: Client, node_name: str, taints: list[dict]) -> None:
    say(
        f"[mark-control-plane] Marking the node {node_name} as control-plane by adding the labels: "
        f"[{CONTROL_PLANE_LABEL} {EXCLUDE_LB_LABEL}]"
    )
    if taints:
        rendered = " ".join(f"{t['key']}{'=' + t['value'] if t.get('value') else ''}:{t['effect']}" for t in taints)
        say(f"[mark-control-plane] Marking the node {node_name} as control-plane by adding the taints [{rendered}]")
    node = client.get(f"/api/v1/nodes/{node_name}")
    labels = dict(node["metadata"].get("labels") or {})  # type: ignore[index]
    labels.update({CONTROL_PLANE_LABEL: "", EXCLUDE_LB_LABEL: ""})
    node["metadata"]["labels"] = labels  # type: ignore[index]
    existing = node.get("spec", {}).get("taints") or []  # type: ignore[union-attr]
    merged = existing + [
        {k: v for k, v in t.items() if k in ("key", "value", "effect")}
        for t in taints
        if not any(e.get("key") == t["key"] and e.get("effect") == t["effect"] for e in existing)
    ]
    if merged:
        node.setdefault("spec", {})["taints"] = merged  # type: ignore[union-attr]
    client.request("PUT", f"/api/v1/nodes/{node_name}", node)


def _bootstrap_tokens(client: Client, plan: InitPlan, ca_pem: bytes, endpoint: str) -> None:
    for token in plan.tokens:
        say(f"[bootstrap-token] Using token: {token['token']}")
    say("[bootstrap-token] Configuring bootstrap tokens, cluster-info ConfigMap, RBAC Roles")
    for token in plan.tokens:
        ttl = parse_duration(token["ttl"]) if token.get("ttl") is not None else 24 * 3600.0
        secret = token_secret(
            token["token"],
            token.get("description", ""),
            ttl,
            token.get("usages") or ["signing", "authentication"],
            token.get("groups") or [DEFAULT_NODE_GROUP],
            token.get("expires"),
        )
        api_apply(client, "", "secrets", secret)
    _rbac(client)
    say("[bootstrap-token] Configured RBAC rules to allow Node Bootstrap tokens to get nodes")
    say(
        "[bootstrap-token] Configured RBAC rules to allow Node Bootstrap tokens to post CSRs in order for nodes to get long term certificate credentials"
    )
    say(
        "[bootstrap-token] Configured RBAC rules to allow the csrapprover controller automatically approve CSRs from a Node Bootstrap Token"
    )
    say(
        "[bootstrap-token] Configured RBAC rules to allow certificate rotation for all node client certificates in the cluster"
    )
    say('[bootstrap-token] Creating the "cluster-info" ConfigMap in the "kube-public" namespace')
    api_apply(
        client,
        "",
        "configmaps",
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "cluster-info", "namespace": "kube-public"},
            "data": {"kubeconfig": _cluster_info_kubeconfig(ca_pem, server_url(endpoint))},
        },
    )


def _print_init_success(plan: InitPlan, ca_pem: bytes, endpoint: str, certificate_key: str) -> None:
    token = plan.tokens[0]["token"]
    ca_hash = pki.spki_hash(pki.x509.load_pem_x509_certificate(ca_pem))
    join = f"kubeadm join {endpoint} --token {token} \\\n\t--discovery-token-ca-cert-hash {ca_hash} "
    say()
    say("Your Kubernetes control-plane has initialized successfully!")
    say()
    say("To start using your cluster, you need to run the following as a regular user:")
    say()
    say("  mkdir -p $HOME/.kube")
    say("  sudo cp -i /etc/kubernetes/admin.conf $HOME/.kube/config")
    say("  sudo chown $(id -u):$(id -g) $HOME/.kube/config")
    say()
    say("Alternatively, if you are the root user, you can run:")
    say()
    say("  export KUBECONFIG=/etc/kubernetes/admin.conf")
    say()
    say("You should now deploy a pod network to the cluster.")
    say('Run "kubectl apply -f [podnetwork].yaml" with one of the options listed at:')
    say("  https://kubernetes.io/docs/concepts/cluster-administration/addons/")
    say()
    if plan.cp_endpoint:
        if certificate_key:
            say("You can now join any number of control-plane nodes running the following command on each as root:")
            say()
            say(f"  {join}\\\n\t--control-plane --certificate-key {certificate_key}")
            say()
            say("Please note that the certificate-key gives access to cluster sensitive data, keep it secret!")
            say("As a safeguard, uploaded-certs will be deleted in two hours; If necessary, you can use")
            say('"kubeadm init phase upload-certs --upload-certs" to reload certs afterward.')
        else:
            say("You can now join any number of control-plane nodes by copying certificate authorities")
            say("and service account keys on each node and then running the following as root:")
            say()
            say(f"  {join}\\\n\t--control-plane ")
        say()
    say("Then you can join any number of worker nodes by running the following on each as root:")
    say()
    say(join)


# ---------------------------------------------------------------- join


JOIN_FLAGS = {
    "config": "str",
    "skip-phases": "list",
    "ignore-preflight-errors": "list",
    "token": "str",
    "discovery-token": "str",
    "tls-bootstrap-token": "str",
    "discovery-token-ca-cert-hash": "list",
    "discovery-token-unsafe-skip-ca-verification": "bool",
    "discovery-file": "str",
    "control-plane": "bool",
    "certificate-key": "str",
    "node-name": "str",
    "apiserver-advertise-address": "str",
    "apiserver-bind-port": "str",
    "cri-socket": "str",
    "dry-run": "bool",
    "patches": "str",
    "v": "str",
}
_JOIN_CONFIG_COMPATIBLE = {"config", "skip-phases", "ignore-preflight-errors", "dry-run", "v"}


def _join_config_from_flags(flags: Parsed) -> ConfigSet:
    if len(flags.args) > 1:
        raise DoubleError(f"accepts at most 1 arg(s), received {len(flags.args)}")
    token = flags.get("token")
    discovery_token = flags.get("discovery-token") or token
    join: dict = {"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "JoinConfiguration", "discovery": {}}
    if flags.get("discovery-file"):
        join["discovery"]["file"] = {"kubeConfigPath": flags.get("discovery-file")}
    else:
        if not flags.args:
            raise DoubleError('discovery: Invalid value: "": bootstrapToken or file must be set')
        join["discovery"]["bootstrapToken"] = {
            "token": discovery_token or "",
            "apiServerEndpoint": flags.args[0],
            "caCertHashes": flags.get("discovery-token-ca-cert-hash") or [],
            "unsafeSkipCAVerification": bool(flags.get("discovery-token-unsafe-skip-ca-verification")),
        }
    tls_token = flags.get("tls-bootstrap-token") or token
    if tls_token:
        join["discovery"]["tlsBootstrapToken"] = tls_token
    registration = {k: flags.get(f) for k, f in (("name", "node-name"), ("criSocket", "cri-socket")) if flags.get(f)}
    if registration:
        join["nodeRegistration"] = registration
    if flags.get("control-plane"):
        control_plane: dict = {}
        endpoint = {}
        if flags.get("apiserver-advertise-address"):
            endpoint["advertiseAddress"] = flags.get("apiserver-advertise-address")
        if flags.get("apiserver-bind-port"):
            endpoint["bindPort"] = int(str(flags.get("apiserver-bind-port")))
        if endpoint:
            control_plane["localAPIEndpoint"] = endpoint
        if flags.get("certificate-key"):
            control_plane["certificateKey"] = flags.get("certificate-key")
        join["controlPlane"] = control_plane
    return parse_config(yaml.safe_dump(join))


def _fetch_cluster_info(client: Client, token_id: str, timeout: float) -> dict:
    """kubeadm's getClusterInfo: retry until the JWS for our token shows up or the discovery timeout passes."""
    deadline = time.monotonic() + timeout
    while True:
        last_error = None
        try:
            info = client.get("/api/v1/namespaces/kube-public/configmaps/cluster-info")
            if f"jws-kubeconfig-{token_id}" in (info.get("data") or {}):  # type: ignore[union-attr]
                return info  # type: ignore[return-value]
            last_error = None
            klog(
                "I",
                f'[discovery] The cluster-info ConfigMap does not yet contain a JWS signature for token ID "{token_id}", will try again',
                "token.go:221",
            )
        except DoubleError as exc:
            last_error = exc
            klog("I", f"[discovery] Failed to request cluster-info, will try again: {exc}", "token.go:215")
        if time.monotonic() >= deadline:
            if last_error is not None:
                raise last_error
            return info  # type: ignore[possibly-undefined]
        time.sleep(min(DISCOVERY_RETRY_INTERVAL, max(0.0, deadline - time.monotonic())) or 0.05)


def token_discovery(discovery: dict, timeout: float) -> tuple[bytes, str, str]:
    """Discover and authenticate the cluster CA exactly as kubeadm's token discovery does.

    Returns (CA PEM, API server URL from cluster-info, cluster name).
    """
    bootstrap = discovery["bootstrapToken"]
    token_id, token_secret_value = TOKEN_RE.match(bootstrap["token"]).groups()  # type: ignore[union-attr]
    endpoint = bootstrap["apiServerEndpoint"]
    insecure = Client(Connection(server=server_url(endpoint), insecure=True))
    info = _fetch_cluster_info(insecure, token_id, timeout)
    data = info.get("data") or {}
    kubeconfig_text = data.get("kubeconfig", "")
    if not kubeconfig_text:
        raise DoubleError(
            "there is no kubeconfig key in the cluster-info ConfigMap. This API Server isn't set up for "
            "token bootstrapping, can't connect"
        )
    signature = data.get(f"jws-kubeconfig-{token_id}", "")
    if not signature:
        raise DoubleError(
            f'token id "{token_id}" is invalid for this cluster or it has expired. Use "kubeadm token '
            'create" on the control-plane node to create a new valid token'
        )
    if not pki.detached_jws_valid(signature, kubeconfig_text, token_id, token_secret_value):
        raise DoubleError("failed to verify JWS signature of received cluster info object, can't trust this API server")
    document = yaml.safe_load(kubeconfig_text) or {}
    clusters = document.get("clusters") or []
    if len(clusters) != 1:
        raise DoubleError("expected exactly one cluster in the cluster-info kubeconfig")
    cluster = clusters[0].get("cluster") or {}
    ca_pem = base64.b64decode(cluster.get("certificate-authority-data", ""))
    pins = bootstrap.get("caCertHashes") or []
    if pins:
        try:
            ca_certs = [pki.x509.load_pem_x509_certificate(ca_pem)]
        except ValueError:
            raise DoubleError("failed to parse the cluster CA in the cluster-info ConfigMap") from None
        hashes = [pki.spki_hash(cert) for cert in ca_certs]
        if not any(h.lower() == pin.lower() for h in hashes for pin in pins):
            raise DoubleError(
                f"cluster CA found in cluster-info ConfigMap is invalid: none of the public keys "
                f'"{":".join(hashes)}" are pinned'
            )
        secure = Client(Connection(server=server_url(endpoint), ca_pem=ca_pem))
        second = _fetch_cluster_info(secure, token_id, timeout)
        if (second.get("data") or {}).get("kubeconfig") != kubeconfig_text:
            raise DoubleError(
                "the second kubeconfig from the cluster-info ConfigMap (using validated TLS) was "
                "different from the first"
            )
    return ca_pem, cluster.get("server", server_url(endpoint)), "kubernetes"


def run_join(flags: Parsed) -> int:
    if flags.get("config"):
        mixed = sorted(name for name in flags.given if name not in _JOIN_CONFIG_COMPATIBLE)
        if mixed or flags.args:
            raise DoubleError(f"can not mix '--config' with arguments [{' '.join(mixed + list(flags.args))}]")
        config = load_config(str(flags.get("config")))
    else:
        config = _join_config_from_flags(flags)
    for warning in config.warnings:
        klog("W", warning)
    validate(config)
    join = config.get("JoinConfiguration")
    if not join:
        raise DoubleError("no JoinConfiguration found in the configuration file")
    version = config.version("JoinConfiguration")
    registration = join.get("nodeRegistration") or {}
    node_name = registration.get("name") or host_name()
    control_plane = join.get("controlPlane")
    is_cp = control_plane is not None
    skip = set(join.get("skipPhases") or []) | set(flags.get("skip-phases") or [])  # type: ignore[arg-type]
    check_phases(skip, JOIN_PHASES)
    ignore = set(registration.get("ignorePreflightErrors") or []) | set(flags.get("ignore-preflight-errors") or [])  # type: ignore[arg-type]
    discovery = join.get("discovery") or {}
    timeouts = join.get("timeouts") or {}
    discovery_timeout = parse_duration(
        (timeouts.get("discovery") if version == "v1beta4" else discovery.get("timeout")) or "5m0s"
    )
    ca_cert_path = join.get("caCertPath") or f"{DEFAULT_PKI_DIR}/ca.crt"
    kubelet_args = args_map(registration.get("kubeletExtraArgs"))
    taints = registration.get("taints")
    if taints is None:
        taints = [{"key": CONTROL_PLANE_LABEL, "effect": "NoSchedule"}] if is_cp else []

    say("[preflight] Running pre-flight checks")
    if not skipped("preflight", skip):
        checks: list[tuple[str, str, bool]] = []
        for path in (f"{KUBERNETES_DIR}/kubelet.conf", f"{KUBERNETES_DIR}/bootstrap-kubelet.conf"):
            if host_path(path).exists():
                checks.append((check_name(path), f"{path} already exists", True))
        if not is_cp and host_path(ca_cert_path).exists():
            checks.append((check_name(ca_cert_path), f"{ca_cert_path} already exists", True))
        if is_cp:
            for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd"):
                path = f"{MANIFESTS_DIR}/{name}.yaml"
                if host_path(path).exists():
                    checks.append((check_name(path), f"{path} already exists", True))
        try:
            run_preflight(checks, ignore)
        except PreflightError as exc:
            raise PhaseError("preflight", str(exc)) from None

    # Discovery (part of preflight in kubeadm).
    if discovery.get("file"):
        try:
            _unused, discovered = load_kubeconfig(discovery["file"]["kubeConfigPath"])
        except DoubleError as exc:
            raise PhaseError("preflight", f"couldn't validate the identity of the API Server: {exc}") from None
        ca_pem, server = discovered.ca_pem or b"", discovered.server
    else:
        try:
            ca_pem, server, _unused = token_discovery(discovery, discovery_timeout)
        except DoubleError as exc:
            raise PhaseError("preflight", f"couldn't validate the identity of the API Server: {exc}") from None
    tls_token = discovery.get("tlsBootstrapToken") or (discovery.get("bootstrapToken") or {}).get("token", "")
    bootstrap_conn = Connection(server=server, ca_pem=ca_pem, token=tls_token)
    bootstrap = Client(bootstrap_conn)
    say("[preflight] Reading configuration from the cluster...")
    say("[preflight] FYI: You can look at this config file with 'kubectl -n kube-system get cm kubeadm-config -o yaml'")
    try:
        kubeadm_cm = bootstrap.get("/api/v1/namespaces/kube-system/configmaps/kubeadm-config")
    except ApiStatusError as exc:
        raise PhaseError(
            "preflight", f"unable to fetch the kubeadm-config ConfigMap: failed to get config map: {exc}"
        ) from None
    except DoubleError as exc:
        raise PhaseError(
            "preflight", f"unable to fetch the kubeadm-config ConfigMap: failed to get config map: {exc}"
        ) from None
    cluster = yaml.safe_load(kubeadm_cm["data"]["ClusterConfiguration"]) or {}  # type: ignore[index]
    pki_dir = cluster.get("certificatesDir") or DEFAULT_PKI_DIR
    cluster_name = cluster.get("clusterName") or "kubernetes"
    algorithm = cluster.get("encryptionAlgorithm") or "RSA-2048"
    cp_endpoint = cluster.get("controlPlaneEndpoint") or ""

    advertise = ""
    port = 6443
    if is_cp:
        local = (control_plane or {}).get("localAPIEndpoint") or {}
        advertise = local.get("advertiseAddress") or default_ip(split_host_port(bootstrap_conn.host_port)[0])
        port = int(local.get("bindPort") or 6443)
        problems = []
        if not cp_endpoint:
            problems.append(
                "unable to add a new control plane instance to a cluster that doesn't have a stable controlPlaneEndpoint address"
            )
        certificate_key = str(flags.get("certificate-key") or (control_plane or {}).get("certificateKey") or "")
        download = not skipped("control-plane-prepare/download-certs", skip) and certificate_key
        if not download:
            problems += shared_certificate_errors(pki_dir)
        if problems:
            body = problems[0] if len(problems) == 1 else "[" + ", ".join(problems) + "]"
            raise PhaseError(
                "preflight",
                "\nOne or more conditions for hosting a new control plane instance is not "
                f"satisfied.\n\n{body}\n\nPlease ensure that:\n* The cluster has a stable "
                "controlPlaneEndpoint address.\n* The certificates that must be shared among control "
                "plane instances are provided.\n",
            )
        if download:
            _download_certs(bootstrap, pki_dir, certificate_key)
        local_ca = pki.load_cert(f"{pki_dir}/ca.crt")
        if pki.cert_pem(local_ca).strip() != ca_pem.strip():
            raise PhaseError(
                "control-plane-prepare",
                f"error creating PKI assets: the CA certificate {pki_dir}/ca.crt "
                "does not match the cluster CA found in the cluster-info ConfigMap",
            )
        if not skipped("control-plane-prepare/certs", skip):
            say("[control-plane-prepare] Generating the certificates")
            plan = PkiPlan(
                pki_dir=pki_dir,
                node_name=node_name,
                advertise=advertise,
                algorithm=algorithm,
                dns_domain=(cluster.get("networking") or {}).get("dnsDomain") or "cluster.local",
                service_subnet=(cluster.get("networking") or {}).get("serviceSubnet") or "10.96.0.0/12",
                cp_endpoint_host=split_host_port(cp_endpoint)[0],
                cert_sans=list((cluster.get("apiServer") or {}).get("certSANs") or []),
                skip=skip,
                skip_prefix="control-plane-prepare/certs",
            )
            try:
                create_pki(plan, shared_only_existing=True)
            except DoubleError as exc:
                raise PhaseError("control-plane-prepare/certs", f"error creating PKI assets: {exc}") from None
        if not skipped("control-plane-prepare/kubeconfig", skip):
            say("[control-plane-prepare] Generating kubeconfig files")
            say(f'[kubeconfig] Using kubeconfig folder "{KUBERNETES_DIR}"')
            local_server = server_url(f"{url_host(advertise)}:{port}")
            for name, srv, user, orgs in (
                ("admin.conf", server_url(cp_endpoint), "kubernetes-admin", ["kubeadm:cluster-admins"]),
                ("controller-manager.conf", local_server, "system:kube-controller-manager", []),
                ("scheduler.conf", local_server, "system:kube-scheduler", []),
            ):
                ensure_kubeconfig(name, client_kubeconfig(pki_dir, cluster_name, srv, user, orgs, algorithm), ca_pem)
        write_manifests(
            cluster,
            advertise,
            port,
            node_name,
            pki_dir,
            skip,
            "control-plane-prepare/",
            cluster.get("kubernetesVersion") or KUBERNETES_VERSION,
        )

    if not skipped("kubelet-start", skip):
        _join_kubelet_start(
            bootstrap,
            bootstrap_conn,
            cluster_name,
            node_name,
            registration,
            kubelet_args,
            advertise,
            is_cp,
            ca_pem,
            join.get("caCertPath") or f"{DEFAULT_PKI_DIR}/ca.crt",
        )

    if is_cp:
        if not skipped("control-plane-join/etcd", skip):
            say("[control-plane-join] Using etcd pod spec to get etcd version")
            say("[etcd] Announced new etcd member joining to the existing etcd cluster")
            say('[etcd] Creating static Pod manifest for "etcd"')
        if not skipped("control-plane-join/mark-control-plane", skip):
            admin = Client(load_kubeconfig(host_path(f"{KUBERNETES_DIR}/admin.conf"))[1])
            _mark_control_plane(admin, node_name, taints)
        say()
        say("This node has joined the cluster and a new control plane instance was created:")
        say()
        say("* Certificate signing request was sent to apiserver and approval was received.")
        say("* The Kubelet was informed of the new secure connection details.")
        say("* Control plane label and taint were applied to the new node.")
        say("* The Kubernetes control plane instances scaled up.")
        say("* A new etcd member was added to the local/stacked etcd cluster.")
        say()
        say("To start administering your cluster from this node, you need to run the following as a regular user:")
        say()
        say("\tmkdir -p $HOME/.kube")
        say("\tsudo cp -i /etc/kubernetes/admin.conf $HOME/.kube/config")
        say("\tsudo chown $(id -u):$(id -g) $HOME/.kube/config")
        say()
        say("Run 'kubectl get nodes' to see this node join the cluster.")
        say()
    else:
        say()
        say("This node has joined the cluster:")
        say("* Certificate signing request was sent to apiserver and a response was received.")
        say("* The Kubelet was informed of the new secure connection details.")
        say()
        say("Run 'kubectl get nodes' on the control-plane to see this node join the cluster.")
        say()
    return 0


def _download_certs(bootstrap: Client, pki_dir: str, certificate_key: str) -> None:
    say('[download-certs] Downloading the certificates in Secret "kubeadm-certs" in the "kube-system" Namespace')
    try:
        secret = bootstrap.get("/api/v1/namespaces/kube-system/secrets/kubeadm-certs")
    except DoubleError as exc:
        raise PhaseError(
            "control-plane-prepare/download-certs", f"error downloading certs: error downloading the secret: {exc}"
        ) from None
    data = secret.get("data") or {}  # type: ignore[union-attr]
    try:
        for name in SHARED_CERTS:
            key = name.replace("/", "-")
            if key in data:
                plain = pki.decrypt_with_certificate_key(certificate_key, base64.b64decode(data[key]))
                atomic_write(host_path(f"{pki_dir}/{name}"), plain, 0o600 if name.endswith(".key") else 0o644)
    except DoubleError as exc:
        raise PhaseError(
            "control-plane-prepare/download-certs",
            f"error downloading certs: error decoding secret data with provided key: {exc}",
        ) from None
    say('[download-certs] Saving the certificates to the folder: "%s"' % pki_dir)


def _join_kubelet_start(
    bootstrap: Client,
    conn: Connection,
    cluster_name: str,
    node_name: str,
    registration: dict,
    kubelet_args: dict[str, str],
    advertise: str,
    is_cp: bool,
    ca_pem: bytes,
    ca_cert_path: str,
) -> None:
    try:
        existing = api_get(bootstrap, "", "nodes", "", node_name)
    except ApiStatusError as exc:
        raise PhaseError("kubelet-start", f'cannot get Node "{node_name}": {exc}') from None
    if existing is not None:
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in existing.get("status", {}).get("conditions", [])
        )
        if ready:
            raise PhaseError(
                "kubelet-start",
                f'a Node with name "{node_name}" and status "Ready" already exists in the '
                "cluster. You must delete the existing Node or change the name of this new joining Node",
            )
    bootstrap_doc = pki.kubeconfig(cluster_name, conn.server, ca_pem, "tls-bootstrap-token-user", token=conn.token)
    write_yaml(f"{KUBERNETES_DIR}/bootstrap-kubelet.conf", bootstrap_doc)
    if not host_path(ca_cert_path).exists():
        atomic_write(host_path(ca_cert_path), ca_pem, 0o644)
    try:
        config_cm = bootstrap.get("/api/v1/namespaces/kube-system/configmaps/kubelet-config")
        kubelet_config = yaml.safe_load(config_cm["data"]["kubelet"])  # type: ignore[index]
    except DoubleError as exc:
        raise PhaseError(
            "kubelet-start",
            f'error downloading kubelet configuration from the ConfigMap "kubelet-config" in the cluster: {exc}',
        ) from None
    write_kubelet_files(kubelet_config, registration.get("criSocket") or DEFAULT_CRI_SOCKET, kubelet_args)
    say("[kubelet-start] Starting the kubelet")
    say("[kubelet-check] Waiting for a healthy kubelet at http://127.0.0.1:10248/healthz. This can take up to 4m0s")
    say("[kubelet-check] The kubelet is healthy after 501.3ms")
    say("[kubelet-start] Waiting for the kubelet to perform the TLS Bootstrap")
    # What the kubelet would do: reuse a valid client certificate it already has, else TLS bootstrap with the
    # token; then register its Node with its own certificate.
    if not _usable_kubelet_client_cert(ca_pem, node_name):
        _kubelet_tls_bootstrap(bootstrap, node_name)
    kubelet_doc = pki.kubeconfig(
        cluster_name, conn.server, ca_pem, "default-auth", client_cert_file=KUBELET_CLIENT_CURRENT
    )
    kubelet_doc["contexts"][0]["name"] = "default-context"
    kubelet_doc["current-context"] = "default-context"
    write_yaml(f"{KUBERNETES_DIR}/kubelet.conf", kubelet_doc)
    host_path(f"{KUBERNETES_DIR}/bootstrap-kubelet.conf").unlink(missing_ok=True)
    kubelet = Client(load_kubeconfig(host_path(f"{KUBERNETES_DIR}/kubelet.conf"))[1])
    ip = kubelet_args.get("node-ip") or advertise or default_ip(kubelet.host)
    node = node_object(
        node_name, ip, False, [] if is_cp else (registration.get("taints") or []), node_labels_from_args(kubelet_args)
    )
    try:
        if existing is None:
            kubelet.request("POST", "/api/v1/nodes", node)
        else:
            node["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
            kubelet.request("PUT", f"/api/v1/nodes/{node_name}", node)
    except DoubleError as exc:
        raise PhaseError("kubelet-start", f"the kubelet failed to register node {node_name!r}: {exc}") from None


def _usable_kubelet_client_cert(ca_pem: bytes, node_name: str) -> bool:
    """The kubelet skips TLS bootstrap when its cert dir holds a valid client certificate for this node."""
    try:
        data = host_path(KUBELET_CLIENT_CURRENT).read_bytes()
        cert = pki.x509.load_pem_x509_certificate(data)
        key = pki.serialization.load_pem_private_key(data, password=None)
        cert.verify_directly_issued_by(pki.x509.load_pem_x509_certificate(ca_pem))
    except (OSError, ValueError, TypeError, InvalidSignature):
        return False
    names = cert.subject.get_attributes_for_oid(pki.NameOID.COMMON_NAME)
    moment = datetime.datetime.now(datetime.timezone.utc)
    return (
        bool(names)
        and names[0].value == f"system:node:{node_name}"
        and cert.not_valid_before_utc <= moment < cert.not_valid_after_utc
        and pki.key_matches(cert, key)  # type: ignore[arg-type]
    )


def _kubelet_tls_bootstrap(bootstrap: Client, node_name: str) -> None:
    key = pki.generate_key("ECDSA-P256")
    csr = {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"generateName": "node-csr-"},
        "spec": {
            "request": base64.b64encode(pki.csr_pem(f"system:node:{node_name}", ["system:nodes"], key)).decode(),
            "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
            "usages": ["digital signature", "client auth"],
        },
    }
    try:
        created = bootstrap.request("POST", "/apis/certificates.k8s.io/v1/certificatesigningrequests", csr)
    except DoubleError as exc:
        host_path(f"{KUBERNETES_DIR}/bootstrap-kubelet.conf").unlink(missing_ok=True)
        raise PhaseError("kubelet-start", f"the kubelet TLS bootstrap failed: {exc}") from None
    certificate = (created.get("status") or {}).get("certificate")  # type: ignore[union-attr]
    if not certificate:
        raise PhaseError(
            "kubelet-start", "the kubelet TLS bootstrap failed: the certificate signing request was not approved"
        )
    write_kubelet_client_pem(base64.b64decode(certificate), pki.key_pem(key))


# ---------------------------------------------------------------- token


def _admin_client(flags: Parsed) -> Client:
    path = flags.get("kubeconfig")
    target = Path(str(path)) if path else host_path(f"{KUBERNETES_DIR}/admin.conf")
    try:
        return Client(load_kubeconfig(target)[1])
    except DoubleError as exc:
        raise DoubleError(f"failed to load admin kubeconfig: {exc}") from None


def _token_objects(client: Client) -> list[dict]:
    listing = client.get("/api/v1/namespaces/kube-system/secrets?fieldSelector=type%3Dbootstrap.kubernetes.io%2Ftoken")
    result = []
    for secret in listing.get("items", []):  # type: ignore[union-attr]
        data = {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
        if not secret["metadata"]["name"].startswith("bootstrap-token-"):
            continue
        result.append(data)
    return result


def run_token(args: list[str]) -> int:
    if not args or args[0] in ("-h", "--help"):
        raise UsageError("This command manages bootstrap tokens. Use one of: create, delete, generate, list")
    sub, rest = args[0], args[1:]
    common = {"kubeconfig": "str", "dry-run": "bool", "v": "str"}
    if sub == "generate":
        parse(rest, common)
        say(generate_token())
        return 0
    if sub == "create":
        flags = parse(
            rest,
            {
                **common,
                "ttl": "str",
                "description": "str",
                "usages": "list",
                "groups": "list",
                "print-join-command": "bool",
                "certificate-key": "str",
                "config": "str",
            },
        )
        if len(flags.args) > 1:
            raise UsageError(f"accepts at most 1 arg(s), received {len(flags.args)}")
        token = flags.args[0] if flags.args else generate_token()
        errors: list[str] = []
        if not TOKEN_RE.match(token):
            raise DoubleError(f'the bootstrap token "{token}" was not of the form "[a-z0-9]{{6}}.[a-z0-9]{{16}}"')
        try:
            ttl = parse_duration(str(flags.get("ttl", "24h0m0s")))
        except ValueError as exc:
            raise UsageError(f'invalid argument "{flags.get("ttl")}" for "--ttl" flag: {exc}') from None
        usages = list(flags.get("usages") or ["signing", "authentication"])  # type: ignore[arg-type]
        for usage in usages:
            if usage not in ("signing", "authentication"):
                errors.append(
                    f"unknown bootstrap token usage(s): [{usage}], valid usage options: [signing authentication]"
                )
        groups = list(flags.get("groups") or [DEFAULT_NODE_GROUP])  # type: ignore[arg-type]
        for group in groups:
            if not BOOTSTRAP_GROUP_RE.match(group):
                errors.append(f'group "{group}" is invalid (must match {BOOTSTRAP_GROUP_RE.pattern})')
        if groups and "authentication" not in usages:
            errors.append('token groups cannot be specified unless --usages includes "authentication"')
        if errors:
            raise DoubleError(errors[0])
        client = _admin_client(flags)
        secret = token_secret(token, str(flags.get("description") or ""), ttl, usages, groups)
        try:
            client.request("POST", "/api/v1/namespaces/kube-system/secrets", secret)
        except ApiStatusError as exc:
            if exc.code == 409:
                raise DoubleError(f'a token with id "{token.split(".", maxsplit=1)[0]}" already exists') from None
            raise
        if flags.get("print-join-command"):
            ca_pem = client.conn.ca_pem or b""
            ca_hash = pki.spki_hash(pki.x509.load_pem_x509_certificate(ca_pem))
            line = f"kubeadm join {client.conn.host_port} --token {token} --discovery-token-ca-cert-hash {ca_hash} "
            if flags.get("certificate-key"):
                line += f"--control-plane --certificate-key {flags.get('certificate-key')}"
            say(line)
        else:
            say(token)
        return 0
    if sub == "list":
        flags = parse(
            rest,
            {**common, "output": "str", "allow-missing-template-keys": "bool", "show-managed-fields": "bool"},
            {"o": "output"},
        )
        output = str(flags.get("output") or "text")
        if output not in ("text", "json", "yaml", "go-template", "jsonpath"):
            raise DoubleError(
                f'unable to match a printer suitable for the output format "{output}", allowed formats are: '
                "go-template,go-template-file,json,jsonpath,jsonpath-as-json,jsonpath-file,text,yaml"
            )
        client = _admin_client(flags)
        tokens = _token_objects(client)
        moment = datetime.datetime.now(datetime.timezone.utc)
        if output == "text":
            rows = [["TOKEN", "TTL", "EXPIRES", "USAGES", "DESCRIPTION", "EXTRA GROUPS"]]
            for data in tokens:
                expiration = data.get("expiration")
                ttl_text, expires_text = "<forever>", "<never>"
                if expiration:
                    ttl_text = short_human_duration((parse_rfc3339(expiration) - moment).total_seconds())
                    expires_text = expiration
                usages = sorted(
                    k[len("usage-bootstrap-") :]
                    for k, v in data.items()
                    if k.startswith("usage-bootstrap-") and v == "true"
                )
                rows.append(
                    [
                        f"{data.get('token-id')}.{data.get('token-secret')}",
                        ttl_text,
                        expires_text,
                        ",".join(usages) or "<none>",
                        data.get("description") or "<none>",
                        data.get("auth-extra-groups") or "",
                    ]
                )
            sys.stdout.write(tabulate(rows, minwidth=10))
            return 0
        for data in tokens:
            usages = sorted(
                k[len("usage-bootstrap-") :]
                for k, v in data.items()
                if k.startswith("usage-bootstrap-") and v == "true"
            )
            document: dict = {
                "kind": "BootstrapToken",
                "apiVersion": "output.kubeadm.k8s.io/v1alpha3",
                "creationTimestamp": None,
                "token": f"{data.get('token-id')}.{data.get('token-secret')}",
            }
            if data.get("description"):
                document["description"] = data["description"]
            if data.get("expiration"):
                document["expires"] = data["expiration"]
            document["usages"] = usages
            if data.get("auth-extra-groups"):
                document["groups"] = data["auth-extra-groups"].split(",")
            if output == "json":
                say(json.dumps(document, indent=4))
            else:
                sys.stdout.write(yaml.safe_dump(document, default_flow_style=False, sort_keys=False))
        return 0
    if sub == "delete":
        flags = parse(rest, common)
        if not flags.args:
            raise DoubleError(
                'missing argument; \'token delete\' is missing token of form "[a-z0-9]{6}" or "[a-z0-9]{6}\\.[a-z0-9]{16}"'
            )
        client = _admin_client(flags)
        for value in flags.args:
            if re.fullmatch(r"[a-z0-9]{6}", value):
                token_id = value
            elif TOKEN_RE.match(value):
                token_id = value.split(".")[0]
            else:
                raise DoubleError(
                    'given token didn\'t match pattern "^(?P<id>[a-z0-9]{6})$" or "^([a-z0-9]{6})\\.([a-z0-9]{16})$"'
                )
            try:
                client.request("DELETE", f"/api/v1/namespaces/kube-system/secrets/bootstrap-token-{token_id}")
            except ApiStatusError as exc:
                raise DoubleError(f'failed to delete bootstrap token with id "{token_id}": {exc}') from None
            say(f'bootstrap token "{token_id}" deleted')
        return 0
    raise UsageError(f'unknown command "{sub}" for "kubeadm token"')


# ---------------------------------------------------------------- reset


def run_reset(flags: Parsed) -> int:
    if not flags.get("force"):
        sys.stdout.write(
            "W1121 [reset] The kubeadm reset process will revert any changes made to this host by 'kubeadm init' or 'kubeadm join'.\n"
            "[reset] Are you sure you want to proceed? [y/N]: "
        )
        sys.stdout.flush()
        answer = sys.stdin.readline().strip().lower()
        if answer not in ("y", "yes"):
            raise DoubleError("aborted reset operation")
    pki_dir = DEFAULT_PKI_DIR
    data_dir = "/var/lib/etcd"
    say("[reset] Reading configuration from the cluster...")
    say("[reset] FYI: You can look at this config file with 'kubectl -n kube-system get cm kubeadm-config -o yaml'")
    try:
        admin = _admin_client(flags)
        cm = admin.get("/api/v1/namespaces/kube-system/configmaps/kubeadm-config")
        cluster = yaml.safe_load(cm["data"]["ClusterConfiguration"]) or {}  # type: ignore[index]
        pki_dir = cluster.get("certificatesDir") or pki_dir
        data_dir = ((cluster.get("etcd") or {}).get("local") or {}).get("dataDir") or data_dir
    except (DoubleError, KeyError, TypeError) as exc:
        klog(
            "W",
            f"[reset] Unable to fetch the kubeadm-config ConfigMap from cluster: failed to get config map: {exc}",
            "reset.go:124",
        )
    say("[preflight] Running pre-flight checks")
    if stop_apiserver():
        say("[reset] Stopped the kube-apiserver double running on this node")
    state_dir = host_path(APISERVER_STATE_DIR)
    if state_dir.exists():
        shutil.rmtree(state_dir)
    if host_path(f"{MANIFESTS_DIR}/etcd.yaml").exists() or dir_not_empty(data_dir):
        _clear_dir(data_dir)
        say(f"[reset] Deleted contents of the etcd data directory: {data_dir}")
    else:
        say("[reset] No etcd config found. Assuming external etcd")
        say("[reset] Please, manually reset etcd to prevent further issues")
    say("[reset] Stopping the kubelet service")
    say(f'[reset] Unmounting mounted directories in "{KUBELET_DIR}"')
    directories = [MANIFESTS_DIR, KUBELET_DIR, pki_dir]
    for directory in directories:
        _clear_dir(directory)
    say(f"[reset] Deleting contents of directories: [{' '.join(directories)}]")
    files = [f"{KUBERNETES_DIR}/{name}" for name in KUBECONFIG_FILES]
    for path in files:
        host_path(path).unlink(missing_ok=True)
    say(f"[reset] Deleting files: [{' '.join(files)}]")
    if flags.get("cleanup-tmp-dir"):
        _clear_dir(f"{KUBERNETES_DIR}/tmp")
        shutil.rmtree(host_path(f"{KUBERNETES_DIR}/tmp"), ignore_errors=True)
    say()
    say("The reset process does not clean CNI configuration. To do so, you must remove /etc/cni/net.d")
    say()
    say("The reset process does not reset or clean up iptables rules or IPVS tables.")
    say('If you wish to reset iptables, you must do so manually by using the "iptables" command.')
    say()
    say("If your cluster was setup to utilize IPVS, run ipvsadm --clear (or similar)")
    say("to reset your system's IPVS tables.")
    say()
    say("The reset process does not clean your kubeconfig files and you must remove them manually.")
    say("Please, check the contents of the $HOME/.kube/config file.")
    return 0


def _clear_dir(path: str) -> None:
    target = host_path(path)
    if not target.is_dir():
        return
    for child in target.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


# ---------------------------------------------------------------- entry point


def run_version(args: list[str]) -> int:
    flags = parse(args, {"output": "str", "v": "str"}, {"o": "output"})
    output = flags.get("output") or ""
    info = version_info()
    if output == "short":
        say(info["gitVersion"])
    elif output == "json":
        say(json.dumps({"clientVersion": info}, indent=2))
    elif output == "yaml":
        sys.stdout.write(yaml.safe_dump({"clientVersion": info}, sort_keys=False))
    elif output == "":
        fields = ", ".join(f'{k[0].upper() + k[1:]}:"{v}"' for k, v in info.items())
        say(f"kubeadm version: &version.Info{{{fields}}}")
    else:
        raise DoubleError(f"invalid output format: {output}")
    return 0


def run_config(args: list[str]) -> int:
    if not args:
        raise UsageError('missing subcommand; "config" is not meant to be run on its own')
    if args[0] == "validate":
        flags = parse(args[1:], {"config": "str", "allow-experimental-api": "bool", "kubeconfig": "str", "v": "str"})
        if not flags.get("config"):
            raise DoubleError("the --config flag is mandatory")
        config = load_config(str(flags.get("config")))
        for warning in config.warnings:
            klog("W", warning)
        validate(config)
        say("ok")
        return 0
    if args[0] == "print" and args[1:2] in (["init-defaults"], ["join-defaults"]):
        kind = "InitConfiguration" if args[1] == "init-defaults" else "JoinConfiguration"
        documents: list[dict] = []
        if kind == "InitConfiguration":
            documents = [
                {
                    "apiVersion": "kubeadm.k8s.io/v1beta4",
                    "kind": kind,
                    "bootstrapTokens": [
                        {
                            "groups": [DEFAULT_NODE_GROUP],
                            "token": "abcdef.0123456789abcdef",
                            "ttl": "24h0m0s",
                            "usages": ["signing", "authentication"],
                        }
                    ],
                    "localAPIEndpoint": {"advertiseAddress": "1.2.3.4", "bindPort": 6443},
                    "nodeRegistration": {
                        "criSocket": DEFAULT_CRI_SOCKET,
                        "imagePullPolicy": "IfNotPresent",
                        "imagePullSerial": True,
                        "name": "node",
                        "taints": None,
                    },
                },
                {
                    "apiVersion": "kubeadm.k8s.io/v1beta4",
                    "kind": "ClusterConfiguration",
                    "certificatesDir": DEFAULT_PKI_DIR,
                    "clusterName": "kubernetes",
                    "encryptionAlgorithm": "RSA-2048",
                    "etcd": {"local": {"dataDir": "/var/lib/etcd"}},
                    "imageRepository": "registry.k8s.io",
                    "kubernetesVersion": "1.31.0",
                    "networking": {"dnsDomain": "cluster.local", "serviceSubnet": "10.96.0.0/12"},
                },
            ]
        else:
            documents = [
                {
                    "apiVersion": "kubeadm.k8s.io/v1beta4",
                    "kind": kind,
                    "caCertPath": f"{DEFAULT_PKI_DIR}/ca.crt",
                    "discovery": {
                        "bootstrapToken": {
                            "apiServerEndpoint": "kube-apiserver:6443",
                            "token": "abcdef.0123456789abcdef",
                            "unsafeSkipCAVerification": True,
                        },
                        "tlsBootstrapToken": "abcdef.0123456789abcdef",
                    },
                    "nodeRegistration": {
                        "criSocket": DEFAULT_CRI_SOCKET,
                        "imagePullPolicy": "IfNotPresent",
                        "imagePullSerial": True,
                        "name": "node",
                        "taints": None,
                    },
                }
            ]
        sys.stdout.write(yaml.safe_dump_all(documents, default_flow_style=False, sort_keys=False))
        return 0
    raise UsageError(f'unknown command "{args[0]}" for "kubeadm config"')


def run_init_phase(args: list[str]) -> int:
    if not args or args[0] != "upload-certs":
        raise UsageError(
            f'the kubeadm double implements only "kubeadm init phase upload-certs", got {" ".join(args) or "nothing"}'
        )
    flags = parse(
        args[1:],
        {
            "upload-certs": "bool",
            "certificate-key": "str",
            "config": "str",
            "kubeconfig": "str",
            "skip-certificate-key-print": "bool",
            "v": "str",
        },
    )
    if not flags.get("upload-certs"):
        say("[upload-certs] Skipping phase. Please see --upload-certs")
        return 0
    pki_dir = DEFAULT_PKI_DIR
    certificate_key = str(flags.get("certificate-key") or "")
    if flags.get("config"):
        config = load_config(str(flags.get("config")))
        validate(config)
        pki_dir = (config.get("ClusterConfiguration") or {}).get("certificatesDir") or pki_dir
        certificate_key = certificate_key or (config.get("InitConfiguration") or {}).get("certificateKey") or ""
    upload_certs(_admin_client(flags), pki_dir, certificate_key)
    return 0


def main(argv: list[str]) -> int:
    try:
        return _main(argv)
    except PhaseError as exc:
        print(f"error execution phase {exc.phase}: {exc}\n{STACK_HINT}", file=sys.stderr)
        return 1
    except UsageError as exc:
        print(f"{exc}\n{STACK_HINT}", file=sys.stderr)
        return 1
    except DoubleError as exc:
        print(f"{exc}\n{STACK_HINT}", file=sys.stderr)
        return 1


def _main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        say(
            "kubeadm (test double): easily bootstrap a secure Kubernetes cluster\n\n"
            "Available Commands:\n  config  init  join  reset  token  version"
        )
        return 0 if argv else 1
    command, rest = argv[0], argv[1:]
    if command == "version":
        return run_version(rest)
    if command == "config":
        return run_config(rest)
    if command == "init":
        if rest and rest[0] == "phase":
            return run_init_phase(rest[1:])
        return run_init(parse(rest, INIT_FLAGS))
    if command == "join":
        return run_join(parse(rest, JOIN_FLAGS))
    if command == "token":
        return run_token(rest)
    if command == "reset":
        return run_reset(
            parse(
                rest,
                {
                    "force": "bool",
                    "cleanup-tmp-dir": "bool",
                    "cri-socket": "str",
                    "ignore-preflight-errors": "list",
                    "kubeconfig": "str",
                    "cert-dir": "str",
                    "skip-phases": "list",
                    "config": "str",
                    "dry-run": "bool",
                    "v": "str",
                },
                {"f": "force"},
            )
        )
    raise UsageError(f'unknown command "{command}" for "kubeadm"')
