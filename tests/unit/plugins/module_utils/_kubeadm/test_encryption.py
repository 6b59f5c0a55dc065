# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The API servers' EncryptionConfiguration: rendering, reading back, the first write, the restart mark, the rotation's
plan and steps, the Secret rewrite, and where kubeadm's configuration points kube-apiserver."""

from __future__ import annotations

import base64
import json
import os
import stat

import pytest
import yaml

from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto import derive
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import RootSecrets
from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import (
    InitOptions,
    render_init_config,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import encryption

SECRETS = RootSecrets(bytes(range(0x80, 0xA0)), bytes(range(0xA0, 0xC0)), bytes(32))
# The known-answer vectors of test_derive.py for these root secrets.
KEY_0 = "60e105c00f2ee2b2b3d2f9dabeeefffcba17111b309fa42c935fa973ee30f670"
KEY_1 = "df1da3f527678cd7b57803db25dbd458f20344a2181083e4d3c277e0d90dabe2"
MANIFEST = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "kube-apiserver", "namespace": "kube-system", "annotations": {"kubeadm": "x"}},
    "spec": {
        "containers": [
            {
                "name": "kube-apiserver",
                "command": ["kube-apiserver", "--encryption-provider-config=/etc/kubernetes/encryption-config.yaml"],
            }
        ]
    },
}


def test_the_configuration_encrypts_secrets_with_aescbc_then_reads_plaintext_with_identity():
    document = yaml.safe_load(encryption.render(SECRETS, [0]))
    assert document["apiVersion"] == "apiserver.config.k8s.io/v1"
    assert document["kind"] == "EncryptionConfiguration"
    (resources,) = document["resources"]
    assert resources["resources"] == ["secrets"]
    aescbc, identity = resources["providers"]
    assert identity == {"identity": {}}
    assert aescbc == {
        "aescbc": {"keys": [{"name": "key-etcdSecrets", "secret": base64.b64encode(bytes.fromhex(KEY_0)).decode()}]}
    }


def test_during_a_rotation_both_keys_are_named_in_order_and_each_is_its_generations_derivation():
    keys = yaml.safe_load(encryption.render(SECRETS, [1, 0]))["resources"][0]["providers"][0]["aescbc"]["keys"]
    assert [key["name"] for key in keys] == ["key-etcdSecrets-1", "key-etcdSecrets"]
    assert [base64.b64decode(key["secret"]).hex() for key in keys] == [KEY_1, KEY_0]


@pytest.mark.parametrize(
    "generations, message",
    [
        ([], "one generation, or two during a rotation"),
        ([0, 1, 2], "one generation, or two during a rotation"),
        ([1, 1], "name one generation twice"),
        ([-1], "integer >= 0"),
        (["1"], "integer >= 0"),
    ],
    ids=["no key", "three keys", "one key twice", "negative generation", "generation as text"],
)
def test_a_bad_key_list_is_refused(generations, message):
    with pytest.raises(encryption.EncryptionConfigError, match=message):
        encryption.render(SECRETS, generations)


def test_the_file_is_read_back_as_its_generations(tmp_path):
    path = tmp_path / "encryption-config.yaml"
    assert encryption.read_generations(str(path)) is None
    path.write_bytes(encryption.render(SECRETS, [3, 2]))
    assert encryption.read_generations(str(path)) == [3, 2]


@pytest.mark.parametrize(
    "content, message",
    [
        ("kind: EncryptionConfiguration\n", "is not the Secrets encryption configuration"),
        (
            "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n"
            "- resources: [secrets, configmaps]\n  providers: [{aescbc: {keys: [{name: key-etcdSecrets, secret: x}]}}, "
            "{identity: {}}]\n",
            "resources",
        ),
        (
            "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n"
            "- resources: [secrets]\n  providers: [{identity: {}}, {aescbc: {keys: [{name: key-etcdSecrets, secret: x}]}}]\n",
            "providers other than aescbc",
        ),
        (
            "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n"
            "- resources: [secrets]\n  providers: [{aescbc: {keys: [{name: mykey, secret: x}]}}, {identity: {}}]\n",
            "names a key 'mykey'",
        ),
        (": not yaml [", "is not the Secrets encryption configuration"),
    ],
    ids=["not a configuration", "other resources", "identity first", "a foreign key name", "not YAML"],
)
def test_a_file_this_collection_did_not_write_is_refused(tmp_path, content, message):
    path = tmp_path / "encryption-config.yaml"
    path.write_text(content)
    with pytest.raises(encryption.EncryptionConfigError, match=message):
        encryption.read_generations(str(path))
    assert path.read_text() == content


