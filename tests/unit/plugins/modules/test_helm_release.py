"""helm_release's main(): kubernetes.core's rhythm (check changed, run changed, re-run unchanged) with real helm 3 and 4
against a real API server (tests/control_plane.py)."""

from __future__ import annotations

import json
import subprocess

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from ansible_collections.confidential.kubernetes.plugins.modules import helm_release

from helm_charts import make_chart

SECRET = "db-p4ssw0rd-value"


@pytest.fixture
def cluster(kube_control_plane, helm_binary, request):
    """The session's control plane; each test and helm gets a namespace of its own (``cluster.namespace``)."""
    kube_control_plane.namespace = (
        f"{request.node.originalname.replace('_', '-')}-{helm_binary.rsplit('-', 1)[1].replace('.', '-')}"
    )
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
    args = dict(
        release_name="web",
        release_namespace=cluster.namespace,
        chart_ref=str(make_chart(tmp_path, version="1.0.0")),
        values={"greeting": "hello", "password": SECRET},
        values_files=[str(values_file)],
        create_namespace=True,
        kubeconfig=str(cluster.admin_kubeconfig),
        binary_path=helm_binary,
        wait_timeout="30s",
    )
    check = run(args, check=True, diff=True)
    assert check["changed"] and check["action"] == "install" and "command" not in check
    first = run(args)
    assert first["changed"] and first["status"]["status"] == "deployed" and first["revision"] == 1
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
    args = dict(
        release_name="web",
        release_namespace=cluster.namespace,
        chart_ref=str(make_chart(tmp_path, version="2.0.0")),
        create_namespace=True,
        kubeconfig=str(cluster.admin_kubeconfig),
        binary_path=helm_binary,
    )
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
    args = dict(
        release_name="web",
        release_namespace=cluster.namespace,
        chart_ref=str(make_chart(tmp_path, version="1.0.0")),
        create_namespace=True,
        kubeconfig=str(cluster.admin_kubeconfig),
        binary_path=helm_binary,
        force=True,
    )
    first = run(args)
    assert (
        first["revision"] == 1
        and ("--force-replace" if first["helm_major_version"] == 4 else "--force") in first["command"]
    )
    upgraded = run(dict(args, chart_ref=str(make_chart(tmp_path, version="1.0.1"))))
    assert upgraded["status"]["status"] == "deployed" and upgraded["revision"] == 2
    assert not run(dict(args, chart_ref=str(make_chart(tmp_path, version="1.0.1"))))["changed"]


def test_values_is_an_alias_of_release_values(cluster, helm_binary, tmp_path):
    args = dict(
        release_name="web",
        release_namespace=cluster.namespace,
        chart_ref=str(make_chart(tmp_path, version="1.0.0")),
        create_namespace=True,
        kubeconfig=str(cluster.admin_kubeconfig),
        binary_path=helm_binary,
    )
    assert run(dict(args, release_values={"greeting": "hello", "password": SECRET}))["revision"] == 1
    again = run(dict(args, values={"greeting": "hello", "password": SECRET}))
    assert not again["changed"] and SECRET not in json.dumps(again)
    assert run(dict(args, values={"greeting": "bye"}), check=True)["action"] == "upgrade"


def helm_list(cluster, helm_binary) -> list[dict]:
    """What ``helm list`` shows in the test's namespace, read with helm itself."""
    every_status = ["--all"] if "helm-3" in helm_binary else []
    listed = subprocess.run(
        [
            helm_binary,
            "list",
            *every_status,
            "-n",
            cluster.namespace,
            "--kubeconfig",
            str(cluster.admin_kubeconfig),
            "-o",
            "json",
        ],
        capture_output=True,
        check=True,
        timeout=60,
    )
    return json.loads(listed.stdout or b"[]")


