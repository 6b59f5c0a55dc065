"""helm_release's main(): kubernetes.core's rhythm (check changed, run changed, re-run unchanged) with real helm 3 and 4
against a real API server (tests/control_plane.py)."""

from __future__ import annotations

import json

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from ansible_collections.confidential.kubernetes.plugins.modules import helm_release

from helm_charts import make_chart

SECRET = "db-p4ssw0rd-value"


@pytest.fixture
def cluster(kube_control_plane, helm_binary, request):
    """The session's control plane; each test and helm gets a namespace of its own (``cluster.namespace``)."""
    kube_control_plane.namespace = f"{request.node.originalname.replace('_', '-')}-{helm_binary.rsplit('-', 1)[1].replace('.', '-')}"
    return kube_control_plane


class AnsibleExitJson(Exception):
    pass


class AnsibleFailJson(Exception):
    pass


@pytest.fixture(autouse=True)
def module_exits(monkeypatch):
    """exit_json/fail_json raise with the result as Ansible would print it (no_log values masked)."""
    def exit_json(module, **kwargs):
        raise AnsibleExitJson(basic.remove_values(kwargs, module.no_log_values))

    def fail_json(module, msg, **kwargs):
        raise AnsibleFailJson(basic.remove_values({"msg": msg, **kwargs}, module.no_log_values))

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)


def run(args: dict, outcome=AnsibleExitJson, check=False, diff=False) -> dict:
    args = dict(args, _ansible_check_mode=check, _ansible_diff=diff)
    with patch_module_args(args), pytest.raises(outcome) as raised:
        helm_release.main()
    return raised.value.args[0]


def test_rhythm_and_secrets(cluster, helm_binary, tmp_path):
    values_file = tmp_path / "values.yaml"
    values_file.write_text("greeting: from-file\nextra: {a: 1}\n")
    args = dict(release_name="web", release_namespace=cluster.namespace, chart_ref=str(make_chart(tmp_path, version="1.0.0")),
                values={"greeting": "hello", "password": SECRET}, values_files=[str(values_file)],
                create_namespace=True, kubeconfig=str(cluster.admin_kubeconfig), binary_path=helm_binary,
                wait_timeout="30s")
    check = run(args, check=True, diff=True)
    assert check["changed"] and check["action"] == "install" and "command" not in check
    first = run(args)
    assert first["changed"] and first["status"] == "deployed" and first["revision"] == 1
    again = run(args)
    assert not again["changed"] and again["action"] == "none"
    upgrade_args = dict(args, values={"greeting": "hello", "password": SECRET + "-rotated"})
    planned = run(upgrade_args, check=True, diff=True)
    assert planned["changed"] and planned["action"] == "upgrade" and planned["revision"] == 1
    printed = json.dumps([check, first, again, planned])
    assert SECRET not in printed
    values_diff = planned["diff"][0]
    assert "password: <masked:" in values_diff["before"] and "password: <masked:" in values_diff["after"]
    assert values_diff["before"] != values_diff["after"]
    assert run(upgrade_args)["revision"] == 2
    assert not run(upgrade_args)["changed"]


def test_policy_refusal(cluster, helm_binary, tmp_path):
    args = dict(release_name="web", release_namespace=cluster.namespace, chart_ref=str(make_chart(tmp_path, version="2.0.0")),
                create_namespace=True, kubeconfig=str(cluster.admin_kubeconfig), binary_path=helm_binary)
    run(args)
    older = str(make_chart(tmp_path, version="1.9.0"))
    failed = run(dict(args, chart_ref=older), AnsibleFailJson)
    assert failed["policy"] == "downgrade" and "refusing to downgrade from 2.0.0 to 1.9.0" in failed["msg"]
    assert "set skip_version_policy" in failed["msg"] and not failed["changed"]
    # force is helm's --force, as in kubernetes.core.helm: it replaces resources and leaves the policy alone.
    forced = run(dict(args, chart_ref=older, force=True), AnsibleFailJson)
    assert forced["policy"] == "downgrade" and not forced["changed"]
    downgraded = run(dict(args, chart_ref=older, skip_version_policy=True))
    assert downgraded["changed"] and downgraded["chart_version"] == "1.9.0" and downgraded["revision"] == 2


def test_force_is_helms_replacement_flag(cluster, helm_binary, tmp_path):
    args = dict(release_name="web", release_namespace=cluster.namespace, chart_ref=str(make_chart(tmp_path, version="1.0.0")),
                create_namespace=True, kubeconfig=str(cluster.admin_kubeconfig), binary_path=helm_binary, force=True)
    first = run(args)
    assert first["revision"] == 1 and ("--force-replace" if first["helm_major_version"] == 4 else "--force") in first["command"]
    upgraded = run(dict(args, chart_ref=str(make_chart(tmp_path, version="1.0.1"))))
    assert upgraded["status"] == "deployed" and upgraded["revision"] == 2
    assert not run(dict(args, chart_ref=str(make_chart(tmp_path, version="1.0.1"))))["changed"]


def test_values_is_an_alias_of_release_values(cluster, helm_binary, tmp_path):
    args = dict(release_name="web", release_namespace=cluster.namespace, chart_ref=str(make_chart(tmp_path, version="1.0.0")),
                create_namespace=True, kubeconfig=str(cluster.admin_kubeconfig), binary_path=helm_binary)
    assert run(dict(args, release_values={"greeting": "hello", "password": SECRET}))["revision"] == 1
    again = run(dict(args, values={"greeting": "hello", "password": SECRET}))
    assert not again["changed"] and SECRET not in json.dumps(again)
    assert run(dict(args, values={"greeting": "bye"}), check=True)["action"] == "upgrade"