def test_the_first_write_is_0600_and_replaces_a_file_an_earlier_cluster_left(tmp_path):
    path = tmp_path / "kubernetes" / "encryption-config.yaml"
    earlier = RootSecrets(bytes(32), bytes(32), bytes(32))
    assert encryption.write_config(str(path), earlier, [0]) is True
    assert encryption.write_config(str(path), SECRETS, [0]) is True
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert path.read_bytes() == encryption.render(SECRETS, [0])
    assert encryption.write_config(str(path), SECRETS, [0]) is False


def test_write_config_changes_nothing_when_the_file_holds_it_and_check_mode_writes_nothing(tmp_path):
    path = tmp_path / "encryption-config.yaml"
    assert encryption.write_config(str(path), SECRETS, [0], check_mode=True) is True
    assert not path.exists()
    assert encryption.write_config(str(path), SECRETS, [0]) is True
    assert encryption.write_config(str(path), SECRETS, [0]) is False
    os.chmod(path, 0o644)
    assert encryption.write_config(str(path), SECRETS, [0]) is True
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_the_restart_mark_is_the_files_digest_and_set_once(tmp_path):
    manifest = tmp_path / "kube-apiserver.yaml"
    manifest.write_text(yaml.safe_dump(MANIFEST))
    os.chmod(manifest, 0o600)
    assert encryption.running_digest(str(manifest)) is None
    assert encryption.uses_config(str(manifest), "/etc/kubernetes/encryption-config.yaml")
    assert not encryption.uses_config(str(manifest), "/elsewhere.yaml")
    assert encryption.restart_api_server(str(manifest), "ab" * 32, check_mode=True) is True
    assert encryption.running_digest(str(manifest)) is None
    assert encryption.restart_api_server(str(manifest), "ab" * 32) is True
    assert encryption.restart_api_server(str(manifest), "ab" * 32) is False
    assert encryption.running_digest(str(manifest)) == "ab" * 32
    rewritten = yaml.safe_load(manifest.read_text())
    assert rewritten["metadata"]["annotations"]["kubeadm"] == "x"
    assert rewritten["spec"] == MANIFEST["spec"]
    assert stat.S_IMODE(os.stat(manifest).st_mode) == 0o600


def test_a_missing_or_foreign_manifest_is_refused(tmp_path):
    with pytest.raises(encryption.EncryptionConfigError, match="runs no kube-apiserver static pod"):
        encryption.restart_api_server(str(tmp_path / "none.yaml"), "ab" * 32)
    (tmp_path / "cm.yaml").write_text("kind: ConfigMap\n")
    with pytest.raises(encryption.EncryptionConfigError, match="is not a static pod manifest"):
        encryption.running_digest(str(tmp_path / "cm.yaml"))


@pytest.mark.parametrize(
    "current, plan",
    [
        ({"cp-0": [0], "cp-1": [0]}, {"old": 0, "new": 1, "resumed": False}),
        ({"cp-0": [2]}, {"old": 2, "new": 3, "resumed": False}),
        ({"cp-0": [0, 1], "cp-1": [0]}, {"old": 0, "new": 1, "resumed": True}),
        ({"cp-0": [1], "cp-1": [1, 0]}, {"old": 0, "new": 1, "resumed": True}),
    ],
    ids=["converged: a new rotation", "after two rotations", "cut short in add", "cut short in finish"],
)
def test_the_plan_starts_a_rotation_or_resumes_the_one_cut_short(current, plan):
    assert encryption.rotation_plan(current) == dict(plan, problems=[])


def test_the_plan_refuses_a_control_plane_without_the_configuration_or_three_generations():
    assert encryption.rotation_plan({"cp-0": [0], "cp-1": None})["problems"] == [
        "cp-1 has no Secrets encryption configuration (/etc/kubernetes/encryption-config.yaml): enable it first "
        "(docs/secrets-encryption.md)"
    ]
    assert "more than two" in encryption.rotation_plan({"cp-0": [0, 1], "cp-1": [2]})["problems"][0]
    assert encryption.rotation_plan({})["problems"] == ["no control plane to rotate the Secrets key on"]


@pytest.mark.parametrize(
    "step, current, after",
    [
        ("add", [0], [0, 1]),
        ("add", [0, 1], [0, 1]),
        ("add", [1, 0], [1, 0]),
        ("add", [1], [1]),
        ("promote", [0, 1], [1, 0]),
        ("promote", [1, 0], [1, 0]),
        ("promote", [1], [1]),
        ("finish", [1, 0], [1]),
        ("finish", [1], [1]),
    ],
)
def test_each_step_moves_a_host_forward_or_leaves_it_where_it_is_done(step, current, after):
    assert encryption.keys_after(step, current, 0, 1) == after


