"""helm_plan decides with what the controller reads of a release (resolve_inputs: the chart's name and version, the
merged values) exactly what helm_release decides with the chart and values files staged on the node, one case per way
the two could read a release differently; real helm 3 and 4 against a real API server (tests/control_plane.py)."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.chart import ChartError
from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.release import resolve_inputs
from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.runner import Helm
from ansible_collections.confidential.kubernetes.plugins.modules import helm_plan, helm_release

from helm_charts import make_chart
from module_runner import module_outcome, run_main  # noqa: F401  # pylint: disable=unused-import

COMPARED = (
    "msg",
    "policy",
    "action",
    "reason",
    "changed",
    "chart_name",
    "chart_version",
    "previous_chart_version",
    "previous_revision",
    "revision",
    "status",
)
# The fields of a release the node needs besides what the controller resolved (as the action plugin sends them).
NODE_KEYS = ("release_name", "release_namespace", "chart_ref", "chart_repo_url", "skip_version_policy")


def _decision(result: dict) -> dict:
    decision = dict({key: result.get(key) for key in COMPARED}, failed=result.get("failed", False))
    # helm_release returns kubernetes.core.helm's status dict; a plan, the latest revision's status alone.
    if isinstance(decision["status"], dict):
        decision["status"] = decision["status"]["status"]
    return decision


def _controller_file(path: str) -> str | None:
    return path if os.path.exists(path) else None


def _release(namespace: str, chart_ref, **options) -> dict:
    return dict(
        dict(
            release_name="web",
            release_namespace=namespace,
            chart_ref=str(chart_ref),
            chart_version=None,
            chart_repo_url=None,
            release_values={},
            values_files=[],
            skip_version_policy=None,
        ),
        **options,
    )


def _unpacked(archive: Path) -> Path:
    """The chart archive as a chart directory."""
    directory = archive.parent / archive.name.removesuffix(".tgz")
    with tarfile.open(archive) as tar:
        tar.extractall(directory, filter="data")
    return directory / "gadgets"


def _with_subchart_first(directory: Path) -> Path:
    """A chart archive that lists a subchart's Chart.yaml (another name and version) before the chart's own."""
    files = {
        "gadgets/charts/sub/Chart.yaml": "apiVersion: v2\nname: sub\nversion: 9.9.9\n",
        "gadgets/Chart.yaml": "apiVersion: v2\nname: gadgets\nversion: 1.0.0\n",
        "gadgets/values.yaml": "greeting: hello\n",
    }
    archive = directory / "gadgets-with-sub.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    return archive


def _values_files(directory: Path, *texts: str) -> list[str]:
    paths = []
    for index, text in enumerate(texts):
        path = directory / f"values-{index}.yaml"
        path.write_text(text)
        paths.append(str(path))
    return paths


# Each case: what is deployed (chart, values; None: nothing), the release as declared, what both must decide.
CASES = {
    "same archive and values": lambda d: (
        (make_chart(d), {"greeting": "hi"}),
        dict(release_values={"greeting": "hi"}),
        make_chart(d),
        "none",
    ),
    "a chart directory given with a trailing slash": lambda d: (
        (_unpacked(make_chart(d)), {}),
        {},
        str(_unpacked(make_chart(d))) + "/",
        "none",
    ),
    "values files merged as helm merges them, release_values on top": lambda d: (
        (make_chart(d), {"greeting": "from-file", "image": {"tag": "v2", "pull": "Always"}, "replicas": 3}),
        dict(
            values_files=_values_files(
                d, "greeting: from-file\nimage: {tag: v1, pull: Always}\nkeep: yes\n", "image: {tag: v2}\nkeep: null\n"
            ),
            release_values={"replicas": 3},
        ),
        make_chart(d),
        "none",
    ),
    "a values file that changed": lambda d: (
        (make_chart(d), {"greeting": "old"}),
        dict(values_files=_values_files(d, "greeting: new\n")),
        make_chart(d),
        "upgrade",
    ),
    "a new chart version": lambda d: ((make_chart(d), {}), {}, make_chart(d, version="1.1.0"), "upgrade"),
    "a pinned version with a v prefix": lambda d: (
        (make_chart(d), {}),
        dict(chart_version="v1.0.0"),
        make_chart(d),
        "none",
    ),
    "a subchart's Chart.yaml first in the archive": lambda d: (
        (_with_subchart_first(d), {}),
        {},
        _with_subchart_first(d),
        "none",
    ),
    "not installed": lambda d: (None, {}, make_chart(d), "install"),
    "a repository chart pinned to the deployed version": lambda d: (
        (make_chart(d), {}),
        dict(chart_version="1.0.0", chart_repo_url="http://127.0.0.1:9/charts"),
        "gadgets",
        "none",
    ),
    "a downgrade": lambda d: ((make_chart(d, version="1.1.0"), {}), {}, make_chart(d), "refused"),
    "another chart": lambda d: ((make_chart(d, name="widgets"), {}), {}, make_chart(d), "refused"),
}


@pytest.fixture
def cluster(kube_control_plane, helm_binary):
    return dict(kubeconfig=str(kube_control_plane.admin_kubeconfig), binary_path=helm_binary)


def _plan(cluster: dict, releases: list[dict]) -> dict:
    """helm_plan as its action plugin runs it: the controller's reading of each release in resolved."""
    return run_main(
        helm_plan.main,
        dict(
            cluster,
            releases=[{key: r[key] for key in NODE_KEYS} for r in releases],
            resolved=[resolve_inputs(r, _controller_file) for r in releases],
        ),
    )