def test_status_is_kubernetes_core_helms_dict(cluster, helm_binary, tmp_path):
    args = dict(
        release_name="web",
        release_namespace=cluster.namespace,
        chart_ref=str(make_chart(tmp_path, version="1.0.0")),
        values={"password": SECRET},
        create_namespace=True,
        kubeconfig=str(cluster.admin_kubeconfig),
        binary_path=helm_binary,
    )
    assert run(args, check=True)["status"] is None
    status = run(args)["status"]
    (listed,) = helm_list(cluster, helm_binary)
    assert sorted(status) == ["app_version", "chart", "name", "namespace", "revision", "status", "updated"]
    assert (status["name"], status["namespace"], status["revision"], status["status"], status["chart"]) == (
        "web",
        cluster.namespace,
        "1",
        "deployed",
        "gadgets-1.0.0",
    )
    assert status["app_version"] == listed["app_version"] and status["updated"] == listed["updated"]
    assert "values" not in status and SECRET not in json.dumps(status)
    upgraded = run(dict(args, chart_ref=str(make_chart(tmp_path, version="1.0.1"))))["status"]
    assert (upgraded["revision"], upgraded["chart"]) == ("2", "gadgets-1.0.1") and upgraded["updated"] >= status[
        "updated"
    ]


def test_absent_uninstalls_with_kubernetes_core_rhythm(cluster, helm_binary, tmp_path):
    args = dict(
        release_name="web",
        release_namespace=cluster.namespace,
        chart_ref=str(make_chart(tmp_path, version="1.0.0")),
        create_namespace=True,
        kubeconfig=str(cluster.admin_kubeconfig),
        binary_path=helm_binary,
    )
    absent = dict(
        release_name="web",
        release_namespace=cluster.namespace,
        state="absent",
        wait_timeout="30s",
        kubeconfig=str(cluster.admin_kubeconfig),
        binary_path=helm_binary,
        backup_dir=str(tmp_path / "upgrades"),
        backup_kubeconfig=str(cluster.admin_kubeconfig),
    )
    run(args)
    check = run(absent, check=True)
    assert (check["changed"], check["action"], check["previous_revision"]) == (
        True,
        "uninstall",
        1,
    ) and "command" not in check
    assert [release["name"] for release in helm_list(cluster, helm_binary)] == ["web"]
    removed = run(absent)
    assert (removed["changed"], removed["action"], removed["status"], removed["revision"]) == (
        True,
        "uninstall",
        None,
        None,
    )
    wait_flag = "--wait=watcher" if removed["helm_major_version"] >= 4 else "--wait"
    assert removed["command"][1:3] == ["uninstall", "web"] and wait_flag in removed["command"]
    assert helm_list(cluster, helm_binary) == []
    again = run(absent)
    assert (again["changed"], again["action"], again["status"]) == (False, "none", None) and "command" not in again
    assert "does not exist" in again["reason"]
    assert not run(absent, check=True)["changed"]


def test_absent_needs_a_backup_and_present_a_chart(cluster, helm_binary):
    base = dict(
        release_name="web",
        release_namespace=cluster.namespace,
        binary_path=helm_binary,
        kubeconfig=str(cluster.admin_kubeconfig),
    )
    assert "backup_dir, backup_kubeconfig" in run(dict(base, state="absent"), AnsibleFailJson)["msg"]
    assert "chart_ref" in run(base, AnsibleFailJson)["msg"]


def test_failed_uninstall_names_release_and_namespace(cluster, helm_binary, tmp_path):
    args = dict(
        release_name="web",
        release_namespace=cluster.namespace,
        chart_ref=str(make_chart(tmp_path, version="1.0.0")),
        create_namespace=True,
        kubeconfig=str(cluster.admin_kubeconfig),
        binary_path=helm_binary,
    )
    run(args)
    # A pre-delete hook Job never completes where no kubelet runs pods: helm times out and the uninstall fails.
    run(
        dict(
            args, chart_ref=str(make_chart(tmp_path, version="1.0.1", hook="pre-delete")), wait_timeout="5s", wait=False
        )
    )
    failed = run(
        dict(
            args,
            chart_ref=None,
            state="absent",
            wait_timeout="5s",
            backup_dir=str(tmp_path),
            backup_kubeconfig=str(cluster.admin_kubeconfig),
        ),
        AnsibleFailJson,
    )
    assert failed["msg"].startswith(f"helm uninstall of release web in namespace {cluster.namespace} failed: ")
    # helm's own words: Helm 3 times out, Helm 4 names the hook Job that is not ready.
    assert ("web-migrate not ready" if "helm-4" in helm_binary else "timed out waiting for the condition") in failed[
        "msg"
    ]
    assert failed["action"] == "uninstall"
    assert failed["status"]["name"] == "web", "helm still lists the release whose uninstall failed"
