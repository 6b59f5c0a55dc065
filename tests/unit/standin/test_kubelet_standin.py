"""The kubelet stand-in on the host: command line, images, static pods (real etcd), credentials, crictl.

The API side (TLS bootstrap against a real controller-manager, Node, Lease, kubeadm) is proven on
lab nodes by tests/unit/lab/test_real_control_plane.py.
"""

from __future__ import annotations

import base64
import datetime
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

import kubelet_standin
from kubelet_standin import ENDPOINT, StandinError, api, kubelet, node, pods

DOUBLES = Path(__file__).resolve().parents[2] / "doubles"
LAB_CACHE = Path(os.environ.get("CK_LAB_CACHE") or "/var/cache/confidential-kubernetes-lab")
BIN = Path(os.environ.get("CK_KUBERNETES_BIN") or LAB_CACHE / "kubernetes/v1.20.2/bin")
needs_binaries = pytest.mark.skipif(
    not all((BIN / name).exists() for name in ("kubeadm", "etcd", "kube-apiserver")),
    reason=f"no Kubernetes v1.20.2 binaries in {BIN} (set CK_KUBERNETES_BIN)",
)


def tool(name: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "K8S_DOUBLES_PYTHON": sys.executable, "KUBELET_STANDIN_BIN_DIR": str(BIN)}
    return subprocess.run(
        [str(DOUBLES / "bin" / name), *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture
def state(monkeypatch):
    """An empty pod state directory; binaries from BIN; processes left by a failed test are killed."""
    monkeypatch.setenv("KUBELET_STANDIN_BIN_DIR", str(BIN))
    shutil.rmtree(pods.PODS, ignore_errors=True)
    yield pods.PODS
    for recorded in pods.read_states().values():
        for container in recorded["containers"]:
            pods.stop_container(container, 5)
    shutil.rmtree(pods.PODS, ignore_errors=True)


# ---- command line -------------------------------------------------------------------------


def test_the_real_kubelets_flag_forms_are_parsed():
    flags = kubelet.parse_flags(
        [
            "--config=/c.yaml",
            "--node-ip",
            "10.0.0.2",
            "--rotate-certificates",
            "-v",
            "2",
            "--cgroups-per-qos=false",
            "--register-with-taints=a=b:NoSchedule",
        ]
    )
    assert flags == {
        "config": "/c.yaml",
        "node-ip": "10.0.0.2",
        "rotate-certificates": "true",
        "v": "2",
        "cgroups-per-qos": "false",
        "register-with-taints": "a=b:NoSchedule",
    }


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--no-such-flag"], "unknown flag: --no-such-flag"),
        (["-x"], "unknown shorthand flag: 'x' in -x"),
        (["--cert-dir"], "flag needs an argument: --cert-dir"),
        (["run"], "unknown command: run"),
    ],
)
def test_unknown_flags_and_arguments_are_refused_with_exit_255(argv, message):
    done = tool("kubelet", *argv)
    assert done.returncode == 255
    assert done.stderr.strip().endswith(f"kubelet-standin] {message}")


@needs_binaries
def test_the_flag_list_is_the_real_kubelets():
    help_text = subprocess.run([str(BIN / "kubelet"), "--help"], capture_output=True, text=True, check=False).stdout
    real = set(re.findall(r"^\s+(?:-\w, )?--([a-z0-9-]+)", help_text, re.MULTILINE))
    assert real == set(kubelet.FLAGS)


@needs_binaries
def test_version_is_that_of_the_kubernetes_binaries_beside_it():
    done = tool("kubelet", "--version")
    assert (done.returncode, done.stdout) == (0, "Kubernetes v1.20.2\n")


def test_a_missing_kubelet_configuration_is_fatal(tmp_path):
    done = tool("kubelet", f"--config={tmp_path}/config.yaml")
    assert done.returncode == 255
    assert f"failed to load Kubelet config file {tmp_path}/config.yaml" in done.stderr


@pytest.mark.parametrize(
    "runtime_flags",
    [[], ["--container-runtime=remote", "--container-runtime-endpoint=/run/containerd/containerd.sock"]],
)
def test_a_runtime_other_than_the_standin_is_fatal(tmp_path, runtime_flags):
    config = tmp_path / "config.yaml"
    config.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n")
    done = tool("kubelet", f"--config={config}", *runtime_flags)
    assert done.returncode == 255
    assert f"serves only --container-runtime=remote --container-runtime-endpoint={ENDPOINT}" in done.stderr


