"""kubeadm config validate: strict decoding and value validation, v1beta3 and v1beta4."""

from __future__ import annotations

import pytest

GOOD_V1BETA4 = """\
apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
bootstrapTokens:
- token: abcdef.0123456789abcdef
  ttl: 15m0s
nodeRegistration:
  name: cp1
  kubeletExtraArgs:
  - name: node-ip
    value: 10.0.0.1
  taints: []
localAPIEndpoint:
  advertiseAddress: 10.0.0.1
  bindPort: 6443
skipPhases: [addon/kube-proxy]
timeouts:
  controlPlaneComponentHealthCheck: 4m0s
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: v1.31.4
controlPlaneEndpoint: 10.0.0.1:6443
networking: {serviceSubnet: 10.96.0.0/12, podSubnet: 10.244.0.0/16, dnsDomain: cluster.local}
apiServer:
  certSANs: [10.0.0.1, cp.example.com]
  extraArgs:
  - {name: audit-log-maxage, value: "30"}
etcd: {local: {dataDir: /var/lib/etcd}}
---
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
---
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
"""

GOOD_V1BETA3 = """\
apiVersion: kubeadm.k8s.io/v1beta3
kind: JoinConfiguration
discovery:
  bootstrapToken:
    token: abcdef.0123456789abcdef
    apiServerEndpoint: 10.0.0.1:6443
    caCertHashes: ["sha256:%s"]
  timeout: 5m0s
nodeRegistration:
  kubeletExtraArgs: {node-ip: 10.0.0.2}
---
apiVersion: kubeadm.k8s.io/v1beta3
kind: ClusterConfiguration
apiServer:
  timeoutForControlPlane: 4m0s
  extraArgs: {audit-log-maxage: "30"}
""" % ("ab" * 32)

JOIN_V1BETA4 = """\
apiVersion: kubeadm.k8s.io/v1beta4
kind: JoinConfiguration
discovery:
  bootstrapToken:
    token: {token}
    apiServerEndpoint: 10.0.0.1:6443
    caCertHashes: [{hash}]
"""


def join(token: str = "abcdef.0123456789abcdef", ca_hash: str = "sha256:" + "ab" * 32) -> str:
    return JOIN_V1BETA4.format(token=token, hash=ca_hash)


def test_valid_v1beta4_is_accepted(make_node):
    node = make_node()
    result = node.run("kubeadm", "config", "validate", "--config", node.write("c.yaml", GOOD_V1BETA4))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
    assert "deprecated" not in result.stderr


def test_valid_v1beta3_is_accepted_with_deprecation_warning(make_node):
    node = make_node()
    result = node.run("kubeadm", "config", "validate", "--config", node.write("c.yaml", GOOD_V1BETA3))
    assert result.returncode == 0, result.stderr
    assert 'uses a deprecated API spec: "kubeadm.k8s.io/v1beta3"' in result.stderr


