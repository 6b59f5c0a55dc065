"""kubeadm configuration rendering: the config API per kubeadm version, checked against upstream's field names, and
the v1beta2 rendering accepted by the real kubeadm 1.20 without a single unknown field."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile

import pytest
import yaml

from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import (
    InitOptions,
    JoinOptions,
    Kubeadm,
    config_api_version,
    render_init_config,
    join_with_token_file,
    render_join_config,
    skip_phases,
)

import control_plane

# The JSON field names of upstream's types (cmd/kubeadm/app/apis/kubeadm/<version>/types.go) that rendering may use.
_NODE_REGISTRATION = {"name", "criSocket", "taints", "kubeletExtraArgs", "ignorePreflightErrors"}
_COMPONENT = {"extraArgs", "extraVolumes"}
UPSTREAM_FIELDS = {
    "v1beta2": {
        "InitConfiguration": {
            "apiVersion",
            "kind",
            "bootstrapTokens",
            "nodeRegistration",
            "localAPIEndpoint",
            "certificateKey",
        },
        "ClusterConfiguration": {
            "apiVersion",
            "kind",
            "etcd",
            "networking",
            "kubernetesVersion",
            "controlPlaneEndpoint",
            "apiServer",
            "controllerManager",
            "scheduler",
            "dns",
            "certificatesDir",
            "imageRepository",
            "useHyperKubeImage",
            "featureGates",
            "clusterName",
        },
        "JoinConfiguration": {"apiVersion", "kind", "nodeRegistration", "caCertPath", "discovery", "controlPlane"},
        "nodeRegistration": _NODE_REGISTRATION,
        "apiServer": _COMPONENT | {"certSANs", "timeoutForControlPlane"},
    },
    "v1beta3": {
        "InitConfiguration": {
            "apiVersion",
            "kind",
            "bootstrapTokens",
            "nodeRegistration",
            "localAPIEndpoint",
            "certificateKey",
            "skipPhases",
            "patches",
        },
        "ClusterConfiguration": {
            "apiVersion",
            "kind",
            "etcd",
            "networking",
            "kubernetesVersion",
            "controlPlaneEndpoint",
            "apiServer",
            "controllerManager",
            "scheduler",
            "dns",
            "certificatesDir",
            "imageRepository",
            "featureGates",
            "clusterName",
        },
        "JoinConfiguration": {
            "apiVersion",
            "kind",
            "nodeRegistration",
            "caCertPath",
            "discovery",
            "controlPlane",
            "skipPhases",
            "patches",
        },
        "nodeRegistration": _NODE_REGISTRATION | {"imagePullPolicy"},
        "apiServer": _COMPONENT | {"certSANs", "timeoutForControlPlane"},
    },
    "v1beta4": {
        "InitConfiguration": {
            "apiVersion",
            "kind",
            "bootstrapTokens",
            "dryRun",
            "nodeRegistration",
            "localAPIEndpoint",
            "certificateKey",
            "skipPhases",
            "patches",
            "timeouts",
        },
        "ClusterConfiguration": {
            "apiVersion",
            "kind",
            "etcd",
            "networking",
            "kubernetesVersion",
            "controlPlaneEndpoint",
            "apiServer",
            "controllerManager",
            "scheduler",
            "dns",
            "proxy",
            "certificatesDir",
            "imageRepository",
            "featureGates",
            "clusterName",
            "encryptionAlgorithm",
            "certificateValidityPeriod",
            "caCertificateValidityPeriod",
        },
        "JoinConfiguration": {
            "apiVersion",
            "kind",
            "dryRun",
            "nodeRegistration",
            "caCertPath",
            "discovery",
            "controlPlane",
            "skipPhases",
            "patches",
            "timeouts",
        },
        "nodeRegistration": _NODE_REGISTRATION | {"imagePullPolicy", "imagePullSerial"},
        "apiServer": _COMPONENT | {"certSANs"},
    },
}
PIN = "sha256:" + "ab" * 32
TOKEN = "abcdef.0123456789abcdef"


def full_init_options() -> InitOptions:
    return InitOptions(
        node_name="cp-0",
        advertise_address="10.77.0.10",
        control_plane_endpoint="10.77.0.10:6443",
        kubernetes_version="v1.20.2",
        image_repository="registry.example.com/k8s",
        cluster_name="lab",
        cert_sans=["10.77.0.10"],
        pod_subnet="10.244.0.0/16",
        service_subnet="10.96.0.0/12",
        cri_socket="unix:///run/containerd/containerd.sock",
        api_server_extra_args={"audit-log-maxage": "7"},
        encryption_provider_config="/etc/kubernetes/encryption-config.yaml",
        controller_manager_extra_args={"v": "2"},
        scheduler_extra_args={"v": "2"},
        kubelet_extra_args={"node-ip": "10.77.0.10"},
        kubelet_config={"cgroupDriver": "systemd"},
        skip_phases=["addon/kube-proxy"],
    )


@pytest.mark.parametrize(
    "kubeadm_version, api_version",
    [
        ("v1.20.2", "v1beta2"),
        ("v1.21.14", "v1beta2"),
        ("v1.22.0", "v1beta3"),
        ("v1.30.9", "v1beta3"),
        ("v1.31.0", "v1beta4"),
        ("v1.34.2", "v1beta4"),
    ],
)
def test_config_api_follows_the_kubeadm_version(kubeadm_version, api_version):
    assert config_api_version(kubeadm_version) == api_version
    assert config_api_version(kubeadm_version, "v1beta3") == "v1beta3"


@pytest.mark.parametrize("api_version", sorted(UPSTREAM_FIELDS))
def test_rendering_uses_upstream_field_names_only(api_version):
    fields = UPSTREAM_FIELDS[api_version]
    init, cluster, kubelet = yaml.safe_load_all(render_init_config(full_init_options(), api_version))
    join = yaml.safe_load(
        render_join_config(
            JoinOptions(
                "10.77.0.10:6443",
                [PIN],
                node_name="cp-1",
                control_plane=True,
                advertise_address="10.77.0.11",
                kubelet_extra_args={"v": "2"},
                skip_phases=["preflight"],
            ),
            api_version,
            TOKEN,
        )
    )
    for document in (init, cluster, join):
        assert document["apiVersion"] == f"kubeadm.k8s.io/{api_version}"
        assert set(document) <= fields[document["kind"]], set(document) - fields[document["kind"]]
    assert set(init["nodeRegistration"]) <= fields["nodeRegistration"]
    assert set(join["nodeRegistration"]) <= fields["nodeRegistration"]
    assert set(cluster["apiServer"]) <= fields["apiServer"]
    assert kubelet["kind"] == "KubeletConfiguration" and kubelet["cgroupDriver"] == "systemd"
    assert cluster["imageRepository"] == "registry.example.com/k8s"
    assert join["discovery"]["bootstrapToken"] == {
        "apiServerEndpoint": "10.77.0.10:6443",
        "token": TOKEN,
        "caCertHashes": [PIN],
    }
    flag = "encryption-provider-config"
    if api_version == "v1beta4":
        assert cluster["apiServer"]["extraArgs"] == [
            {"name": "audit-log-maxage", "value": "7"},
            {"name": flag, "value": "/etc/kubernetes/encryption-config.yaml"},
        ]
    else:
        assert cluster["apiServer"]["extraArgs"] == {
            "audit-log-maxage": "7",
            flag: "/etc/kubernetes/encryption-config.yaml",
        }


def test_phases_to_skip_are_flags_before_v1beta3():
    assert skip_phases("v1beta2", ["addon/kube-proxy", "preflight"]) == (
        [],
        ["--skip-phases=addon/kube-proxy,preflight"],
    )
    assert skip_phases("v1beta3", ["addon/kube-proxy"]) == (["addon/kube-proxy"], [])
    assert skip_phases("v1beta2", []) == ([], [])
    join = yaml.safe_load(
        render_join_config(JoinOptions("10.77.0.10:6443", [PIN], control_plane=True), "v1beta3", TOKEN)
    )
    assert join["skipPhases"] == ["control-plane-prepare/download-certs"]


def test_real_kubeadm_1_20_reads_the_rendering_without_an_unknown_field(tmp_path):
    if control_plane.missing_binaries():
        pytest.skip("the real Kubernetes binaries are not built (tests/lab/lab kubernetes)")
    kubeadm = str(control_plane.binaries_dir() / "kubeadm")
    version = subprocess.run([kubeadm, "version", "-o", "short"], capture_output=True, text=True, check=True).stdout
    api_version = config_api_version(version)
    assert api_version == "v1beta2"
    config = tmp_path / "init.yaml"
    config.write_text(render_init_config(full_init_options(), api_version))
    loaded = subprocess.run(
        [kubeadm, "config", "images", "list", "--config", str(config)], capture_output=True, text=True, check=False
    )
    assert loaded.returncode == 0, loaded.stderr
    assert "unknown field" not in loaded.stderr and "strict.go" not in loaded.stderr, loaded.stderr
    # kubeadm takes the control plane's images from the site registry (imageRepository).
    assert "registry.example.com/k8s/kube-apiserver:v1.20.2" in loaded.stdout.split()
    # The same documents as v1beta3, which kubeadm 1.20 does not know, are refused.
    config.write_text(render_init_config(full_init_options(), "v1beta3"))
    refused = subprocess.run(
        [kubeadm, "config", "images", "list", "--config", str(config)], capture_output=True, text=True, check=False
    )
    assert refused.returncode != 0 and 'is registered for version "kubeadm.k8s.io/v1beta3"' in refused.stderr


def test_kubeadm_inits_own_tokens_are_deleted_with_or_without_a_description():
    """kubeadm 1.20 gives its 24 h token no description, later ones a fixed one; the join service's carry a node name."""
    from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import (
        DEFAULT_TOKEN_DESCRIPTION,
        Kubeadm,
    )

    listed = "\n".join(
        json.dumps(token)
        for token in (
            {"token": "aaaaaa.0123456789abcdef", "usages": ["authentication"]},
            {"token": "bbbbbb.0123456789abcdef", "description": DEFAULT_TOKEN_DESCRIPTION},
            {"token": "cccccc.0123456789abcdef", "description": "confidential.kubernetes join of worker-0"},
        )
    )
    deleted = []

    class Scripted(Kubeadm):
        def _run_command(self, argv, stdin=None):
            if argv[1:3] == ["token", "delete"]:
                deleted.append(argv[3])
            return 0, listed if argv[1:3] == ["token", "list"] else "", ""

    assert Scripted().delete_default_tokens("/etc/kubernetes/admin.conf") == 2
    assert deleted == ["aaaaaa", "bbbbbb"]


