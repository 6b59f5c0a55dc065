"""init_state, its action and its module together: the action derives the cluster ID from the controller's secrets file,
the module (run in-process against a real swtpm and a node's files in a temp root) decides, and the admin kubeconfig of
an initialised node lands on the controller 0600, fetched only when the controller's copy differs."""

from __future__ import annotations

import base64
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from ansible.parsing.dataloader import DataLoader

from ansible_collections.confidential.kubernetes.plugins.action.init_state import ActionModule
from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import Kubeadm
from ansible_collections.confidential.kubernetes.plugins.modules import init_state as init_state_module

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "module_utils" / "_ticket"))

from init_harness import ADMIN_KUBECONFIG, SECRETS, InitialisedNode  # noqa: E402
from module_runner import module_outcome, run_main  # noqa: E402,F401  # pylint: disable=unused-import


def run_module(args: dict) -> dict:
    return run_main(init_state_module.main, args)


class Controller:
    """The controller's secrets directory, and the action run against one node; ``fetched`` counts admin kubeconfig reads."""

    def __init__(self, tmp_path, node: InitialisedNode, monkeypatch):
        self.dir = tmp_path / "secrets"
        self.dir.mkdir()
        self.secrets_file = self.dir / "cluster-secrets.json"
        self.admin_kubeconfig = self.dir / "admin.conf"
        self.node = node
        self.fetched = 0
        monkeypatch.setattr(init_state_module, "Kubeadm", lambda: Kubeadm(root=str(node.root)))

    def keep_secrets(self, secrets, mode: int = 0o600) -> None:
        self.secrets_file.write_text(json.dumps(secrets.to_document()))
        os.chmod(self.secrets_file, mode)

    def _execute_module(self, module_name, module_args, task_vars):
        if module_name == "ansible.builtin.slurp":
            self.fetched += 1
            with open(self.node.kubeadm.path(module_args["src"]), "rb") as handle:
                return {"content": base64.b64encode(handle.read()).decode()}
        assert module_name == "confidential.kubernetes.init_state"
        return run_module(module_args)

    def run(self, check_mode: bool = False) -> dict:
        args = {
            "secrets_file": str(self.secrets_file),
            "admin_kubeconfig": str(self.admin_kubeconfig),
            "tcti": self.node.tcti,
            "lock_record": self.node.lock_record,
            "node_secrets_file": self.node.secrets_file,
        }
        task = SimpleNamespace(
            args=args,
            async_val=0,
            check_mode=check_mode,
            diff=False,
            action="confidential.kubernetes.init_state",
            no_log=False,
        )
        action = ActionModule(
            task,
            SimpleNamespace(_shell=SimpleNamespace(tmpdir=None), has_native_async=False),
            None,
            DataLoader(),
            None,
            None,
        )
        action._execute_module = self._execute_module
        return action.run(task_vars={})


@pytest.fixture
def controller(tmp_path, swtpm, monkeypatch):
    node = InitialisedNode(tmp_path, swtpm.tcti)
    controller = Controller(tmp_path, node, monkeypatch)
    controller.keep_secrets(node.secrets)
    return controller


def test_an_initialised_node_is_recognised_and_its_admin_kubeconfig_stored_once(controller):
    first = controller.run()
    assert not first["failed"] and first["initialised"] and first["cluster_id"] == controller.node.cluster_id
    assert first["changed"] and first["admin_kubeconfig_stored"] and controller.fetched == 1
    assert controller.admin_kubeconfig.read_bytes() == ADMIN_KUBECONFIG
    assert os.stat(controller.admin_kubeconfig).st_mode & 0o777 == 0o600
    again = controller.run()
    assert (
        again["initialised"]
        and not again["changed"]
        and not again["admin_kubeconfig_stored"]
        and controller.fetched == 1
    )


def test_a_changed_or_exposed_copy_on_the_controller_is_fetched_again(controller):
    controller.run()
    controller.admin_kubeconfig.write_bytes(b"stale")
    assert controller.run()["changed"] and controller.admin_kubeconfig.read_bytes() == ADMIN_KUBECONFIG
    os.chmod(controller.admin_kubeconfig, 0o644)
    assert controller.run()["changed"] and os.stat(controller.admin_kubeconfig).st_mode & 0o777 == 0o600
    assert controller.fetched == 3


def test_check_mode_reports_the_store_and_writes_nothing(controller):
    result = controller.run(check_mode=True)
    assert result["initialised"] and result["changed"] and result["admin_kubeconfig_stored"]
    assert not controller.admin_kubeconfig.exists() and controller.fetched == 0


def test_before_a_first_init_nothing_is_initialised_and_nothing_fetched(controller):
    controller.secrets_file.unlink()
    result = controller.run()
    assert not result["failed"] and not result["initialised"] and result["cluster_id"] is None
    assert "no cluster secrets yet" in result["reason"] and not result["changed"]
    assert not controller.admin_kubeconfig.exists() and controller.fetched == 0


def test_a_node_that_is_not_initialised_gets_its_reason_and_nothing_is_fetched(controller):
    os.unlink(controller.node.kubeadm.path(SECRETS))
    result = controller.run()
    assert not result["initialised"] and "keeps no root secrets" in result["reason"]
    assert not controller.admin_kubeconfig.exists() and controller.fetched == 0


def test_controller_secrets_readable_by_others_fail_before_the_node_is_asked(controller):
    controller.keep_secrets(controller.node.secrets, 0o644)
    result = controller.run()
    assert result["failed"] and "mode 0644" in result["msg"] and "initialised" not in result


def test_the_module_refuses_a_malformed_cluster_id(controller):
    result = run_module({"secrets_file": "unused", "cluster_id": "ABC", "tcti": controller.node.tcti})
    assert result["failed"] and "64 lower-case hex" in result["msg"]