@pytest.mark.parametrize(
    "step, current, message",
    [
        ("add", [2], r"needs the keys \[0\]"),
        ("add", None, r"needs the keys \[0\]"),
        ("promote", [0], r"needs the keys \[0, 1\]"),
        ("finish", [0, 1], "needs generation 1 first"),
        ("rewind", [0], "unknown rotation step"),
    ],
    ids=["add on a foreign generation", "add without a file", "promote before add", "finish before promote", "unknown"],
)
def test_a_step_out_of_order_is_refused(step, current, message):
    with pytest.raises(encryption.EncryptionConfigError, match=message):
        encryption.keys_after(step, current, 0, 1)


class FakeKubectl(encryption.SecretRewriter):
    def __init__(self, answers):
        super().__init__("kubectl", "/etc/kubernetes/admin.conf")
        self.answers, self.calls = list(answers), []

    def _run_command(self, argv, stdin=None):
        self.calls.append((argv, stdin))
        return self.answers.pop(0)


def test_every_secret_is_replaced_through_stdin_never_argv():
    listing = json.dumps({"items": [{"metadata": {"name": "a"}, "data": {"k": "c2VjcmV0"}}] * 3}).encode()
    kubectl = FakeKubectl([(0, listing, b""), (0, b"secret/a\n", b"")])
    assert kubectl.rewrite() == 3
    (get, dummy), (replace, stdin) = kubectl.calls
    assert get == [
        "kubectl",
        "--kubeconfig=/etc/kubernetes/admin.conf",
        "get",
        "secrets",
        "--all-namespaces",
        "--output=json",
    ]
    assert replace[2:] == ["replace", "--filename=-", "--output=name"] and stdin == listing
    assert not any("c2VjcmV0" in arg for arg in get + replace)


def test_a_failed_replace_says_to_run_again_and_an_empty_cluster_replaces_nothing():
    kubectl = FakeKubectl([(0, b'{"items": [{}]}', b""), (1, b"", b'Error from server (Conflict): secrets "a"')])
    with pytest.raises(encryption.EncryptionConfigError, match="run the rotation again.*Conflict"):
        kubectl.rewrite()
    empty = FakeKubectl([(0, b'{"items": []}', b"")])
    assert empty.rewrite() == 0 and len(empty.calls) == 1


@pytest.mark.parametrize("api_version", ["v1beta2", "v1beta3", "v1beta4"])
def test_kubeadm_points_kube_apiserver_at_the_file_and_mounts_it_read_only(api_version):
    path = "/etc/kubernetes/encryption-config.yaml"
    dummy, cluster, dummy = yaml.safe_load_all(
        render_init_config(InitOptions(encryption_provider_config=path, api_server_extra_args={"v": "2"}), api_version)
    )
    args = cluster["apiServer"]["extraArgs"]
    if api_version == "v1beta4":
        assert {"name": "encryption-provider-config", "value": path} in args and {"name": "v", "value": "2"} in args
    else:
        assert args == {"encryption-provider-config": path, "v": "2"}
    assert cluster["apiServer"]["extraVolumes"] == [
        {
            "name": "encryption-provider-config",
            "hostPath": path,
            "mountPath": path,
            "readOnly": True,
            "pathType": "File",
        }
    ]
    dummy, plain, dummy = yaml.safe_load_all(render_init_config(InitOptions(), api_version))
    assert "apiServer" not in plain


def test_the_storage_prefix_names_the_provider_and_the_key():
    assert encryption.storage_prefix(0) == b"k8s:enc:aescbc:v1:key-etcdSecrets:"
    assert encryption.storage_prefix(4) == b"k8s:enc:aescbc:v1:key-etcdSecrets-4:"
    assert derive.etcd_secrets_key_name(4) == "key-etcdSecrets-4"


def _reading(generations, uses):
    return {"generations": generations, "api_server_uses_config": uses}


@pytest.mark.parametrize(
    "readings, plan",
    [
        (
            {"cp-0": _reading(None, False), "cp-1": _reading(None, False)},
            {"enable": True, "old": None, "new": 0, "resumed": False},
        ),
        (
            {"cp-0": _reading([0], True), "cp-1": _reading(None, False)},
            {"enable": True, "old": None, "new": 0, "resumed": True},
        ),
        (
            {"cp-0": _reading([0], False)},
            {"enable": True, "old": None, "new": 0, "resumed": True},
        ),
        (
            {"cp-0": _reading([0], True), "cp-1": _reading([0], True)},
            {"enable": False, "old": 0, "new": 1, "resumed": False},
        ),
    ],
    ids=["a cluster from before", "turning on cut short", "file written, pod not yet", "on everywhere: rotate"],
)
def test_a_cluster_from_before_is_turned_on_and_one_that_encrypts_is_rotated(readings, plan):
    assert encryption.secrets_key_plan(readings) == dict(plan, problems=[])