@pytest.mark.parametrize("check_mode", [False, True])
def test_token_certificate_bindings_are_deleted_where_present_and_only_reported_in_check_mode(check_mode):
    """The real API server's side is in tests/security/test_token_rights.py; here the commands and check mode."""
    from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import Kubeadm

    calls = []

    class Scripted(Kubeadm):
        def _run_command(self, argv, stdin=None):
            calls.append(argv)
            if argv[2] == "get":
                present = argv[4] == "kubeadm:node-autoapprove-bootstrap"
                return 0, f"clusterrolebinding.rbac.authorization.k8s.io/{argv[4]}\n" if present else "", ""
            return 0, "", ""

    kubeadm = Scripted("/usr/local/bin/kubeadm")
    assert kubeadm.revoke_token_certificate_rights("/etc/kubernetes/admin.conf", check_mode) == [
        "kubeadm:node-autoapprove-bootstrap"
    ]
    deletes = [argv for argv in calls if argv[2] == "delete"]
    assert all(argv[:2] == ["/usr/local/bin/kubectl", "--kubeconfig=/etc/kubernetes/admin.conf"] for argv in calls)
    assert deletes == (
        []
        if check_mode
        else [
            [
                "/usr/local/bin/kubectl",
                "--kubeconfig=/etc/kubernetes/admin.conf",
                "delete",
                "clusterrolebinding",
                "kubeadm:node-autoapprove-bootstrap",
                "--ignore-not-found",
            ]
        ]
    )