def test_labels_and_taints_of_the_command_line():
    assert node.parse_labels("a=b,example.com/role=") == {"a": "b", "example.com/role": ""}
    assert node.parse_taints("a=b:NoSchedule,c:NoExecute") == [
        {"key": "a", "value": "b", "effect": "NoSchedule"},
        {"key": "c", "effect": "NoExecute"},
    ]
    for bad in ("novalue", "=b"):
        with pytest.raises(StandinError, match="--node-labels"):
            node.parse_labels(bad)
    for bad in ("a=b", "a=b:Sometimes"):
        with pytest.raises(StandinError, match="--register-with-taints"):
            node.parse_taints(bad)


# ---- crictl and images ------------------------------------------------------------------


@needs_binaries
@pytest.mark.parametrize(
    "image, present",
    [
        ("k8s.gcr.io/kube-apiserver:v1.20.2", True),
        ("registry.example:5000/k8s/kube-scheduler:v1.20.2", True),
        ("k8s.gcr.io/kube-apiserver:v1.20.3", False),
        ("k8s.gcr.io/etcd:3.4.13-0", True),
        ("k8s.gcr.io/etcd:3.5.0-0", False),
        ("k8s.gcr.io/pause:3.2", False),
        ("k8s.gcr.io/kube-proxy:v1.20.2", False),
        ("k8s.gcr.io/kube-apiserver", False),
        ("k8s.gcr.io/kube-apiserver@sha256:" + "0" * 64, False),
    ],
)
def test_an_image_is_present_only_as_a_local_binary_of_its_version(image, present):
    inspected = tool("crictl", "-r", ENDPOINT, "inspecti", image)
    pulled = tool("crictl", "-r", ENDPOINT, "pull", image)
    assert (inspected.returncode, pulled.returncode) == ((0, 0) if present else (1, 1))
    if present:
        assert yaml.safe_load(inspected.stdout)["status"]["repoTags"] == [image]
        assert pulled.stdout.startswith("Image is up to date for sha256:")
    else:
        assert "level=fatal" in inspected.stderr and "no such image" in inspected.stderr
        assert "pulling image" in pulled.stderr


def fake_binary(path: Path, output: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho '{output}'\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(
    ("placed_version", "image", "present"),
    [
        # The lab's relabelled 1.20.2 after `kubeadm upgrade`: the tag has a pre-release suffix.
        ("v1.20.3-lab.1", "k8s.gcr.io/kube-apiserver:v1.20.3-lab.1", True),
        ("v1.20.3-lab.1", "k8s.gcr.io/kube-apiserver:v1.20.3", False),
        # A binary under the tag's directory that reports another version is not that image.
        ("v1.20.2", "k8s.gcr.io/kube-apiserver:v1.20.3-lab.1", False),
    ],
)
def test_an_image_of_another_version_maps_to_the_binary_of_exactly_that_version(
    tmp_path, monkeypatch, placed_version, image, present
):
    beside = fake_binary(tmp_path / "bin/kube-apiserver", "Kubernetes v1.20.2")
    tag = image.rpartition(":")[2]
    other = fake_binary(tmp_path / f"versions/{tag}/bin/kube-apiserver", f"Kubernetes {placed_version}")
    monkeypatch.setenv("KUBELET_STANDIN_BIN_DIR", str(beside.parent))
    monkeypatch.setattr(kubelet_standin, "IMAGE_VERSIONS_DIR", tmp_path / "versions")
    if present:
        assert kubelet_standin.resolve_image(image) == ("kube-apiserver", other, placed_version.lstrip("v"))
    else:
        with pytest.raises(StandinError) as refused:
            kubelet_standin.resolve_image(image)
        assert f"{beside} is version 1.20.2" in str(refused.value)
        assert f"{other} is version {placed_version.lstrip('v')}" in str(refused.value)


def test_the_version_of_the_kubernetes_binaries_beside_it_keeps_a_pre_release_suffix(tmp_path, monkeypatch):
    fake_binary(tmp_path / "kubeadm", "v1.20.3-lab.1")
    monkeypatch.setenv("KUBELET_STANDIN_BIN_DIR", str(tmp_path))
    assert kubelet_standin.kubernetes_version() == "v1.20.3-lab.1"


@pytest.mark.parametrize("args", [["info"], ["-r", "unix:///run/containerd/containerd.sock", "info"]])
def test_crictl_fails_for_an_endpoint_that_is_not_the_standins(args):
    done = tool("crictl", *args)
    assert done.returncode == 1
    assert "connect: connect endpoint" in done.stderr


def test_crictl_info_reports_the_runtime_ready_and_no_pod_network():
    done = tool("crictl", "--runtime-endpoint", ENDPOINT.removeprefix("unix://"), "info")
    conditions = {c["type"]: c["status"] for c in yaml.safe_load(done.stdout)["status"]["conditions"]}
    assert done.returncode == 0 and conditions == {"RuntimeReady": True, "NetworkReady": False}


# ---- static pods ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def etcd_manifest(data_dir: Path, marker: str, image: str = "k8s.gcr.io/etcd:3.4.13-0") -> str:
    client, peer = free_port(), free_port()
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "etcd", "namespace": "kube-system"},
            "spec": {
                "terminationGracePeriodSeconds": 5,
                "containers": [
                    {
                        "name": "etcd",
                        "image": image,
                        "command": [
                            "etcd",
                            f"--data-dir={data_dir}",
                            f"--listen-client-urls=http://127.0.0.1:{client}",
                            f"--advertise-client-urls=http://127.0.0.1:{client}",
                            f"--listen-peer-urls=http://127.0.0.1:{peer}",
                        ],
                        "env": [{"name": "MARKER", "value": marker}],
                    }
                ],
            },
        }
    )


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().partition("=")[::2] for item in raw if item)


