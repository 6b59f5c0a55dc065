"""kubeadm init / join / token / upload-certs / reset against the API double."""

from __future__ import annotations

import json
import shutil
import stat
import time

from k8s_doubles_harness import TOKEN, free_port, init_config, pid_alive, stop_pid
from k8sdoubles import pki

PKI_SHARED = (
    "ca.crt",
    "ca.key",
    "sa.key",
    "sa.pub",
    "front-proxy-ca.crt",
    "front-proxy-ca.key",
    "etcd/ca.crt",
    "etcd/ca.key",
)


def test_init_writes_real_pki_kubeconfigs_and_join_command(cluster):
    node = cluster.control_plane
    ca_cert = pki.x509.load_pem_x509_certificate(node.path("/etc/kubernetes/pki/ca.crt").read_bytes())
    serving = pki.x509.load_pem_x509_certificate(node.path("/etc/kubernetes/pki/apiserver.crt").read_bytes())
    serving.verify_directly_issued_by(ca_cert)
    sans = serving.extensions.get_extension_for_class(pki.x509.SubjectAlternativeName).value
    assert "kubernetes.default.svc.cluster.local" in sans.get_values_for_type(pki.x509.DNSName)
    assert {str(ip) for ip in sans.get_values_for_type(pki.x509.IPAddress)} >= {"10.96.0.1", "127.0.0.1"}
    for name in ("admin.conf", "super-admin.conf", "kubelet.conf", "controller-manager.conf", "scheduler.conf"):
        assert stat.S_IMODE(node.path(f"/etc/kubernetes/{name}").stat().st_mode) == 0o600, name
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd"):
        assert node.path(f"/etc/kubernetes/manifests/{name}.yaml").exists()
    assert node.path("/var/lib/kubelet/config.yaml").exists()
    state = node.path("/etc/kubernetes/double-apiserver/state.json")
    assert stat.S_IMODE(state.stat().st_mode) == 0o600


def test_second_init_is_refused_by_preflight(cluster):
    node = cluster.control_plane
    result = node.run("kubeadm", "init", "--config", str(node.root / "init.yaml"))
    assert result.returncode == 1
    assert "error execution phase preflight: [preflight] Some fatal errors occurred:" in result.stderr
    assert (
        "[ERROR FileAvailable--etc-kubernetes-manifests-kube-apiserver.yaml]: "
        "/etc/kubernetes/manifests/kube-apiserver.yaml already exists"
    ) in result.stderr
    assert f"[ERROR Port-{cluster.port}]: Port {cluster.port} is in use" in result.stderr


def test_init_reuses_preplaced_ca(make_node):
    node = make_node()
    ca_cert, ca_key = pki.new_ca("kubernetes", "ECDSA-P256")
    (node.path("/etc/kubernetes/pki")).mkdir(parents=True)
    node.path("/etc/kubernetes/pki/ca.crt").write_bytes(pki.cert_pem(ca_cert))
    node.path("/etc/kubernetes/pki/ca.key").write_bytes(pki.key_pem(ca_key))
    result = node.run("kubeadm", "init", "--config", init_config(node, free_port()))
    try:
        assert result.returncode == 0, result.stderr
        assert "[certs] Using existing ca certificate authority" in result.stdout
        assert node.path("/etc/kubernetes/pki/ca.crt").read_bytes() == pki.cert_pem(ca_cert)
        assert f"--discovery-token-ca-cert-hash {pki.spki_hash(ca_cert)}" in result.stdout
    finally:
        stop_pid(node.apiserver_pid())


def test_init_rejects_ca_key_that_does_not_match(make_node):
    node = make_node()
    ca_cert = pki.new_ca("kubernetes", "ECDSA-P256")[0]
    other_key = pki.new_ca("kubernetes", "ECDSA-P256")[1]
    node.path("/etc/kubernetes/pki").mkdir(parents=True)
    node.path("/etc/kubernetes/pki/ca.crt").write_bytes(pki.cert_pem(ca_cert))
    node.path("/etc/kubernetes/pki/ca.key").write_bytes(pki.key_pem(other_key))
    result = node.run("kubeadm", "init", "--config", init_config(node, free_port()))
    assert result.returncode == 1
    assert "error execution phase certs: error creating PKI assets:" in result.stderr
    assert "private key does not match public key" in result.stderr
    assert node.apiserver_pid() is None