def test_a_failed_binding_lookup_fails_with_kubectls_words():
    from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import Kubeadm, KubeadmError

    class Unreachable(Kubeadm):
        def _run_command(self, argv, stdin=None):
            return 1, "", "The connection to the server 10.0.0.1:6443 was refused"

    with pytest.raises(
        KubeadmError, match="reading ClusterRoleBinding kubeadm:node-autoapprove-bootstrap failed .*was refused"
    ):
        Unreachable().revoke_token_certificate_rights("/etc/kubernetes/admin.conf")


class RecordingKubeadm(Kubeadm):
    """kubeadm 1.20 whose join records where its configuration file was, its mode and whether it held the token."""

    def __init__(self, root):
        super().__init__("kubeadm", str(root))
        self.seen = []

    def _run_command(self, argv, stdin=None):
        if argv[1:2] == ["version"]:
            return 0, "v1.20.2\n", ""
        config = argv[argv.index("--config") + 1]
        self.seen.append((config, os.stat(config).st_mode & 0o777, TOKEN in open(config, encoding="utf-8").read()))
        return 0, "joined\n", ""


def test_the_join_configuration_with_the_token_is_written_beside_the_token_file_never_in_tmpdir(tmp_path, monkeypatch):
    run_dir, tmpdir = tmp_path / "run" / "confidential-kubernetes", tmp_path / "tmp"
    run_dir.mkdir(parents=True)
    tmpdir.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    monkeypatch.setattr(tempfile, "tempdir", None)
    token_file = run_dir / "join-token"
    token_file.write_text(TOKEN + "\n")
    kubeadm = RecordingKubeadm(tmp_path / "root")
    result = join_with_token_file(kubeadm, JoinOptions("10.77.0.10:6443", [PIN]), str(token_file), [])
    assert result["changed"] is True
    ((config, mode, has_token),) = kubeadm.seen
    assert os.path.dirname(config) == str(run_dir) and mode == 0o600 and has_token
    assert list(run_dir.iterdir()) == [] and list(tmpdir.iterdir()) == []
