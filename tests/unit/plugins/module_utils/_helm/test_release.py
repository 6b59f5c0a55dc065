"""helm_release logic: change detection, Helm 3/4 command lines, values handling, failures; with a scripted runner."""

from __future__ import annotations

import json
import os
import stat

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.chart import (
    ChartError,
    ChartRef,
    resolve_chart,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.policy import VersionPolicyError
from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.release import (
    ReleaseFailed,
    ReleaseManager,
    plan_release,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.runner import (
    DeployedRelease,
    Helm,
    HelmError,
    ReleasePendingError,
    ReleaseRequest,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.values import (
    ValueMasker,
    merge_values,
    requested_values,
    values_equal,
)

from helm_charts import make_chart

CHART = ChartRef("gadgets", "1.1.0", True)


def deployed(status="deployed", version="1.1.0", name="gadgets", revision=3):
    return DeployedRelease("web", "apps", revision, status, name, version)


@pytest.mark.parametrize(
    "release, values_deployed, values_wanted, action",
    [
        pytest.param(None, {}, {}, "install", id="no release: install"),
        pytest.param(deployed("uninstalled"), {}, {}, "install", id="uninstalled with history: install"),
        pytest.param(deployed(), {"a": 1}, {"a": 1}, "none", id="same chart and values: nothing"),
        pytest.param(deployed(), None, {}, "none", id="no values deployed, none asked"),
        pytest.param(deployed(), {"a": 1.0}, {"a": 1}, "none", id="JSON number equality"),
        pytest.param(deployed(), {"a": 1}, {"a": 2}, "upgrade", id="values differ"),
        pytest.param(deployed(), {"a": {"b": 1}}, {"a": {"b": 1, "c": 2}}, "upgrade", id="nested key added"),
        pytest.param(deployed(version="1.0.0"), {}, {}, "upgrade", id="new chart version"),
        pytest.param(deployed("failed"), {}, {}, "upgrade", id="failed latest revision"),
        pytest.param(deployed("superseded"), {}, {}, "upgrade", id="latest not deployed"),
    ],
)
def test_change_detection(release, values_deployed, values_wanted, action):
    assert plan_release(release, values_deployed, CHART, values_wanted).action == action


@pytest.mark.parametrize("status", ["pending-install", "pending-upgrade", "pending-rollback"])
def test_pending_release_is_a_clear_error(status):
    with pytest.raises(ReleasePendingError) as pending:
        plan_release(deployed(status), {}, CHART, {})
    assert f"stuck in {status} (revision 3)" in str(pending.value)
    assert "helm rollback web" in str(pending.value)


def test_policy_applies_before_change_detection():
    with pytest.raises(VersionPolicyError):
        plan_release(deployed(version="1.2.0"), {}, CHART, {})
    assert plan_release(deployed(version="1.2.0"), {}, CHART, {}, skip_version_policy=True).action == "upgrade"


def test_another_chart_is_refused_unless_the_policy_is_skipped():
    with pytest.raises(HelmError, match="runs chart other, not gadgets.*set skip_version_policy"):
        plan_release(deployed(name="other"), {}, CHART, {})
    assert plan_release(deployed(name="other"), {}, CHART, {}, skip_version_policy=True).action == "upgrade"


def test_values_merge_like_helm(tmp_path):
    first = tmp_path / "a.yaml"
    first.write_text("image: {tag: v1, pull: Always}\nreplicas: 1\nkeep: yes\n")
    second = tmp_path / "b.yaml"
    second.write_text("image: {tag: v2}\nkeep: null\n")
    merged = requested_values([str(first), str(second)], {"replicas": 3})
    assert merged == {"image": {"tag": "v2", "pull": "Always"}, "replicas": 3}
    assert merge_values({"a": [1, 2]}, {"a": [3]}) == {"a": [3]}
    assert values_equal(None, {}) and not values_equal({"a": "1"}, {"a": 1})


def test_values_file_that_is_not_a_map(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ValueError, match="must hold a map"):
        requested_values([str(bad)], {})


def test_masker_hides_values_but_shows_keys_and_equality():
    masker = ValueMasker()
    masked = masker.mask({"db": {"password": "hunter22", "user": "app"}, "n": 3})
    assert set(masked) == {"db", "n"} and "hunter22" not in json.dumps(masked)
    assert masker.mask({"x": "hunter22"})["x"] == masked["db"]["password"]
    assert ValueMasker().fingerprint("hunter22") != masker.fingerprint("hunter22")
    text = masker.scrub_text("password: hunter22\ndata: aHVudGVyMjI=\n", {"p": "hunter22"})
    assert "hunter22" not in text and "aHVudGVyMjI=" not in text


def test_resolve_chart(tmp_path):
    archive = make_chart(tmp_path, version="1.2.0")
    assert resolve_chart(str(archive), None, None) == ChartRef("gadgets", "1.2.0", True)
    with pytest.raises(ChartError, match="not the pinned chart_version 1.3.0"):
        resolve_chart(str(archive), "1.3.0", None)
    with pytest.raises(ChartError, match="not found"):
        resolve_chart(str(tmp_path / "missing.tgz"), None, None)
    with pytest.raises(ChartError, match="chart_version is required"):
        resolve_chart("cilium", None, "https://helm.cilium.io")
    assert resolve_chart("cilium", "1.16.5", "https://helm.cilium.io") == ChartRef("cilium", "1.16.5", False)
    (tmp_path / "junk.tgz").write_bytes(b"not gzip")
    with pytest.raises(ChartError, match="not a gzipped chart archive"):
        resolve_chart(str(tmp_path / "junk.tgz"), None, None)


class ScriptedHelm(Helm):
    """Answers helm command lines from a script; records argv and what the values file held at call time."""

    def __init__(self, version="v3.16.3+gcfd0749", status=None, values=None, upgrade=(0, "", ""), after=None):
        super().__init__("helm", "/etc/kubernetes/admin.conf", None)
        self.version = version
        self.release = status
        self.values = values or {}
        self.upgrade_result = upgrade
        self.after = after
        self.calls: list[list[str]] = []
        self.values_files: list[tuple[str, int, dict]] = []

    def _metadata_json(self, release):
        """``helm get metadata -o json`` as helm 3.17 prints it."""
        return json.dumps(
            {
                "name": release.name,
                "chart": release.chart_name,
                "version": release.chart_version,
                "appVersion": release.chart_version,
                "namespace": release.namespace,
                "revision": release.revision,
                "status": release.status,
                "deployedAt": "2026-11-24T02:27:03Z",
            }
        )

    def _run_command(self, argv, data=None):
        self.calls.append(argv)
        verb = argv[1]
        if verb == "version":
            return 0, self.version + "\n", ""
        if argv[1:3] == ["get", "metadata"]:
            if self.release is None:
                return 1, "", "Error: release: not found\n"
            return 0, self._metadata_json(self.release), ""
        if verb == "get":
            return 0, json.dumps(self.values or None), ""
        if verb == "upgrade":
            path = argv[argv.index("--values") + 1]
            self.values_files.append((path, stat.S_IMODE(os.stat(path).st_mode), json.load(open(path))))
            if self.upgrade_result[0] == 0 or self.after is not None:
                self.release = self.after or DeployedRelease(
                    "web", "apps", (self.release.revision + 1) if self.release else 1, "deployed", "gadgets", "1.0.0"
                )
            return self.upgrade_result
        if verb == "rollback":
            return 0, "Rollback was a success! Happy Helming!\n", ""
        raise AssertionError(f"unexpected helm call {argv}")


def request(chart, **kwargs):
    return ReleaseRequest("web", "apps", str(chart), **kwargs)


@pytest.mark.parametrize(
    "version, wait, atomic, present, absent",
    [
        pytest.param(
            "v3.16.3+gcfd0749", True, True, ["--wait", "--atomic"], ["--rollback-on-failure"], id="helm 3 atomic"
        ),
        pytest.param("v3.16.3+gcfd0749", False, True, [], ["--wait", "--atomic"], id="helm 3 skip wait"),
        pytest.param("v3.16.3+gcfd0749", True, False, ["--wait"], ["--atomic"], id="helm 3 not atomic"),
        pytest.param(
            "v4.1.1+g5caf004",
            True,
            True,
            ["--wait=watcher", "--rollback-on-failure"],
            ["--atomic", "--wait"],
            id="helm 4 atomic",
        ),
        pytest.param(
            "v4.0.0", False, True, [], ["--wait=watcher", "--rollback-on-failure", "--atomic"], id="helm 4 skip wait"
        ),
    ],
)
def test_install_command_line(tmp_path, version, wait, atomic, present, absent):
    chart = make_chart(tmp_path)
    helm = ScriptedHelm(version)
    secret = {"password": "hunter22"}
    result = ReleaseManager(helm, request(chart, wait=wait, atomic=atomic), secret).ensure(False, False)
    assert result["changed"] and result["action"] == "install" and result["status"] == "deployed"
    argv = result["command"]
    assert argv[:5] == ["helm", "upgrade", "--install", "web", str(chart)]
    assert ["--namespace", "apps"] == argv[5:7] and "--reset-values" in argv and "--timeout" in argv
    for flag in present:
        assert flag in argv
    for flag in absent:
        assert flag not in argv
    assert not any("hunter22" in a for a in argv)
    path, mode, content = helm.values_files[0]
    assert mode == 0o600 and content == secret and not os.path.exists(path)


@pytest.mark.parametrize(
    "version, force, present, absent",
    [
        pytest.param("v3.16.3+gcfd0749", True, ["--force"], ["--force-replace"], id="helm 3 force"),
        pytest.param(
            "v4.1.1+g5caf004", True, ["--force-replace", "--server-side=false"], ["--force"], id="helm 4 force"
        ),
        pytest.param("v3.16.3+gcfd0749", False, [], ["--force", "--force-replace"], id="helm 3 no force"),
        pytest.param(
            "v4.1.1+g5caf004", False, [], ["--force", "--force-replace", "--server-side=false"], id="helm 4 no force"
        ),
    ],
)
def test_force_is_helms_resource_replacement(tmp_path, version, force, present, absent):
    argv = ReleaseManager(ScriptedHelm(version), request(make_chart(tmp_path), force=force), {}).ensure(False, False)[
        "command"
    ]
    assert all(flag in argv for flag in present) and not any(flag in argv for flag in absent)


def test_helm_2_is_refused(tmp_path):
    with pytest.raises(HelmError, match="Helm 3 or 4 is needed"):
        ReleaseManager(ScriptedHelm("v2.17.0"), request(make_chart(tmp_path)), {}).ensure(False, False)


def test_rhythm_check_mode_then_unchanged(tmp_path):
    chart = make_chart(tmp_path, version="1.1.0")
    helm = ScriptedHelm(status=deployed(version="1.1.0"), values={"a": 1})
    assert ReleaseManager(helm, request(chart), {"a": 1}).ensure(False, False)["changed"] is False
    check = ReleaseManager(helm, request(chart), {"a": 2}).ensure(True, False)
    assert check["changed"] and check["action"] == "upgrade" and "command" not in check
    assert not any(c[1] == "upgrade" for c in helm.calls)


def test_failed_upgrade_reports_helms_message_and_what_is_deployed(tmp_path):
    chart = make_chart(tmp_path, version="1.1.0")
    message = (
        "Error: UPGRADE FAILED: release web failed, and has been rolled back due to atomic being set: "
        "pre-upgrade hooks failed: 1 error occurred:\n\t* job failed: BackoffLimitExceeded\n"
    )
    helm = ScriptedHelm(
        status=deployed(version="1.0.0"), upgrade=(1, "", message), after=deployed(revision=5, version="1.0.0")
    )
    with pytest.raises(ReleaseFailed) as failed:
        ReleaseManager(helm, request(chart), {}).ensure(False, False)
    assert str(failed.value).startswith("UPGRADE FAILED: release web failed, and has been rolled back")
    assert failed.value.result["rolled_back"] and failed.value.result["deployed_chart_version"] == "1.0.0"
    assert not any(c[1] == "rollback" for c in helm.calls)


def test_skip_wait_failure_is_rolled_back_by_the_module(tmp_path):
    chart = make_chart(tmp_path, version="1.1.0")
    helm = ScriptedHelm(
        status=deployed(version="1.0.0", revision=4),
        upgrade=(1, "", "Error: UPGRADE FAILED: boom\n"),
        after=deployed(status="failed", revision=5),
    )
    with pytest.raises(ReleaseFailed) as failed:
        ReleaseManager(helm, request(chart, wait=False), {}).ensure(False, False)
    assert "rolled back to revision 4" in str(failed.value)
    assert ["helm", "rollback", "web", "4"] == [c for c in helm.calls if c[1] == "rollback"][0][:4]


def test_unreachable_repository_is_helms_error(tmp_path):
    refused = (
        'Error: looks like "http://127.0.0.1:9/charts" is not a valid chart repository or cannot be reached: '
        'Get "http://127.0.0.1:9/charts/index.yaml": dial tcp 127.0.0.1:9: connect: connection refused\n'
    )
    helm = ScriptedHelm(upgrade=(1, "", refused))
    req = ReleaseRequest("web", "apps", "cilium", chart_version="1.16.5", chart_repo_url="http://127.0.0.1:9/charts")
    with pytest.raises(ReleaseFailed, match="cannot be reached") as failed:
        ReleaseManager(helm, req, {}).ensure(False, False)
    argv = failed.value.result["command"]
    assert (
        argv[argv.index("--repo") + 1] == "http://127.0.0.1:9/charts" and argv[argv.index("--version") + 1] == "1.16.5"
    )


def test_refusal_by_helm_is_not_a_change(tmp_path):
    chart = make_chart(tmp_path, version="1.1.0")
    helm = ScriptedHelm(
        status=deployed(version="1.0.0", revision=2),
        upgrade=(1, "", "Error: UPGRADE FAILED: values don't meet the specifications of the schema(s)\n"),
        after=deployed(version="1.0.0", revision=2),
    )
    with pytest.raises(ReleaseFailed) as failed:
        ReleaseManager(helm, request(chart), {"greeting": 1}).ensure(False, False)
    assert failed.value.result["changed"] is False and failed.value.result["revision"] == 2


def test_helm_4_log_lines_before_the_error_are_left_out(tmp_path):
    """Helm 4 prints slog lines before ``Error:``; the task's message is helm's error alone."""
    logged = (
        'time=2026-11-24T02:27:04Z level=WARN msg="upgrade failed" name=web error="context deadline exceeded"\n'
        "Error: UPGRADE FAILED: pre-upgrade hooks failed: timed out waiting for the condition\n"
    )
    helm = ScriptedHelm(
        "v4.1.4+g05fa379", status=deployed(version="1.0.0"), upgrade=(1, "", logged), after=deployed(version="1.0.0")
    )
    with pytest.raises(ReleaseFailed) as failed:
        ReleaseManager(helm, request(make_chart(tmp_path, version="1.1.0")), {}).ensure(False, False)
    assert str(failed.value) == "UPGRADE FAILED: pre-upgrade hooks failed: timed out waiting for the condition"