def test_worker_join_registers_node(cluster, make_node):
    worker = make_node()
    result = worker.run("kubeadm", "join", "--config", cluster.join_config(worker, "w1"))
    assert result.returncode == 0, result.stderr
    assert "This node has joined the cluster:" in result.stdout
    assert stat.S_IMODE(worker.path("/etc/kubernetes/kubelet.conf").stat().st_mode) == 0o600
    assert worker.path("/var/lib/kubelet/config.yaml").exists()
    assert (
        worker.path("/etc/kubernetes/pki/ca.crt").read_bytes()
        == cluster.control_plane.path("/etc/kubernetes/pki/ca.crt").read_bytes()
    )
    nodes = cluster.control_plane.kubectl("get", "nodes")
    assert nodes.returncode == 0, nodes.stderr
    lines = nodes.stdout.splitlines()
    assert lines[0].split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["cp1"][1:3] == ["Ready", "control-plane"]
    assert rows["w1"][1:3] == ["Ready", "<none>"]
    both = cluster.control_plane.kubectl("get", "nodes", "cp1", "w1").stdout.splitlines()
    assert [line.split()[0] for line in both] == ["NAME", "cp1", "w1"]
    # The kubelet credentials written by join authenticate as the node, and the node authorizer confines them.
    kubelet = worker.run(
        "kubectl",
        "--kubeconfig",
        str(worker.path("/etc/kubernetes/kubelet.conf")),
        "get",
        "secrets",
        "-n",
        "kube-system",
    )
    assert kubelet.returncode == 1
    assert 'User "system:node:w1" cannot list resource "secrets"' in kubelet.stderr


def test_join_flag_form(cluster, make_node):
    worker = make_node()
    result = worker.run(
        "kubeadm",
        "join",
        cluster.endpoint,
        "--token",
        TOKEN,
        "--discovery-token-ca-cert-hash",
        cluster.ca_hash,
        "--node-name",
        "w2",
    )
    assert result.returncode == 0, result.stderr
    assert "w2" in cluster.control_plane.kubectl("get", "nodes", "-o", "name").stdout


def test_join_with_wrong_token_secret_fails_jws_check(cluster, make_node):
    worker = make_node()
    result = worker.run(
        "kubeadm", "join", "--config", cluster.join_config(worker, "w1", token="abcdef.ffffffffffffffff")
    )
    assert result.returncode == 1
    assert (
        "error execution phase preflight: couldn't validate the identity of the API Server: failed to verify JWS "
        "signature of received cluster info object, can't trust this API server"
    ) in result.stderr
    assert not worker.path("/etc/kubernetes/kubelet.conf").exists()


def test_join_with_unknown_token_id_fails(cluster, make_node):
    worker = make_node()
    result = worker.run(
        "kubeadm", "join", "--config", cluster.join_config(worker, "w1", token="zzzzzz.0123456789abcdef")
    )
    assert result.returncode == 1
    assert (
        'token id "zzzzzz" is invalid for this cluster or it has expired. Use "kubeadm token create" on the '
        "control-plane node to create a new valid token"
    ) in result.stderr


def test_join_with_expired_token_fails(cluster, make_node):
    node = cluster.control_plane
    created = node.run("kubeadm", "token", "create", "--ttl", "1s", "--kubeconfig", node.admin_conf)
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    time.sleep(1.5)
    worker = make_node()
    result = worker.run("kubeadm", "join", "--config", cluster.join_config(worker, "w1", token=token))
    assert result.returncode == 1
    assert f'token id "{token[:6]}" is invalid for this cluster or it has expired' in result.stderr


def test_join_with_wrong_pin_fails(cluster, make_node):
    worker = make_node()
    other = pki.new_ca("kubernetes", "ECDSA-P256")[0]
    result = worker.run("kubeadm", "join", "--config", cluster.join_config(worker, "w1", hashes=[pki.spki_hash(other)]))
    assert result.returncode == 1
    assert (
        f'cluster CA found in cluster-info ConfigMap is invalid: none of the public keys "{cluster.ca_hash}" '
        "are pinned"
    ) in result.stderr


