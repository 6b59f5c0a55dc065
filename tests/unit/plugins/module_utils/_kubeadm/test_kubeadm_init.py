# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""kubeadm_init's logic (_kubeadm/init.py) with kubeadm scripted at its one seam and the node's files under a temporary
root: a first init, a re-run, check mode, a failed init, an interrupted one, and the configuration replaced atomically.
kubeadm 1.20 itself runs these steps in tests/unit/lab/test_real_control_plane.py."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import (
    ADMIN_CONF,
    CA_CERT,
    DEFAULT_TOKEN_DESCRIPTION,
    INIT_RECORD,
    InitOptions,
    Kubeadm,
    KubeadmError,
    ca_cert_hash,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm.ca import make_ca
from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm.init import (
    InitRun,
    check_before_init,
    initialise,
)

CA_PEM = make_ca("kubernetes")[0]
OPTIONS = InitOptions(
    advertise_address="10.77.0.10", control_plane_endpoint="10.77.0.10:6443", pod_subnet="10.244.0.0/16"
)


class Scripted(Kubeadm):
    """kubeadm 1.31 whose init writes admin.conf and the CA, as the real one does; ``fail`` names a command that fails."""

    def __init__(self, root: str, fail: str = ""):
        super().__init__("/usr/bin/kubeadm", root)
        self.fail = fail
        self.commands: list[list[str]] = []

    def _run_command(self, argv, stdin=None):
        self.commands.append(argv)
        command = " ".join(argv[1:3])
        if self.fail and command.startswith(self.fail):
            return 1, "", f"{self.fail} went wrong"
        if command == "version -o":
            return 0, "v1.31.0\n", ""
        if argv[1] == "init":
            os.makedirs(os.path.dirname(self.path(CA_CERT)), exist_ok=True)
            with open(self.path(CA_CERT), "wb") as handle:
                handle.write(CA_PEM)
            with open(self.path(ADMIN_CONF), "w", encoding="ascii") as handle:
                handle.write("apiVersion: v1\n")
        if command == "token list":
            return 0, json.dumps({"token": "abcdef.0123456789abcdef", "description": DEFAULT_TOKEN_DESCRIPTION}), ""
        return 0, "", ""

    def ran(self, *words: str) -> bool:
        return any(argv[1 : 1 + len(words)] == list(words) for argv in self.commands)


@pytest.fixture
def node(tmp_path):
    (tmp_path / "etc" / "kubernetes").mkdir(parents=True)
    return tmp_path


def _run(node) -> InitRun:
    return InitRun(config_path=str(node / "etc" / "kubernetes" / "kubeadm-init.yaml"))


def test_a_first_init_runs_kubeadm_on_the_validated_config_and_records_it(node):
    kubeadm = Scripted(str(node))
    result = initialise(kubeadm, OPTIONS, _run(node))
    assert result["changed"] and result["config_validated"] and result["config_api_version"] == "v1beta4"
    assert kubeadm.ran("config", "validate") and kubeadm.ran("init") and kubeadm.ran("token", "delete", "abcdef")
    assert result["deleted_default_tokens"] == 1 and result["ca_cert_hash"] == ca_cert_hash(CA_PEM)
    config = node / "etc" / "kubernetes" / "kubeadm-init.yaml"
    assert config.stat().st_mode & 0o777 == 0o600
    cluster = list(yaml.safe_load_all(config.read_text()))[1]
    assert cluster["kubernetesVersion"] == "v1.31.0" and cluster["networking"]["podSubnet"] == "10.244.0.0/16"
    assert kubeadm.init_completed(result["ca_cert_hash"])


def test_an_initialised_node_changes_nothing(node):
    initialise(Scripted(str(node)), OPTIONS, _run(node))
    kubeadm = Scripted(str(node))
    result = initialise(kubeadm, OPTIONS, _run(node))
    assert not result["changed"] and result["ca_cert_hash"] == ca_cert_hash(CA_PEM)
    assert not kubeadm.ran("init") and not kubeadm.ran("token")


