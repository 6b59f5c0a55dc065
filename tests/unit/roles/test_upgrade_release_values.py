"""The upgrade role takes a release's values as release_values (kubernetes.core.helm's name) or values (its alias),
and refuses a release that gives both before anything runs; on an air-gapped site it refuses, by name and before
anything runs, a release whose chart repository is not one of the site's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))


def _run_upgrade(tmp_path: Path, **variables) -> subprocess.CompletedProcess:
    play = [{"hosts": "localhost", "gather_facts": False, "roles": [{"role": "confidential.kubernetes.upgrade"}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"),
        ANSIBLE_NOCOLOR="1",
        TMPDIR=str(tmp_path),
    )
    extra = dict(ansible_python_interpreter=sys.executable, **variables)
    return subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", "localhost,", "-c", "local", "-e", json.dumps(extra), str(tmp_path / "play.yml")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def test_values_under_both_names_are_refused_naming_the_release(tmp_path):
    releases = [
        {"release_name": "fine", "release_namespace": "apps", "chart_ref": str(tmp_path / "a.tgz"), "values": {"a": 1}},
        {
            "release_name": "twice",
            "release_namespace": "apps",
            "chart_ref": str(tmp_path / "b.tgz"),
            "release_values": {"a": 1},
            "values": {"a": 2},
        },
    ]
    run = _run_upgrade(tmp_path, upgrade_releases=releases)
    assert run.returncode != 0
    assert "twice: give the values as release_values or as values (its alias), not both" in run.stdout
    assert "fine:" not in run.stdout and "TASK [confidential.kubernetes.upgrade : Plan every release" not in run.stdout


AIR_GAPPED_RELEASES = [
    {"release_name": "local", "release_namespace": "apps", "chart_ref": "/srv/charts/local-1.0.0.tgz"},
    {
        "release_name": "on-site",
        "release_namespace": "apps",
        "chart_ref": "app",
        "chart_version": "1.0.0",
        "chart_repo_url": "https://charts.example.internal/stable",
    },
    {
        "release_name": "public",
        "release_namespace": "apps",
        "chart_ref": "cilium",
        "chart_version": "1.18.4",
        "chart_repo_url": "https://helm.cilium.io",
    },
]


def test_an_air_gapped_site_refuses_a_chart_repository_outside_the_site_by_name(tmp_path):
    run = _run_upgrade(
        tmp_path,
        upgrade_releases=AIR_GAPPED_RELEASES,
        confidential_air_gapped=True,
        confidential_site_chart_repositories=["https://charts.example.internal/"],
    )
    assert run.returncode != 0
    assert (
        "public (https://helm.cilium.io): a chart repository outside the site, and the site is air-gapped" in run.stdout
    )
    assert "on-site (" not in run.stdout and "local (" not in run.stdout
    assert "TASK [confidential.kubernetes.upgrade : Plan every release" not in run.stdout


def test_an_air_gapped_site_without_site_repositories_refuses_every_repository_chart(tmp_path):
    run = _run_upgrade(tmp_path, upgrade_releases=AIR_GAPPED_RELEASES, confidential_air_gapped=True)
    assert run.returncode != 0
    assert (
        "on-site (https://charts.example.internal/stable), public (https://helm.cilium.io): a chart repository"
        in run.stdout
    )


def test_a_site_with_internet_passes_the_repository_check(tmp_path):
    # The check passes; the run then stops at the plan, which needs a cluster (none here).
    run = _run_upgrade(tmp_path, upgrade_releases=AIR_GAPPED_RELEASES)
    assert "a chart repository outside the site, and the site is air-gapped" not in run.stdout
    assert "TASK [confidential.kubernetes.upgrade : Plan every release" in run.stdout