def test_deleted_token_is_unauthorized(cluster, make_node):
    node = cluster.control_plane
    token = node.run("kubeadm", "token", "create", "--kubeconfig", node.admin_conf).stdout.strip()
    body = node.run("kubeadm", "token", "delete", token[:6], "--kubeconfig", node.admin_conf)
    assert body.returncode == 0 and body.stdout == f'bootstrap token "{token[:6]}" deleted\n'
    worker = make_node()
    result = worker.run("kubeadm", "join", "--config", cluster.join_config(worker, "w1", token=token))
    assert result.returncode == 1
    assert "is invalid for this cluster or it has expired" in result.stderr


def test_second_join_is_refused_by_preflight(cluster, make_node):
    worker = make_node()
    config = cluster.join_config(worker, "w1")
    assert worker.run("kubeadm", "join", "--config", config).returncode == 0
    again = worker.run("kubeadm", "join", "--config", config)
    assert again.returncode == 1
    assert (
        "[ERROR FileAvailable--etc-kubernetes-kubelet.conf]: /etc/kubernetes/kubelet.conf already exists"
        in again.stderr
    )


def test_rejoin_of_ready_node_name_is_refused(cluster, make_node):
    first, second = make_node(), make_node()
    assert first.run("kubeadm", "join", "--config", cluster.join_config(first, "w1")).returncode == 0
    result = second.run("kubeadm", "join", "--config", cluster.join_config(second, "w1"))
    assert result.returncode == 1
    assert 'a Node with name "w1" and status "Ready" already exists in the cluster' in result.stderr


def test_control_plane_join_without_pki_names_missing_file(cluster, make_node):
    joiner = make_node()
    extra = (
        "controlPlane:\n  localAPIEndpoint: {advertiseAddress: 127.0.0.1, bindPort: 6443}\n"
        "skipPhases: [control-plane-prepare/download-certs]\n"
    )
    result = joiner.run("kubeadm", "join", "--config", cluster.join_config(joiner, "cp2", extra=extra))
    assert result.returncode == 1
    assert (
        "failure loading certificate for CA: couldn't load the certificate file /etc/kubernetes/pki/ca.crt"
        in result.stderr
    )


def test_control_plane_join_with_copied_pki(cluster, make_node):
    joiner = make_node()
    for name in PKI_SHARED:
        target = joiner.path(f"/etc/kubernetes/pki/{name}")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(cluster.control_plane.path(f"/etc/kubernetes/pki/{name}"), target)
    extra = (
        "controlPlane:\n  localAPIEndpoint: {advertiseAddress: 127.0.0.1, bindPort: 6443}\n"
        "skipPhases: [control-plane-prepare/download-certs]\n"
    )
    result = joiner.run("kubeadm", "join", "--config", cluster.join_config(joiner, "cp2", extra=extra))
    assert result.returncode == 0, result.stderr
    assert "a new control plane instance was created" in result.stdout
    assert joiner.path("/etc/kubernetes/manifests/kube-apiserver.yaml").exists()
    node = json.loads(cluster.control_plane.kubectl("get", "node", "cp2", "-o", "json").stdout)
    assert "node-role.kubernetes.io/control-plane" in node["metadata"]["labels"]
    assert node["spec"]["taints"] == [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]
    # The joined control plane's own admin.conf works against the cluster.
    assert "cp2" in joiner.kubectl("get", "nodes").stdout


def test_upload_certs_then_control_plane_join_downloads_them(cluster, make_node):
    node = cluster.control_plane
    upload = node.run("kubeadm", "init", "phase", "upload-certs", "--upload-certs", "--kubeconfig", node.admin_conf)
    assert upload.returncode == 0, upload.stderr
    lines = upload.stdout.splitlines()
    assert lines[-2] == "[upload-certs] Using certificate key:"
    key = lines[-1]
    assert len(bytes.fromhex(key)) == 32
    joiner = make_node()
    extra = (
        f"controlPlane:\n  localAPIEndpoint: {{advertiseAddress: 127.0.0.1, bindPort: 6443}}\n  certificateKey: {key}\n"
    )
    result = joiner.run("kubeadm", "join", "--config", cluster.join_config(joiner, "cp3", extra=extra))
    assert result.returncode == 0, result.stderr
    assert (
        joiner.path("/etc/kubernetes/pki/sa.key").read_bytes() == node.path("/etc/kubernetes/pki/sa.key").read_bytes()
    )
    wrong = make_node()
    extra = extra.replace(key, "ab" * 32)
    failed = wrong.run("kubeadm", "join", "--config", cluster.join_config(wrong, "cp4", extra=extra))
    assert failed.returncode == 1
    assert "error execution phase control-plane-prepare/download-certs" in failed.stderr


