"""The kubernetes_artifacts action in a real ansible-playbook run against a real HTTP mirror on 127.0.0.1."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from ansible_collections.confidential.kubernetes.plugins.module_utils import _versions

REPO = Path(__file__).resolve().parents[4]
TABLE = _versions.load_table()
VERSIONS = _versions.supported(TABLE)
NEWEST = VERSIONS[-1]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))


def _lab_row(root: Path, base: str, tamper: str | None = None) -> dict:
    """A complete extra row (the lab's shape) whose artefacts the mirror serves; one of them tampered if asked."""
    row = copy.deepcopy(TABLE[NEWEST])
    (root / "lab").mkdir(exist_ok=True)
    for name in _versions.ARTIFACTS:
        content = f"{name} for the lab".encode()
        (root / "lab" / name).write_bytes(content + (b" tampered" if name == tamper else b""))
        row["artifacts"][name] = {
            "version": "1.20.2",
            "amd64": {"url": f"{base}/lab/{name}", "sha256": hashlib.sha256(content).hexdigest()},
        }
    return row


def _play(tmp_path: Path, check_mode: bool = False, **args) -> dict:
    """Run the action once; return its registered result and the play's output."""
    out = tmp_path / "out.json"
    out.unlink(missing_ok=True)
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "localhost",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "confidential.kubernetes.kubernetes_artifacts": args,
                            "register": "out",
                            "ignore_errors": True,
                            "check_mode": check_mode,
                        },
                        {"ansible.builtin.copy": {"content": "{{ out | to_json }}", "dest": str(out)}},
                    ],
                }
            ]
        )
    )
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"), ANSIBLE_NOCOLOR="1")
    run = subprocess.run(
        [
            ANSIBLE_PLAYBOOK,
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            str(playbook),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return dict(json.loads(out.read_text()), stdout=run.stdout)


def test_fetch_then_rerun_without_change_then_tampered_mirror_refused(server, tmp_path):
    base, root, requests = server
    cache = tmp_path / "cache"
    common = dict(kubernetes_version="1.20.2", architectures=["x86_64"], cache_dir=str(cache))

    first = _play(tmp_path, versions_extra={"1.20.2": _lab_row(root, base)}, **common)
    assert first["changed"] is True and not first.get("failed")
    assert len(first["fetched"]) == len(_versions.ARTIFACTS) and len(requests) == len(_versions.ARTIFACTS)
    kubeadm = first["artifacts"]["kubeadm"]["amd64"]
    assert Path(kubeadm["path"]).read_bytes() == b"kubeadm for the lab"
    assert first["images"]["pause"] == TABLE[NEWEST]["images"]["pause"]
    assert first["host_packages"] == TABLE[NEWEST]["host_packages"]
    assert "kubernetes_artifacts: kubeadm 1.20.2 (amd64): downloading" in first["stdout"]

    second = _play(tmp_path, versions_extra={"1.20.2": _lab_row(root, base)}, **common)
    assert second["changed"] is False and second["fetched"] == []
    assert len(requests) == len(_versions.ARTIFACTS)

    # The cached artefacts (their .verified records may be written by any run that hashes them).
    before = sorted(str(p) for p in cache.rglob("*") if p.suffix != ".verified")
    (root / "lab" / "runc").write_bytes(b"runc for the lab, tampered")
    tampered_row = _lab_row(root, base, tamper="runc")
    tampered_row["artifacts"]["runc"]["amd64"]["sha256"] = hashlib.sha256(b"a runc never cached").hexdigest()
    third = _play(tmp_path, versions_extra={"1.20.2": tampered_row}, **common)
    assert third["failed"] is True
    assert f"sha256 mismatch for runc 1.20.2 (amd64) from {base}/lab/runc" in third["msg"]
    assert sorted(str(p) for p in cache.rglob("*") if p.suffix != ".verified") == before


def test_unknown_version_refused_with_supported_list(tmp_path):
    result = _play(tmp_path, kubernetes_version="1.29.0", cache_dir=str(tmp_path / "cache"))
    assert result["failed"] is True
    assert result["msg"] == f"Kubernetes 1.29.0 is not in the versions table; supported: {', '.join(VERSIONS)}"
    assert not (tmp_path / "cache").exists()


def test_mirror_and_local_directory_are_exclusive(tmp_path):
    result = _play(tmp_path, kubernetes_version=NEWEST, mirror_url="http://127.0.0.1:1", source_dir=str(tmp_path))
    assert result["failed"] is True and "alternatives" in result["msg"]


def test_the_chart_alone_is_fetched_when_named_and_an_unknown_name_is_refused(server, tmp_path):
    base, root, requests = server
    row = _lab_row(root, base)
    (root / "lab" / "cilium.tgz").write_bytes(b"a chart")
    row["artifacts"]["cilium"] = {
        "version": "1.18.0",
        "url": f"{base}/lab/cilium.tgz",
        "sha256": hashlib.sha256(b"a chart").hexdigest(),
    }
    common = dict(kubernetes_version="1.20.2", versions_extra={"1.20.2": row}, cache_dir=str(tmp_path / "cache"))
    before = _play(tmp_path, check_mode=True, artifacts=["cilium"], **common)
    assert before["changed"] is True and before["fetched"] == ["cilium 1.18.0 (chart)"] and before["artifacts"] == {}
    assert not requests
    result = _play(tmp_path, artifacts=["cilium"], **common)
    assert not result.get("failed") and result["fetched"] == ["cilium 1.18.0 (chart)"] and len(requests) == 1
    chart = result["artifacts"]["cilium"]
    assert set(result["artifacts"]) == {"cilium"} and chart["version"] == "1.18.0" and chart["filename"] == "cilium.tgz"
    assert Path(chart["path"]).read_bytes() == b"a chart" and chart["sha256"] == row["artifacts"]["cilium"]["sha256"]
    after = _play(tmp_path, check_mode=True, artifacts=["cilium"], **common)
    assert after["changed"] is False and after["artifacts"] == result["artifacts"] and len(requests) == 1
    refused = _play(tmp_path, artifacts=["cilium", "calico"], **common)
    assert refused["failed"] is True and refused["msg"].startswith("unknown artefacts calico; the table has kubeadm,")


def test_an_end_of_life_row_is_refused_before_anything_is_fetched_unless_allowed(tmp_path):
    oldest = _versions.parse_row(VERSIONS[0], TABLE[VERSIONS[0]])
    common = dict(kubernetes_version=oldest.version, cache_dir=str(tmp_path / "cache"), artifacts=["cilium"])
    refused = _play(tmp_path, today=oldest.end_of_life.isoformat(), **common)
    assert refused["failed"] is True
    assert refused["msg"] == (
        f"Kubernetes {oldest.minor} is end of life since {oldest.end_of_life.isoformat()}; "
        "upgrade, or set kubernetes_allow_end_of_life: true"
    )
    assert not (tmp_path / "cache").exists()
    # Allowed (or the day before): it goes on to the row's chart, which check mode reports as to be fetched.
    allowed = _play(tmp_path, check_mode=True, today=oldest.end_of_life.isoformat(), allow_end_of_life=True, **common)
    assert not allowed.get("failed") and allowed["end_of_life"] == oldest.end_of_life.isoformat(), allowed
    assert allowed["host_packages"] == list(oldest.host_packages)
    before = _play(tmp_path, check_mode=True, today="2025-01-01", **common)
    assert not before.get("failed") and before["fetched"] == [f"cilium {oldest.artifact_version('cilium')} (chart)"]
    bad_day = _play(tmp_path, today="26.11.2026", **common)
    assert bad_day["failed"] is True and "not a date YYYY-MM-DD" in bad_day["msg"]


def test_a_new_row_in_a_copy_of_the_table_is_accepted(server, tmp_path):
    """A new row needs only the table: the action takes a copy with one more row and fetches its artefacts."""
    base, root, requests = server
    document = yaml.safe_load(Path(_versions.TABLE_FILE).read_text())
    row = _lab_row(root, base)
    for name in _versions.ARTIFACTS:  # https in a shipped row; the mirror serves the same paths
        item = row["artifacts"][name]["amd64"]
        item["url"] = item["url"].replace(base, "https://example.com")
    document["kubernetes_versions"]["1.37.0"] = row
    table = tmp_path / "kubernetes_versions.yml"
    table.write_text(yaml.safe_dump(document))
    result = _play(
        tmp_path,
        kubernetes_version="1.37.0",
        versions_file=str(table),
        mirror_url=base,
        cache_dir=str(tmp_path / "cache"),
    )
    assert not result.get("failed"), result["msg"]
    assert result["version"] == "1.37.0" and len(result["fetched"]) == len(_versions.ARTIFACTS)
    shipped_only = _play(tmp_path, kubernetes_version="1.37.0", cache_dir=str(tmp_path / "cache"))
    assert shipped_only["failed"] is True and "1.37.0 is not in the versions table" in shipped_only["msg"]
