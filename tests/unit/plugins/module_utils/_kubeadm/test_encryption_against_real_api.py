# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Secrets at rest on the real kube-apiserver v1.20.2 and etcd: started with the collection's EncryptionConfiguration,
etcd holds each Secret behind ``k8s:enc:aescbc:v1:key-etcdSecrets:`` and no plaintext; after the rotation's steps
(new key second, new key first, every Secret rewritten, old key removed; the API server restarted after each file
change, as the playbook has the kubelet do) every Secret carries the new key's name and still reads back."""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._backup.etcd import Etcdctl
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import RootSecrets
from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import encryption

import control_plane

ROOT_SECRETS = RootSecrets(os.urandom(32), os.urandom(32), os.urandom(32))


@pytest.fixture(scope="module")
def encrypted_control_plane(tmp_path_factory):
    missing = control_plane.missing_binaries()
    if missing:
        message = f"the real Kubernetes binaries are not built ({', '.join(missing)}): run tests/lab/lab kubernetes"
        if os.environ.get("CK_REQUIRE_KUBERNETES") == "1":
            pytest.fail(message)
        pytest.skip(message)
    config = tmp_path_factory.mktemp("encryption") / "encryption-config.yaml"
    assert encryption.write_config(str(config), ROOT_SECRETS, [0])
    started = control_plane.start_control_plane([f"--{encryption.API_SERVER_FLAG}={config}"])
    try:
        yield started, config
    finally:
        control_plane.stop_control_plane(started)


def _etcdctl(plane) -> Etcdctl:
    return Etcdctl(binary=str(control_plane.binaries_dir() / "etcdctl"), endpoint=plane.etcd_url)


def _raw(plane, key: str) -> bytes:
    """The value etcd holds under ``key``, as etcdctl prints it (no decoding by anything of the collection)."""
    done = subprocess.run(
        [
            str(control_plane.binaries_dir() / "etcdctl"),
            f"--endpoints={plane.etcd_url}",
            "get",
            key,
            "--print-value-only",
        ],
        capture_output=True,
        env=dict(os.environ, ETCDCTL_API="3"),
        timeout=60,
        check=True,
    )
    return done.stdout


def _create_secret(plane, name: str) -> str:
    value = "marker-" + secrets.token_hex(16)
    plane.kubectl("create", "secret", "generic", name, f"--from-literal=password={value}")
    return value


def _read_secret(plane, name: str) -> str:
    document = json.loads(plane.kubectl("get", "secret", name, "--output=json").stdout)
    return base64.b64decode(document["data"]["password"]).decode()


def _restart(plane) -> None:
    """What the kubelet does for the marked manifest: the API server stops and starts with the same flags."""
    plane.stop_api_server()
    plane.start_api_server()


def test_a_secret_is_stored_encrypted_with_the_derived_key_and_no_plaintext(encrypted_control_plane):
    plane, dummy = encrypted_control_plane
    value = _create_secret(plane, "at-rest")
    stored = _raw(plane, "/registry/secrets/default/at-rest")
    assert stored.startswith(b"k8s:enc:aescbc:v1:key-etcdSecrets:"), stored[:40]
    assert value.encode() not in stored and base64.b64encode(value.encode()) not in stored
    assert _read_secret(plane, "at-rest") == value
    # Every Secret, the API server's own included (bootstrap tokens, service-account tokens), by the module's check.
    held = encryption.stored_keys(_etcdctl(plane))
    assert held and set(held.values()) == {"key-etcdSecrets"}, held


def test_after_the_rotation_every_secret_carries_the_new_keys_name(encrypted_control_plane):
    plane, config = encrypted_control_plane
    before = {name: _create_secret(plane, name) for name in ("rotated-1", "rotated-2")}
    plan = encryption.rotation_plan({"cp-0": encryption.read_generations(str(config))})
    assert (plan["old"], plan["new"], plan["problems"]) == (0, 1, [])
    for step in ("add", "promote"):
        keys = encryption.keys_after(step, encryption.read_generations(str(config)), 0, 1)
        assert encryption.write_config(str(config), ROOT_SECRETS, keys)
        _restart(plane)
    # Promoted, not rewritten: what was stored before keeps the old key's name, a new write gets the new one.
    assert _raw(plane, "/registry/secrets/default/rotated-1").startswith(encryption.storage_prefix(0))
    during = _create_secret(plane, "during")
    assert _raw(plane, "/registry/secrets/default/during").startswith(encryption.storage_prefix(1))
    rewritten = encryption.SecretRewriter(str(plane.bin / "kubectl"), str(plane.admin_kubeconfig)).rewrite()
    held = encryption.stored_keys(_etcdctl(plane))
    assert len(held) >= rewritten >= 3
    assert set(held.values()) == {"key-etcdSecrets-1"}, held
    assert encryption.write_config(
        str(config), ROOT_SECRETS, encryption.keys_after("finish", encryption.read_generations(str(config)), 0, 1)
    )
    _restart(plane)
    assert encryption.read_generations(str(config)) == [1]
    for name, value in dict(before, during=during).items():
        stored = _raw(plane, f"/registry/secrets/default/{name}")
        assert stored.startswith(b"k8s:enc:aescbc:v1:key-etcdSecrets-1:") and value.encode() not in stored
        assert _read_secret(plane, name) == value
    assert encryption.rotation_plan({"cp-0": [1]})["new"] == 2