def test_token_create_list_delete(cluster):
    node = cluster.control_plane
    created = node.run(
        "kubeadm", "token", "create", "--ttl", "15m0s", "--description", "lab join", "--kubeconfig", node.admin_conf
    )
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    assert len(token) == 23 and token[6] == "."
    listing = node.run("kubeadm", "token", "list", "--kubeconfig", node.admin_conf)
    header, *rows = listing.stdout.splitlines()
    assert header.split() == ["TOKEN", "TTL", "EXPIRES", "USAGES", "DESCRIPTION", "EXTRA", "GROUPS"]
    row = next(r for r in rows if r.startswith(token))
    assert (" 14m " in row or " 15m " in row) and "authentication,signing" in row and "lab join" in row
    as_json = node.run("kubeadm", "token", "list", "-o", "json", "--kubeconfig", node.admin_conf)
    assert '"token": "%s"' % token in as_json.stdout
    secret = json.loads(
        node.kubectl("get", "secret", "-n", "kube-system", f"bootstrap-token-{token[:6]}", "-o", "json").stdout
    )
    assert secret["type"] == "bootstrap.kubernetes.io/token"
    assert set(secret["data"]) >= {
        "token-id",
        "token-secret",
        "expiration",
        "usage-bootstrap-authentication",
        "usage-bootstrap-signing",
        "auth-extra-groups",
        "description",
    }
    deleted = node.run("kubeadm", "token", "delete", token, "--kubeconfig", node.admin_conf)
    assert deleted.stdout == f'bootstrap token "{token[:6]}" deleted\n'
    assert token not in node.run("kubeadm", "token", "list", "--kubeconfig", node.admin_conf).stdout
    bad = node.run("kubeadm", "token", "create", "not-a-token", "--kubeconfig", node.admin_conf)
    assert bad.returncode == 1 and "was not of the form" in bad.stderr


def test_token_create_print_join_command(cluster):
    node = cluster.control_plane
    result = node.run("kubeadm", "token", "create", "--print-join-command", "--kubeconfig", node.admin_conf)
    assert result.returncode == 0, result.stderr
    words = result.stdout.split()
    assert words[:3] == ["kubeadm", "join", cluster.endpoint]
    assert words[words.index("--discovery-token-ca-cert-hash") + 1] == cluster.ca_hash


def test_reset_cleans_node_and_stops_api_double(cluster):
    node = cluster.control_plane
    pid = node.apiserver_pid()
    assert pid is not None and pid_alive(pid)
    result = node.run("kubeadm", "reset", "-f")
    assert result.returncode == 0, result.stderr
    assert (
        "[reset] Deleting contents of directories: [/etc/kubernetes/manifests /var/lib/kubelet /etc/kubernetes/pki]"
        in result.stdout
    )
    assert not pid_alive(pid)
    for logical in (
        "/etc/kubernetes/admin.conf",
        "/etc/kubernetes/kubelet.conf",
        "/etc/kubernetes/pki/ca.crt",
        "/etc/kubernetes/manifests/kube-apiserver.yaml",
        "/var/lib/kubelet/config.yaml",
        "/etc/kubernetes/double-apiserver/state.json",
    ):
        assert not node.path(logical).exists(), logical
    again = node.run("kubeadm", "init", "--config", str(node.root / "init.yaml"))
    try:
        assert again.returncode == 0, again.stderr
    finally:
        stop_pid(node.apiserver_pid())


def test_reset_without_force_asks(cluster):
    node = cluster.control_plane
    result = node.run("kubeadm", "reset", stdin="n\n")
    assert result.returncode == 1
    assert "aborted reset operation" in result.stderr
    assert node.path("/etc/kubernetes/admin.conf").exists()