def _staged(release: dict, staging: Path) -> dict:
    """The release as the upgrade role hands it to helm_release: its chart and values files copied to the node."""
    staging.mkdir()
    staged = dict(
        release,
        skip_version_policy=bool(release["skip_version_policy"]),
        values_files=[
            str(shutil.copy(path, staging / f"{index}.yaml")) for index, path in enumerate(release["values_files"])
        ],
    )
    if not release["chart_repo_url"]:
        source = Path(release["chart_ref"].rstrip("/"))
        staged["chart_ref"] = str(
            shutil.copytree(source, staging / source.name)
            if source.is_dir()
            else shutil.copy(source, staging / source.name)
        )
    return staged


@pytest.mark.parametrize("case", CASES, ids=str)
def test_the_plan_is_what_helm_release_decides_with_the_staged_chart(cluster, helm_binary, tmp_path, case):
    namespace = f"plan-{list(CASES).index(case)}-{helm_binary.rsplit('-', 1)[1].replace('.', '-')}"
    deployed, options, chart_ref, expected = CASES[case](tmp_path)
    if deployed:
        chart, values = deployed
        installed = run_main(
            helm_release.main,
            dict(
                cluster,
                release_name="web",
                release_namespace=namespace,
                chart_ref=str(chart),
                values=values,
                create_namespace=True,
            ),
        )
        assert installed["revision"] == 1, installed
    release = _release(namespace, chart_ref, **options)
    planned = _plan(cluster, [release])
    applied = run_main(
        helm_release.main, dict(_staged(release, tmp_path / "staging"), **cluster, _ansible_check_mode=True)
    )
    assert _decision(planned["plans"][0]) == _decision(applied)
    assert planned["failed"] == applied["failed"] and planned.get("msg") == applied.get("msg")
    assert planned["plans"][0].get("action", "refused") == expected, planned


def test_every_refusal_is_named_and_the_other_plans_are_kept(cluster, helm_binary, tmp_path):
    namespace = f"plan-refusals-{helm_binary.rsplit('-', 1)[1].replace('.', '-')}"
    newer, older = make_chart(tmp_path, version="1.1.0"), make_chart(tmp_path, version="1.0.0")
    for name in ("web", "api", "forced"):
        run_main(
            helm_release.main,
            dict(cluster, release_name=name, release_namespace=namespace, chart_ref=str(newer), create_namespace=True),
        )
    releases = [
        _release(namespace, newer, release_name="fresh"),
        _release(namespace, older),
        _release(namespace, older, release_name="api"),
        _release(namespace, older, release_name="forced", skip_version_policy=True),
    ]
    planned = _plan(dict(cluster, skip_version_policy=False), releases)
    assert planned["failed"] and not planned["changed"]
    assert planned["msg"].count("refusing to downgrade from 1.1.0 to 1.0.0") == 2
    assert planned["msg"].startswith("release web: ") and "; release api: " in planned["msg"]
    outcomes = [plan.get("action", plan.get("policy")) for plan in planned["plans"]]
    assert outcomes == ["install", "downgrade", "downgrade", "upgrade"]
    helm = Helm(helm_binary, cluster["kubeconfig"])
    assert helm.status("fresh", namespace) is None
    deployed = [helm.status(name, namespace) for name in ("web", "api", "forced")]
    assert [(release.revision, release.chart_version) for release in deployed] == [(1, "1.1.0")] * 3
    skipped = _plan(dict(cluster, skip_version_policy=True), releases)
    assert [plan["action"] for plan in skipped["plans"]] == ["install", "upgrade", "upgrade", "upgrade"]


def test_a_chart_the_controller_cannot_find_is_named(tmp_path):
    release = _release("apps", tmp_path / "nothing-9.9.9.tgz")
    with pytest.raises(ChartError, match=r"chart .*nothing-9\.9\.9\.tgz not found on the controller"):
        resolve_inputs(release, _controller_file)
    with pytest.raises(ChartError, match="not the pinned chart_version 1.1.0"):
        resolve_inputs(_release("apps", make_chart(tmp_path), chart_version="1.1.0"), _controller_file)