def pid_of(key: str = "kube-system_etcd") -> int:
    return pods.read_states()[key]["containers"][0]["pid"]


def etcd_pid(standin: pods.StaticPods | None = None, old: int | None = None) -> int:
    """The etcd container's pid once it has exec'd etcd (exe, then environ are set), is not `old`; syncs `standin`."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if standin is not None:
            standin.sync()
        container = pods.read_states().get("kube-system_etcd", {"containers": [{}]})["containers"][0]
        try:
            if (
                pods.running(container)
                and container["pid"] != old
                and os.readlink(f"/proc/{container['pid']}/exe") == str((BIN / "etcd").resolve())
                and "PATH" in environ(container["pid"])
            ):
                return container["pid"]
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"etcd did not (re)start: {pods.read_states()}")


@needs_binaries
def test_a_static_pod_runs_is_adopted_restarted_on_change_and_stopped_on_removal(state, tmp_path, monkeypatch):
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "etcd.yaml").write_text(etcd_manifest(tmp_path / "etcd", "one"))
    messages = []
    first = pods.StaticPods(manifests, "node-a", messages.append)
    first.sync()
    pid = etcd_pid()
    assert environ(pid) == {"PATH": pods.CONTAINER_PATH, "HOSTNAME": "node-a", "MARKER": "one"}
    assert pods.read_states()["kube-system_etcd"]["name"] == "etcd-node-a"
    assert tool("crictl", "-r", ENDPOINT, "pods", "-q").stdout.split() == [pods.read_states()["kube-system_etcd"]["id"]]

    # A new stand-in (after a kubelet restart) adopts the running process.
    second = pods.StaticPods(manifests, "node-a", messages.append)
    second.sync()
    assert pid_of() == pid and "adopting pod kube-system_etcd: containers etcd still run" in messages

    # An exited process comes back after the backoff.
    monkeypatch.setattr(pods, "BACKOFF_FIRST", 0.2)
    os.kill(pid, signal.SIGKILL)
    restarted = etcd_pid(second, old=pid)
    assert pods.read_states()["kube-system_etcd"]["containers"][0]["restarts"] == 1

    # A changed manifest restarts the pod with the new spec; a removed one stops it.
    (manifests / "etcd.yaml").write_text(etcd_manifest(tmp_path / "etcd", "two"))
    changed = etcd_pid(second, old=restarted)
    assert pods.start_time(restarted) is None and environ(changed)["MARKER"] == "two"
    (manifests / "etcd.yaml").unlink()
    second.sync()
    assert pods.start_time(changed) is None and pods.read_states() == {}


@needs_binaries
def test_crictl_stops_and_removes_a_static_pod(state, tmp_path):
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "etcd.yaml").write_text(etcd_manifest(tmp_path / "etcd", "one"))
    pods.StaticPods(manifests, "node-a", lambda message: None).sync()
    pod_id, pid = pods.read_states()["kube-system_etcd"]["id"], etcd_pid()
    refused = tool("crictl", "-r", ENDPOINT, "rmp", pod_id)
    assert refused.returncode == 1 and "is running, please stop it first" in refused.stderr
    assert tool("crictl", "-r", ENDPOINT, "stopp", pod_id).stdout == f"Stopped sandbox {pod_id}\n"
    assert pods.start_time(pid) is None
    assert tool("crictl", "-r", ENDPOINT, "rmp", pod_id[:12]).stdout == f"Removed sandbox {pod_id}\n"
    assert pods.read_states() == {}


@needs_binaries
def test_a_manifest_whose_image_has_no_local_binary_of_its_version_is_not_run(state, tmp_path):
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "etcd.yaml").write_text(etcd_manifest(tmp_path / "etcd", "one", image="k8s.gcr.io/etcd:3.5.0-0"))
    messages = []
    pods.StaticPods(manifests, "node-a", messages.append).sync()
    assert pods.read_states() == {}
    assert any("is version 3.4" in message for message in messages)


# ---- credentials ------------------------------------------------------------------------


def certificate(name: str, days: float) -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(days=2))
        .not_valid_after(now + datetime.timedelta(days=days))
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def kubeconfig(path: Path, user: dict) -> Path:
    ca, _ca_key = certificate("ca", 10)
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [
                    {
                        "name": "k",
                        "cluster": {
                            "server": "https://10.0.0.1:6443",
                            "certificate-authority-data": base64.b64encode(ca).decode(),
                        },
                    }
                ],
                "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
                "users": [{"name": "u", "user": user}],
            }
        )
    )
    return path


def test_a_valid_kubeconfig_is_used_and_seeds_the_certificate_store(tmp_path):
    cert, key = certificate("system:node:a", 10)
    conf = kubeconfig(
        tmp_path / "kubelet.conf",
        {"client-certificate-data": base64.b64encode(cert).decode(), "client-key-data": base64.b64encode(key).decode()},
    )
    before = conf.read_text()
    assert api.client_config(conf, None, tmp_path / "pki", True, lambda message: None) is None
    assert conf.read_text() == before
    current = tmp_path / "pki/kubelet-client-current.pem"
    assert current.is_symlink() and current.read_bytes() == cert.rstrip(b"\n") + b"\n" + key
    assert oct(current.stat().st_mode & 0o777) == "0o600"


def test_a_preplaced_client_certificate_gets_a_kubelet_conf_without_bootstrap(tmp_path):
    boot = kubeconfig(tmp_path / "bootstrap-kubelet.conf", {"token": "abcdef.0123456789abcdef"})
    (tmp_path / "pki").mkdir()
    (tmp_path / "pki/kubelet-client-current.pem").write_bytes(b"".join(certificate("system:node:a", 1)))
    conf = tmp_path / "kubelet.conf"
    assert api.client_config(conf, boot, tmp_path / "pki", True, lambda message: None) is None
    written = api.load_kubeconfig(conf)
    assert written.server == "https://10.0.0.1:6443" and written.token == ""
    assert written.ca_pem == api.load_kubeconfig(boot).ca_pem
    assert yaml.safe_load(conf.read_text())["users"][0]["user"] == {
        "client-certificate": str(tmp_path / "pki/kubelet-client-current.pem"),
        "client-key": str(tmp_path / "pki/kubelet-client-current.pem"),
    }


def test_an_expired_certificate_means_a_bootstrap_with_the_token(tmp_path):
    boot = kubeconfig(tmp_path / "bootstrap-kubelet.conf", {"token": "abcdef.0123456789abcdef"})
    (tmp_path / "pki").mkdir()
    (tmp_path / "pki/kubelet-client-current.pem").write_bytes(b"".join(certificate("system:node:a", -1)))
    found = api.client_config(tmp_path / "kubelet.conf", boot, tmp_path / "pki", True, lambda message: None)
    assert found is not None and found.token == "abcdef.0123456789abcdef"


def test_no_credentials_and_no_bootstrap_kubeconfig_is_fatal(tmp_path):
    with pytest.raises(api.ApiError, match="no valid client certificate and no --bootstrap-kubeconfig"):
        api.client_config(tmp_path / "kubelet.conf", None, tmp_path / "pki", True, lambda message: None)
    with pytest.raises(api.ApiError, match="unable to load kubeconfig"):
        api.client_config(
            tmp_path / "kubelet.conf", tmp_path / "missing.conf", tmp_path / "pki", True, lambda message: None
        )