def test_init_with_upload_certs_prints_control_plane_join_with_key(make_node):
    node = make_node()
    result = node.run("kubeadm", "init", "--config", init_config(node, free_port()), "--upload-certs")
    try:
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        key = lines[lines.index("[upload-certs] Using certificate key:") + 1]
        assert f"--control-plane --certificate-key {key}" in result.stdout
        assert (
            "Please note that the certificate-key gives access to cluster sensitive data, keep it secret!"
            in result.stdout
        )
        secret = json.loads(node.kubectl("get", "secret", "-n", "kube-system", "kubeadm-certs", "-o", "json").stdout)
        assert set(secret["data"]) == {
            "ca.crt",
            "ca.key",
            "sa.key",
            "sa.pub",
            "front-proxy-ca.crt",
            "front-proxy-ca.key",
            "etcd-ca.crt",
            "etcd-ca.key",
        }
    finally:
        stop_pid(node.apiserver_pid())


def test_unknown_skip_phase_is_rejected(make_node):
    node = make_node()
    result = node.run("kubeadm", "init", "--config", init_config(node, free_port()), "--skip-phases", "addon/flannel")
    assert result.returncode == 1
    assert result.stderr.startswith("invalid phase name: addon/flannel\n")
    assert node.apiserver_pid() is None


def test_mixing_config_and_flags_is_rejected(cluster, make_node):
    worker = make_node()
    result = worker.run("kubeadm", "join", "--config", cluster.join_config(worker, "w1"), "--token", TOKEN)
    assert result.returncode == 1
    assert "can not mix '--config' with arguments [token]" in result.stderr


def test_join_reuses_a_valid_preplaced_kubelet_client_certificate(cluster, make_node):
    control_plane = cluster.control_plane
    ca_cert = pki.x509.load_pem_x509_certificate(control_plane.path("/etc/kubernetes/pki/ca.crt").read_bytes())
    ca_key = pki.serialization.load_pem_private_key(
        control_plane.path("/etc/kubernetes/pki/ca.key").read_bytes(), password=None
    )
    cert, key = pki.new_cert(
        pki.CertSpec("system:node:w9", ["system:nodes"], client=True), ca_cert, ca_key, "ECDSA-P256"
    )
    worker = make_node()
    current = worker.path("/var/lib/kubelet/pki/kubelet-client-current.pem")
    current.parent.mkdir(parents=True)
    current.write_bytes(pki.cert_pem(cert) + pki.key_pem(key))
    result = worker.run("kubeadm", "join", "--config", cluster.join_config(worker, "w9"))
    assert result.returncode == 0, result.stderr
    assert current.read_bytes() == pki.cert_pem(cert) + pki.key_pem(key)
    assert control_plane.kubectl("get", "csr", "-o", "name").stdout == ""
    assert "w9" in control_plane.kubectl("get", "nodes").stdout
    other = make_node()
    assert other.run("kubeadm", "join", "--config", cluster.join_config(other, "w10")).returncode == 0
    assert len(control_plane.kubectl("get", "csr", "-o", "name").stdout.splitlines()) == 1


def test_reset_of_worker_leaves_control_plane_running(cluster, make_node):
    worker = make_node()
    assert worker.run("kubeadm", "join", "--config", cluster.join_config(worker, "w1")).returncode == 0
    result = worker.run("kubeadm", "reset", "-f", "--cleanup-tmp-dir")
    assert result.returncode == 0, result.stderr
    for logical in (
        "/etc/kubernetes/kubelet.conf",
        "/etc/kubernetes/pki/ca.crt",
        "/var/lib/kubelet/config.yaml",
        "/var/lib/kubelet/pki/kubelet-client-current.pem",
    ):
        assert not worker.path(logical).exists(), logical
    assert pid_alive(cluster.control_plane.apiserver_pid())
    # As with real kubeadm, the Node object stays until someone deletes it; a rejoin under that name is refused.
    rejoin = worker.run("kubeadm", "join", "--config", cluster.join_config(worker, "w1"))
    assert rejoin.returncode == 1 and 'a Node with name "w1" and status "Ready" already exists' in rejoin.stderr
    assert cluster.control_plane.kubectl("delete", "node", "w1").stdout == 'node "w1" deleted\n'
    assert worker.run("kubeadm", "join", "--config", cluster.join_config(worker, "w1")).returncode == 0
