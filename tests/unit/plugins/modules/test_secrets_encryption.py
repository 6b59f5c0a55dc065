# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The secrets_encryption module in-process on a node's files in a temp directory: a whole rotation step by step
(each step restarts once and then changes nothing), check mode, a step out of order, turning a cluster from before on,
and no key in any result."""

from __future__ import annotations

import base64
import json
import os
import sys
from pathlib import Path

import yaml

from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto import derive
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import RootSecrets
from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import encryption
from ansible_collections.confidential.kubernetes.plugins.modules import secrets_encryption

sys.path.insert(0, str(Path(__file__).resolve().parent))

from module_runner import module_outcome, run_main  # noqa: E402,F401  # pylint: disable=unused-import

SECRETS = RootSecrets(os.urandom(32), os.urandom(32), os.urandom(32))


class Node:
    def __init__(self, tmp_path: Path, encrypted: bool = True):
        self.config = tmp_path / "kubernetes" / "encryption-config.yaml"
        self.manifest = tmp_path / "kubernetes" / "manifests" / "kube-apiserver.yaml"
        self.secrets_file = tmp_path / "cluster-secrets.json"
        self.secrets_file.write_text(json.dumps(SECRETS.to_document()))
        self.secrets_file.chmod(0o600)
        self.manifest.parent.mkdir(parents=True)
        command = ["kube-apiserver"] + ([f"--encryption-provider-config={self.config}"] if encrypted else [])
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "kube-apiserver", "namespace": "kube-system"},
            "spec": {"containers": [{"name": "kube-apiserver", "command": command}]},
        }
        self.manifest.write_text(yaml.safe_dump(pod))
        self.manifest.chmod(0o600)
        if encrypted:
            encryption.write_config(str(self.config), SECRETS, [0])

    def run(self, step: str, check_mode: bool = False, **args) -> dict:
        return run_main(
            secrets_encryption.main,
            dict(
                step=step,
                path=str(self.config),
                secrets_file=str(self.secrets_file),
                api_server_manifest=str(self.manifest),
                _ansible_check_mode=check_mode,
                **args,
            ),
        )


def _no_key_in(result: dict) -> None:
    text = json.dumps(result)
    for generation in range(3):
        key = derive.etcd_secrets_key(SECRETS.master_key, SECRETS.master_salt, generation)
        assert base64.b64encode(key).decode() not in text and key.hex() not in text


def test_a_rotation_step_by_step_restarts_once_per_step_and_then_changes_nothing(tmp_path):
    node = Node(tmp_path)
    read = node.run("read")
    assert read["generations"] == [0] and read["api_server_uses_config"] and read["running_sha256"] is None
    for step, keys in (("add", [0, 1]), ("promote", [1, 0]), ("finish", [1])):
        planned = node.run(step, check_mode=True, old=0, new=1)
        assert planned["changed"] and planned["generations"] == keys
        done = node.run(step, old=0, new=1)
        assert not done["failed"] and done["changed"] and done["restarted"] and done["generations"] == keys
        assert done["running_sha256"] == done["config_sha256"]
        again = node.run(step, old=0, new=1)
        assert not again["changed"] and not again["restarted"]
        _no_key_in(done)
    assert encryption.read_generations(str(node.config)) == [1]


def test_a_step_out_of_order_fails_and_changes_nothing(tmp_path):
    node = Node(tmp_path)
    before = node.config.read_bytes(), node.manifest.read_bytes()
    failed = node.run("finish", old=0, new=1)
    assert failed["failed"] and "needs generation 1 first" in failed["msg"]
    assert (node.config.read_bytes(), node.manifest.read_bytes()) == before


def test_a_cut_short_step_marks_the_api_server_on_the_next_run(tmp_path):
    node = Node(tmp_path)
    encryption.write_config(str(node.config), SECRETS, [0, 1])
    resumed = node.run("add", old=0, new=1)
    assert resumed["changed"] and resumed["restarted"] and resumed["running_sha256"] == resumed["config_sha256"]


def test_a_cluster_from_before_is_turned_on_once(tmp_path):
    node = Node(tmp_path, encrypted=False)
    assert node.run("read")["generations"] is None
    refused = node.run("add", old=0, new=1)
    assert refused["failed"]
    done = node.run("enable")
    assert done["changed"] and done["restarted"] and done["generations"] == [0] and done["api_server_uses_config"]
    assert os.stat(node.config).st_mode & 0o777 == 0o600
    again = node.run("enable")
    assert not again["changed"]
    _no_key_in(done)
