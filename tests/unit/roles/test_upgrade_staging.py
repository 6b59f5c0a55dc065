"""The upgrade role stages (copies to the node) only the releases its plan finds out of date, and applies exactly them:
an up-to-date release costs the plan alone, a re-run stages nothing, a refusal stages nothing. Real helm 3 against the
real API server on loopback; the controller is the node."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.release import ReleaseManager
from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.runner import Helm, ReleaseRequest

import control_plane
from helm_charts import make_chart

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
SECRET = "s3cret-from-a-values-file"
# A key only the values file has: not even the keys of a values file may appear in the output.
FILE_KEY = "keyOnlyInTheValuesFile"
NAMESPACE = "staging-apps"


@pytest.fixture
def helm(kube_control_plane) -> Helm:
    return Helm(str(control_plane.binaries_dir() / "helm-3.17.2"), str(kube_control_plane.admin_kubeconfig))


@pytest.fixture(scope="module")
def charts(tmp_path_factory) -> dict:
    directory = tmp_path_factory.mktemp("charts")
    unpacked = directory / "unpacked"
    with tarfile.open(make_chart(directory, version="1.1.0", crds=False, secret=True)) as tar:
        tar.extractall(unpacked, filter="data")
    values_file = directory / "secret-values.yaml"
    values_file.write_text(f"password: {SECRET}\n{FILE_KEY}: 1\n")
    values_file.chmod(0o600)
    return {
        "1.0.0": str(make_chart(directory, version="1.0.0", crds=False, secret=True)),
        # A chart directory, given with a trailing slash (the role copies the directory, not its content).
        "1.1.0 directory": f"{unpacked / 'gadgets'}/",
        "values file": str(values_file),
    }


def _play(tmp_path: Path, helm: Helm, releases: list[dict], *flags: str) -> subprocess.CompletedProcess:
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "localhost",
                    "gather_facts": False,
                    "tasks": [{"ansible.builtin.include_role": {"name": "confidential.kubernetes.upgrade"}}],
                }
            ]
        )
    )
    extra = dict(
        ansible_python_interpreter=sys.executable,
        inventory_dir=str(tmp_path),
        upgrade_releases=releases,
        upgrade_kubeconfig=helm.kubeconfig,
        upgrade_controller_kubeconfig=helm.kubeconfig,
        upgrade_helm_binary=helm.binary,
        upgrade_wait_timeout="30s",
    )
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"),
        ANSIBLE_NOCOLOR="1",
        TMPDIR=str(tmp_path),
    )
    return subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", "localhost,", "-c", "local", "-e", json.dumps(extra), str(playbook), *flags],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )


def _task(run: subprocess.CompletedProcess, name: str) -> str:
    """What the run printed for one of the role's tasks ('' when it did not run)."""
    match = re.search(
        rf"TASK \[confidential\.kubernetes\.upgrade : {re.escape(name)}\] \**\n(.*?)(?=\nTASK \[|\nPLAY RECAP)",
        run.stdout,
        re.S,
    )
    return match.group(1) if match else ""


def _staged_items(run: subprocess.CompletedProcess) -> set[int]:
    return {
        int(item)
        for item in re.findall(
            r"^ok: \[localhost\] => \(item=(\d+)\)",
            _task(run, "Copy the local charts to install or upgrade to the node"),
            re.M,
        )
    }


def _recap(run: subprocess.CompletedProcess) -> dict:
    match = re.search(r"localhost\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", run.stdout)
    assert match, run.stdout + run.stderr
    return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, match.groups())))


def _deployed(helm: Helm, name: str) -> tuple[int, str] | None:
    status = helm.status(name, NAMESPACE)
    return (status.revision, status.chart_version) if status else None