def test_check_mode_validates_and_writes_nothing(node):
    kubeadm = Scripted(str(node))
    result = initialise(kubeadm, OPTIONS, _run(node), check_mode=True, diff=True)
    assert result["changed"] and result["config_validated"] and not kubeadm.ran("init")
    assert result["diff"]["before"] == "" and "InitConfiguration" in result["diff"]["after"]
    assert sorted(os.listdir(node / "etc" / "kubernetes")) == []


def test_the_config_of_an_earlier_run_is_replaced_not_overwritten_in_place(node):
    """A reader holding the old file (or a crash halfway) never sees a truncated or mixed configuration."""
    config = node / "etc" / "kubernetes" / "kubeadm-init.yaml"
    config.write_text("an earlier rendering\n")
    earlier = node / "earlier.yaml"
    os.link(config, earlier)
    initialise(Scripted(str(node)), OPTIONS, _run(node))
    assert earlier.read_text() == "an earlier rendering\n"
    assert "InitConfiguration" in config.read_text() and not os.path.samefile(config, earlier)


def test_a_failed_init_says_the_node_needs_a_reset(node):
    with pytest.raises(KubeadmError) as failed:
        initialise(Scripted(str(node), fail="init --config"), OPTIONS, _run(node))
    assert "init --config went wrong" in str(failed.value) and "reset" in str(failed.value)
    assert failed.value.result["needs_reset"] and failed.value.result["config_validated"]


def test_an_invalid_config_fails_before_anything_changes(node):
    kubeadm = Scripted(str(node), fail="config validate")
    with pytest.raises(KubeadmError) as failed:
        initialise(kubeadm, OPTIONS, _run(node))
    assert "config validate went wrong" in str(failed.value) and "needs_reset" not in failed.value.result
    assert failed.value.result["config_api_version"] == "v1beta4" and not kubeadm.ran("init")
    assert sorted(os.listdir(node / "etc" / "kubernetes")) == []


def test_an_interrupted_init_is_completed_when_the_control_plane_answers(node):
    (node / ADMIN_CONF.lstrip("/")).write_text("apiVersion: v1\n")
    (node / "etc" / "kubernetes" / "pki").mkdir()
    (node / CA_CERT.lstrip("/")).write_bytes(CA_PEM)
    kubeadm = Scripted(str(node))
    result = initialise(kubeadm, OPTIONS, _run(node))
    assert result["changed"] and result["deleted_default_tokens"] == 1 and not kubeadm.ran("init")
    assert (node / INIT_RECORD.lstrip("/")).read_text() == ca_cert_hash(CA_PEM) + "\n"


def test_an_interrupted_init_whose_control_plane_is_gone_needs_a_reset(node):
    (node / ADMIN_CONF.lstrip("/")).write_text("apiVersion: v1\n")
    (node / "etc" / "kubernetes" / "pki").mkdir()
    (node / CA_CERT.lstrip("/")).write_bytes(CA_PEM)
    with pytest.raises(KubeadmError) as failed:
        initialise(Scripted(str(node), fail="token list"), OPTIONS, _run(node))
    assert "kubeadm init never completed" in str(failed.value) and failed.value.result["needs_reset"]
    assert not (node / INIT_RECORD.lstrip("/")).exists()


def test_the_check_before_the_lock_renders_what_the_init_would(node):
    kubeadm = Scripted(str(node))
    kubeadm._run_command = _with_kubelet(kubeadm._run_command)
    result = check_before_init(kubeadm, OPTIONS, _run(node), "/usr/bin/kubelet", check_mode=True)
    assert result["preflight"] == "checked" and result["config_api_version"] == "v1beta4"
    assert result["kubeadm_version"] == "v1.31.0" and not kubeadm.ran("init")


def _with_kubelet(run_command):
    def run(argv, stdin=None):
        if argv[0] == "/usr/bin/kubelet":
            return 0, "Kubernetes v1.31.0\n", ""
        return run_command(argv, stdin)

    return run