def test_a_rotated_cluster_with_an_api_server_not_using_the_file_is_refused():
    plan = encryption.secrets_key_plan({"cp-0": _reading([1], True), "cp-1": _reading([1], False)})
    assert plan["problems"] == [
        "cp-1: kube-apiserver is not started with --encryption-provider-config=/etc/kubernetes/encryption-config.yaml"
    ]


def test_turning_on_starts_the_api_server_with_flag_volume_and_mark_once(tmp_path):
    manifest = tmp_path / "kube-apiserver.yaml"
    plain = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "kube-apiserver", "namespace": "kube-system"},
        "spec": {
            "containers": [
                {"name": "kube-apiserver", "command": ["kube-apiserver", "--secure-port=6443"], "volumeMounts": []}
            ],
            "volumes": [{"name": "k8s-certs", "hostPath": {"path": "/etc/kubernetes/pki"}}],
        },
    }
    manifest.write_text(yaml.safe_dump(plain))
    os.chmod(manifest, 0o600)
    path = "/etc/kubernetes/encryption-config.yaml"
    assert encryption.enable_api_server(str(manifest), path, "cd" * 32, check_mode=True) is True
    assert not encryption.uses_config(str(manifest), path)
    assert encryption.enable_api_server(str(manifest), path, "cd" * 32) is True
    assert encryption.enable_api_server(str(manifest), path, "cd" * 32) is False
    pod = yaml.safe_load(manifest.read_text())
    (container,) = pod["spec"]["containers"]
    assert container["command"] == ["kube-apiserver", "--secure-port=6443", f"--encryption-provider-config={path}"]
    assert container["volumeMounts"] == [{"name": "encryption-provider-config", "mountPath": path, "readOnly": True}]
    assert pod["spec"]["volumes"][-1] == {
        "name": "encryption-provider-config",
        "hostPath": {"path": path, "type": "File"},
    }
    assert encryption.running_digest(str(manifest)) == "cd" * 32
    assert stat.S_IMODE(os.stat(manifest).st_mode) == 0o600


@pytest.mark.parametrize("api_version", ["v1beta2", "v1beta3", "v1beta4"])
def test_kubeadms_cluster_configuration_gets_the_flag_and_volume_once(api_version):
    path = "/etc/kubernetes/encryption-config.yaml"
    dummy, cluster, dummy = render_init_config(InitOptions(api_server_extra_args={"v": "2"}), api_version).split(
        "---\n"
    )
    changed = encryption.enable_in_cluster_configuration(cluster, path)
    assert changed is not None
    assert encryption.enable_in_cluster_configuration(changed, path) is None
    dummy, expected, dummy = yaml.safe_load_all(
        render_init_config(InitOptions(api_server_extra_args={"v": "2"}, encryption_provider_config=path), api_version)
    )
    mine = yaml.safe_load(changed)["apiServer"]
    if api_version == "v1beta4":
        assert sorted(mine["extraArgs"], key=str) == sorted(expected["apiServer"]["extraArgs"], key=str)
    else:
        assert mine["extraArgs"] == expected["apiServer"]["extraArgs"]
    assert mine["extraVolumes"] == expected["apiServer"]["extraVolumes"]


def test_kubeadm_config_is_replaced_with_its_resource_version_and_left_alone_when_done():
    path = "/etc/kubernetes/encryption-config.yaml"
    cluster = "apiVersion: kubeadm.k8s.io/v1beta2\nkind: ClusterConfiguration\napiServer: {}\n"
    config_map = {
        "metadata": {"name": "kubeadm-config", "resourceVersion": "42"},
        "data": {"ClusterConfiguration": cluster},
    }

    class Kubectl(encryption.KubeadmConfig):
        calls = []

        def _run_command(self, argv, stdin=None):
            self.calls.append((argv, stdin))
            return (0, json.dumps(config_map).encode(), b"") if "get" in argv else (0, b"", b"")

    kubectl = Kubectl()
    assert kubectl.enable(path) is True
    (dummy, dummy2), (replace, stdin) = kubectl.calls
    written = json.loads(stdin)
    assert "replace" in replace and written["metadata"]["resourceVersion"] == "42"
    assert yaml.safe_load(written["data"]["ClusterConfiguration"])["apiServer"]["extraArgs"] == {
        "encryption-provider-config": path
    }
    config_map["data"]["ClusterConfiguration"] = written["data"]["ClusterConfiguration"]
    assert Kubectl().enable(path) is False