@pytest.mark.parametrize(
    ("config", "message"),
    [
        pytest.param(
            GOOD_V1BETA4.replace("  name: cp1\n", "  name: cp1\n  foo: bar\n", 1),
            'strict decoding error: unknown field "nodeRegistration.foo"',
            id="unknown nested field",
        ),
        pytest.param(
            GOOD_V1BETA4.replace("kubernetesVersion: v1.31.4\n", "kubernetesVersion: v1.31.4\nfoo: 1\n"),
            'Kind:"ClusterConfiguration"}: strict decoding error: unknown field "foo"',
            id="unknown top-level field",
        ),
        pytest.param(
            GOOD_V1BETA4.replace(
                "kubeadm.k8s.io/v1beta4\nkind: InitConfiguration", "kubeadm.k8s.io/v1beta2\nkind: InitConfiguration"
            ),
            'uses an old API spec: "kubeadm.k8s.io/v1beta2"',
            id="removed apiVersion",
        ),
        pytest.param(
            GOOD_V1BETA4.replace(
                "kubeadm.k8s.io/v1beta4\nkind: InitConfiguration", "kubeadm.k8s.io/v1beta9\nkind: InitConfiguration"
            ),
            'no kind "InitConfiguration" is registered for version "kubeadm.k8s.io/v1beta9"',
            id="unknown apiVersion",
        ),
        pytest.param(
            GOOD_V1BETA4.replace("kind: InitConfiguration", "kind: InitConfig"),
            'no kind "InitConfig" is registered',
            id="unknown kind",
        ),
        pytest.param(
            GOOD_V1BETA4.replace("  ttl: 15m0s\n", "  ttl: 15m0s\n  ttl: 1h\n"),
            'key "ttl" already set in map',
            id="duplicate field",
        ),
        pytest.param(
            GOOD_V1BETA4.replace("abcdef.0123456789abcdef", "ABCDEF.0123456789abcdef"),
            'the bootstrap token "ABCDEF.0123456789abcdef" was not of the form',
            id="bad init token",
        ),
        pytest.param(
            GOOD_V1BETA4.replace("podSubnet: 10.244.0.0/16", "podSubnet: 10.244.0.0/99"),
            'networking.podSubnet: Invalid value: "10.244.0.0/99": couldn\'t parse subnet',
            id="bad CIDR",
        ),
        pytest.param(
            GOOD_V1BETA4.replace("v1.31.4", "banana"),
            'couldn\'t parse Kubernetes version "banana"',
            id="bad kubernetesVersion",
        ),
        pytest.param(
            GOOD_V1BETA4.replace("timeouts:\n  controlPlaneComponentHealthCheck: 4m0s\n", "")
            .replace("kubeadm.k8s.io/v1beta4", "kubeadm.k8s.io/v1beta3")
            .replace("  - name: node-ip\n    value: 10.0.0.1\n", "    node-ip: 10.0.0.1\n")
            .replace('  - {name: audit-log-maxage, value: "30"}\n', '    audit-log-maxage: "30"\n')
            + "---\napiVersion: kubeadm.k8s.io/v1beta3\nkind: JoinConfiguration\ntimeouts: {}\n",
            'unknown field "timeouts"',
            id="v1beta4-only field in v1beta3",
        ),
        pytest.param(
            GOOD_V1BETA3.replace('extraArgs: {audit-log-maxage: "30"}', "extraArgs: [{name: a, value: b}]"),
            "cannot unmarshal array into Go struct field ClusterConfiguration.apiServer.extraArgs of type map[string]string",
            id="v1beta4 list extraArgs in v1beta3",
        ),
        pytest.param(
            GOOD_V1BETA4.replace('  - {name: audit-log-maxage, value: "30"}\n', '    audit-log-maxage: "30"\n'),
            "cannot unmarshal object into Go struct field ClusterConfiguration.apiServer.extraArgs",
            id="v1beta3 map extraArgs in v1beta4",
        ),
        pytest.param(
            GOOD_V1BETA3.replace("  timeout: 5m0s\n", "  timeout: 5 minutes\n"),
            'time: invalid duration "5 minutes"',
            id="bad duration",
        ),
        pytest.param(
            join(token="abcdef.0123"),
            'the bootstrap token "abcdef.0123" was not of the form "[a-z0-9]{6}.[a-z0-9]{16}"',
            id="bad discovery token",
        ),
        pytest.param(join(ca_hash="sha256:abcd"), "expected a 32 byte SHA-256 hash, found 2 bytes", id="short hash"),
        pytest.param(join(ca_hash="md5:" + "ab" * 32), 'unknown hash format "md5"', id="unknown hash format"),
        pytest.param(join(ca_hash="sha256:" + "zz" * 32), "encoding/hex: invalid byte", id="non-hex hash"),
        pytest.param(
            join().replace("    caCertHashes: [sha256:" + "ab" * 32 + "]\n", ""),
            "using token-based discovery without caCertHashes can be unsafe",
            id="no pin and no unsafe skip",
        ),
        pytest.param(
            join().replace("10.0.0.1:6443", "10.0.0.1"), "missing port in address", id="endpoint without port"
        ),
    ],
)
def test_invalid_config_is_rejected(make_node, config, message):
    node = make_node()
    result = node.run("kubeadm", "config", "validate", "--config", node.write("c.yaml", config))
    assert result.returncode == 1, result.stdout
    assert message in result.stderr
    assert "To see the stack trace of this error execute with --v=5 or higher" in result.stderr


def test_unsafe_skip_without_hashes_is_accepted(make_node):
    node = make_node()
    config = join().replace("    caCertHashes: [sha256:" + "ab" * 32 + "]\n", "    unsafeSkipCAVerification: true\n")
    result = node.run("kubeadm", "config", "validate", "--config", node.write("c.yaml", config))
    assert result.returncode == 0, result.stderr


def test_missing_config_file(make_node):
    node = make_node()
    result = node.run("kubeadm", "config", "validate", "--config", str(node.root / "nope.yaml"))
    assert result.returncode == 1
    assert "no such file or directory" in result.stderr


def test_version_outputs(make_node):
    node = make_node()
    assert node.run("kubeadm", "version", "-o", "short").stdout == "v1.31.4\n"
    import json

    info = json.loads(node.run("kubeadm", "version", "-o", "json").stdout)
    assert info["clientVersion"]["gitVersion"] == "v1.31.4"