def test_only_out_of_date_releases_are_staged_and_applied(tmp_path, kube_control_plane, helm, charts):
    for name in ("steady", "moving"):
        request = ReleaseRequest(name, NAMESPACE, charts["1.0.0"], create_namespace=True, wait_timeout="30s")
        ReleaseManager(helm, request, {"greeting": "hi"}).ensure(check_mode=False, diff=False)
    releases = [
        dict(release_name="steady", release_namespace=NAMESPACE, chart_ref=charts["1.0.0"], values={"greeting": "hi"}),
        dict(
            release_name="moving",
            release_namespace=NAMESPACE,
            chart_ref=charts["1.1.0 directory"],
            values={"greeting": "hi"},
        ),
        dict(
            release_name="fresh",
            release_namespace=NAMESPACE,
            chart_ref=charts["1.0.0"],
            values_files=[charts["values file"]],
            release_values={"greeting": "hello"},
        ),
    ]
    first = _play(tmp_path, helm, releases, "-vvv")
    assert first.returncode == 0, first.stdout + first.stderr
    assert SECRET not in first.stdout + first.stderr and FILE_KEY not in first.stdout + first.stderr
    assert _staged_items(first) == {1, 2}
    for line in (
        f"{NAMESPACE}/steady: 1.0.0 -> 1.0.0 (none, unchanged)",
        f"{NAMESPACE}/moving: 1.0.0 -> 1.1.0 (upgrade, changed)",
        f"{NAMESPACE}/fresh: - -> 1.0.0 (install, changed)",
    ):
        assert line in first.stdout
    assert re.search(rf"backup: {re.escape(str(tmp_path))}/upgrades/upgrade-\d{{8}}T\d{{6}}Z", first.stdout)
    assert [_deployed(helm, name) for name in ("steady", "moving", "fresh")] == [
        (1, "1.0.0"),
        (2, "1.1.0"),
        (1, "1.0.0"),
    ]
    secret = json.loads(
        kube_control_plane.kubectl("-n", NAMESPACE, "get", "secret", "fresh-credentials", "-o", "json").stdout
    )
    assert base64.b64decode(secret["data"]["password"]).decode() == SECRET
    assert not list(tmp_path.glob("ck-upgrade-*")), "the staging directory is removed"

    again = _play(tmp_path, helm, releases)
    assert again.returncode == 0, again.stdout + again.stderr
    assert _recap(again)["changed"] == 0
    assert _task(again, "Make a private staging directory on the node").strip() == "skipping: [localhost]"
    assert not _staged_items(again)
    for name, version in (("steady", "1.0.0"), ("moving", "1.1.0"), ("fresh", "1.0.0")):
        assert f"{NAMESPACE}/{name}: {version} -> {version} (none, unchanged)" in again.stdout
    assert "backup: none (no existing release upgraded)" in again.stdout

    Path(charts["values file"]).write_text(f"password: {SECRET}-rotated\n{FILE_KEY}: 1\n")
    rotated = _play(tmp_path, helm, releases)
    assert rotated.returncode == 0, rotated.stdout + rotated.stderr
    assert _staged_items(rotated) == {2}
    assert f"{NAMESPACE}/fresh: 1.0.0 -> 1.0.0 (upgrade, changed)" in rotated.stdout
    assert _deployed(helm, "fresh") == (2, "1.0.0")


def test_a_refused_plan_stages_and_changes_nothing(tmp_path, helm, charts):
    request = ReleaseRequest("ahead", NAMESPACE, charts["1.1.0 directory"], create_namespace=True, wait_timeout="30s")
    ReleaseManager(helm, request, {}).ensure(check_mode=False, diff=False)
    before = _deployed(helm, "steady")
    releases = [
        dict(release_name="steady", release_namespace=NAMESPACE, chart_ref=charts["1.0.0"], values={"greeting": "bye"}),
        dict(release_name="ahead", release_namespace=NAMESPACE, chart_ref=charts["1.0.0"]),
    ]
    run = _play(tmp_path, helm, releases)
    assert run.returncode != 0
    # The refusal names the role's variables, not the module's option (a name the role would ignore).
    assert (
        "release ahead: refusing to downgrade from 1.1.0 to 1.0.0 (set upgrade_skip_version_policy or that release's"
        " skip_version_policy in upgrade_releases to override). Nothing was changed." in run.stdout
    ), run.stdout
    assert not _task(run, "Make a private staging directory on the node")
    assert _deployed(helm, "steady") == before and _deployed(helm, "ahead") == (1, "1.1.0")
