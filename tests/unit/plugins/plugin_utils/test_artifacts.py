"""The versions table and the verified artefact cache, against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import copy
import hashlib
import os
import time
from pathlib import Path

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils import _files
from ansible_collections.confidential.kubernetes.plugins.plugin_utils import _artifacts

REPO = Path(__file__).resolve().parents[4]
TABLE = REPO / "roles" / "node" / "vars" / "kubernetes_versions.yml"
SUPPORTED_MINORS = {"1.31", "1.32", "1.33", "1.34"}


@pytest.fixture(scope="module")
def table() -> dict:
    return _artifacts.load_table(str(TABLE))


def test_the_table_covers_the_supported_minors(table):
    assert {".".join(version.split(".")[:2]) for version in table} == SUPPORTED_MINORS


@pytest.mark.parametrize("version", ["1.31.9", "1.32.10", "1.33.8", "1.34.4"])
def test_every_row_is_complete_and_well_formed(table, version):
    row = table[version]
    assert _artifacts.row_problems(version, row) == []
    for name in ("kubeadm", "kubelet", "kubectl"):
        assert row["artifacts"][name]["version"] == version
        for arch in _artifacts.ARCHITECTURES:
            assert row["artifacts"][name][arch]["url"] == f"https://dl.k8s.io/release/v{version}/bin/linux/{arch}/{name}"
    for name in _artifacts.ARTIFACTS:
        entry = row["artifacts"][name]
        assert set(entry) == {"version", *_artifacts.ARCHITECTURES}
        for arch in _artifacts.ARCHITECTURES:
            assert f"{arch}" in entry[arch]["url"] and f"{entry['version']}" in entry[arch]["url"]
        assert entry["amd64"]["sha256"] != entry["arm64"]["sha256"]
    cilium = row["artifacts"]["cilium"]
    assert set(cilium) == {"version", "url", "sha256"}
    assert cilium["url"] == f"https://helm.cilium.io/cilium-{cilium['version']}.tgz"
    for image in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy"):
        assert row["images"][image] == f"registry.k8s.io/{image}:v{version}"
    assert row["images"]["pause"].startswith("registry.k8s.io/pause:3.")


def test_no_checksum_is_shared_by_two_different_files(table):
    seen: dict[str, str] = {}
    for version, row in table.items():
        for name in _artifacts.ARTIFACTS:
            for arch in _artifacts.ARCHITECTURES:
                item = row["artifacts"][name][arch]
                assert seen.setdefault(item["sha256"], item["url"]) == item["url"], f"{version} {name} {arch}"


@pytest.mark.parametrize("mutate, expected", [
    (lambda row: row["artifacts"].pop("runc"), "artefact runc is missing"),
    (lambda row: row["artifacts"]["helm"].pop("arm64"), None),
    (lambda row: row["artifacts"]["kubelet"]["amd64"].update(sha256="ABC"), "kubelet amd64 sha256 is not 64"),
    (lambda row: row["artifacts"]["kubeadm"]["amd64"].update(sha256="0" * 63 + "G"), "kubeadm amd64 sha256"),
    (lambda row: row["artifacts"]["crictl"]["arm64"].update(url="http://example.com/crictl.tgz"), "crictl arm64 url"),
    (lambda row: row["artifacts"]["containerd"]["amd64"].update(url="ftp://x/y"), "containerd amd64 url"),
    (lambda row: row["images"].update(etcd="registry.k8s.io/etcd"), "image etcd"),
    (lambda row: row["images"].pop("pause"), "image pause"),
    (lambda row: row["artifacts"]["kubectl"].update(s390x={"url": "https://a/b", "sha256": "0" * 64}), "unknown architecture 's390x'"),
    (lambda row: row["artifacts"].pop("cilium"), "artefact cilium is missing"),
    (lambda row: row["artifacts"]["cilium"].update(sha256="0" * 63), "cilium sha256 is not 64"),
    (lambda row: row["artifacts"]["cilium"].update(url="http://helm.cilium.io/cilium.tgz"), "cilium url"),
    (lambda row: row["artifacts"]["cilium"].pop("version"), "artefact cilium has no version"),
    (lambda row: row["artifacts"]["cilium"].update(amd64={"url": "https://a/b", "sha256": "0" * 64}),
     "artefact cilium is the same on every architecture; unknown keys ['amd64']"),
])
def test_a_malformed_row_is_named(table, mutate, expected):
    row = copy.deepcopy(table["1.34.4"])
    mutate(row)
    problems = _artifacts.row_problems("1.34.4", row)
    if expected is None:  # one arch fewer is allowed: a row may serve only the arches it has
        assert problems == []
        with pytest.raises(_artifacts.VersionTableError, match="no helm for arm64"):
            _artifacts.row_artifacts("1.34.4", row, ["amd64", "arm64"])
    else:
        assert any(expected in problem for problem in problems), problems


def test_an_unknown_version_is_refused_with_the_supported_list(table):
    with pytest.raises(_artifacts.VersionTableError) as error:
        _artifacts.select_row(table, "1.30.0", frozenset(table))
    assert "Kubernetes 1.30.0 is not in the versions table; supported: 1.31.9, 1.32.10, 1.33.8, 1.34.4" == str(error.value)


def test_an_extra_row_is_merged_and_may_use_http(table):
    lab = copy.deepcopy(table["1.34.4"])
    for name in _artifacts.ARTIFACTS:
        lab["artifacts"][name]["amd64"]["url"] = f"http://10.77.5.1:8080/{name}"
    merged = _artifacts.merged_table(table, {"1.20.2": lab})
    assert _artifacts.select_row(merged, "v1.20.2", frozenset(table)) is lab
    with pytest.raises(_artifacts.VersionTableError, match="is not an https URL"):
        _artifacts.select_row(merged, "1.20.2", frozenset(merged))
    assert set(table) == {"1.31.9", "1.32.10", "1.33.8", "1.34.4"}


def test_only_an_extra_row_may_say_explicitly_that_it_provides_no_artefact(table):
    lab = copy.deepcopy(table["1.34.4"])
    lab["artifacts"]["crictl"] = None
    assert _artifacts.row_problems("1.20.2", lab, shipped=False) == []
    assert [a.name for a in _artifacts.row_artifacts("1.20.2", lab, ["amd64"])] == [
        "kubeadm", "kubelet", "kubectl", "containerd", "runc", "cni_plugins", "helm"]
    assert "1.34.4: artefact crictl is missing" in _artifacts.row_problems("1.34.4", lab, shipped=True)
    del lab["artifacts"]["crictl"]
    assert "1.20.2: artefact crictl is missing" in _artifacts.row_problems("1.20.2", lab, shipped=False)


def test_a_chart_is_one_file_for_every_architecture_and_only_fetched_when_named(table):
    row = table["1.34.4"]
    assert "cilium" not in [a.name for a in _artifacts.row_artifacts("1.34.4", row, ["amd64", "arm64"])]
    charts = _artifacts.row_artifacts("1.34.4", row, ["amd64", "arm64"], ("cilium",))
    assert charts == [_artifacts.Artifact("cilium", "1.18.0", None, "https://helm.cilium.io/cilium-1.18.0.tgz",
                                          row["artifacts"]["cilium"]["sha256"])]
    assert charts[0].label == "cilium 1.18.0 (chart)" and charts[0].filename == "cilium-1.18.0.tgz"
    lab = dict(row, artifacts=dict(row["artifacts"], cilium=None))
    assert _artifacts.row_problems("1.20.2", lab, shipped=False) == []
    assert _artifacts.row_artifacts("1.20.2", lab, ["amd64"], ("cilium",)) == []


def test_node_architectures():
    assert _artifacts.node_arch("x86_64") == "amd64"
    assert _artifacts.node_arch("aarch64") == "arm64"
    with pytest.raises(_artifacts.VersionTableError, match="ppc64le"):
        _artifacts.node_arch("ppc64le")


def _publish(root: Path, path: str, content: bytes) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(content)


def _artifact(content: bytes, path: str = "/release/v1.34.4/bin/linux/amd64/kubeadm") -> _artifacts.Artifact:
    return _artifacts.Artifact("kubeadm", "1.34.4", "amd64", "https://dl.k8s.io" + path, hashlib.sha256(content).hexdigest())


def test_a_good_file_is_cached_verified_and_a_rerun_touches_no_network(server, tmp_path):
    base, root, requests = server
    content = os.urandom(3 * _artifacts.CHUNK + 17)
    artifact = _artifact(content)
    _publish(root, "/release/v1.34.4/bin/linux/amd64/kubeadm", content)
    lines: list[str] = []
    path, fetched = _artifacts.fetch(artifact, str(tmp_path / "cache"), mirror_url=base + "/", progress=lines.append)
    assert fetched and Path(path).read_bytes() == content
    assert path == str(tmp_path / "cache" / artifact.sha256 / "kubeadm")
    assert requests == ["/release/v1.34.4/bin/linux/amd64/kubeadm"]
    assert lines == [f"kubeadm 1.34.4 (amd64): downloading {base}/release/v1.34.4/bin/linux/amd64/kubeadm"]
    again, fetched_again = _artifacts.fetch(artifact, str(tmp_path / "cache"), mirror_url=base)
    assert (again, fetched_again) == (path, False)
    assert len(requests) == 1


def test_a_tampered_file_is_refused_naming_artefact_and_url_and_nothing_is_cached(server, tmp_path):
    base, root, requests = server
    artifact = _artifact(b"the real kubeadm")
    _publish(root, "/release/v1.34.4/bin/linux/amd64/kubeadm", b"the real kubeadm, plus a backdoor")
    cache = tmp_path / "cache"
    with pytest.raises(_artifacts.ArtifactError) as error:
        _artifacts.fetch_all([artifact], str(cache), mirror_url=base)
    message = str(error.value)
    assert "kubeadm 1.34.4 (amd64)" in message
    assert f"{base}/release/v1.34.4/bin/linux/amd64/kubeadm" in message
    assert "sha256 mismatch" in message
    assert not list(cache.rglob("*"))


def test_a_cached_file_that_was_altered_is_fetched_again(server, tmp_path):
    base, root, requests = server
    content = b"kubeadm bytes"
    artifact = _artifact(content)
    _publish(root, "/release/v1.34.4/bin/linux/amd64/kubeadm", content)
    path = _artifacts.fetch(artifact, str(tmp_path / "cache"), mirror_url=base)[0]
    Path(path).write_bytes(b"altered on disk")
    path, fetched = _artifacts.fetch(artifact, str(tmp_path / "cache"), mirror_url=base)
    assert fetched and Path(path).read_bytes() == content and len(requests) == 2


def test_a_missing_file_fails_naming_the_url(server, tmp_path):
    base, root, requests = server
    with pytest.raises(_artifacts.ArtifactError, match=f"cannot download kubeadm 1.34.4 \\(amd64\\) from {base}/release"):
        _artifacts.fetch(_artifact(b"x"), str(tmp_path / "cache"), mirror_url=base)
    assert not any((tmp_path / "cache").rglob("*"))


def test_local_directory_mode_reads_the_mirror_tree_without_network(tmp_path):
    content = b"air-gapped kubeadm"
    _publish(tmp_path / "offline", "/release/v1.34.4/bin/linux/amd64/kubeadm", content)
    artifact = _artifact(content)
    path, fetched = _artifacts.fetch(artifact, str(tmp_path / "cache"), source_dir=str(tmp_path / "offline"))
    assert fetched and Path(path).read_bytes() == content
    _publish(tmp_path / "offline", "/release/v1.34.4/bin/linux/amd64/kubeadm", b"swapped")
    with pytest.raises(_artifacts.ArtifactError, match="sha256 mismatch for kubeadm 1.34.4 \\(amd64\\) from .*offline/release"):
        _artifacts.fetch(artifact, str(tmp_path / "cache2"), source_dir=str(tmp_path / "offline"))
    assert not (tmp_path / "cache2").exists() or not any((tmp_path / "cache2").rglob("*"))


def test_progress_lines_during_a_long_download(server, tmp_path, monkeypatch):
    base, root, requests = server
    content = os.urandom(4 * _artifacts.CHUNK)
    _publish(root, "/release/v1.34.4/bin/linux/amd64/kubeadm", content)
    monkeypatch.setattr(_artifacts, "PROGRESS_SECONDS", 0.0)
    lines: list[str] = []
    _artifacts.fetch(_artifact(content), str(tmp_path / "cache"), mirror_url=base, progress=lines.append)
    assert lines[-1] == f"kubeadm 1.34.4 (amd64): 4.0 of 4.0 MiB from {base}/release/v1.34.4/bin/linux/amd64/kubeadm"


@pytest.fixture
def cached(server, tmp_path, monkeypatch):
    """A verified cached kubeadm whose fingerprint is recorded (fetched, settled, hashed once), and a fetch of it that
    returns whether it was fetched again."""
    base, root, requests = server
    content = b"kubeadm bytes for the fast path"
    artifact = _artifact(content)
    _publish(root, "/release/v1.34.4/bin/linux/amd64/kubeadm", content)
    # A fingerprint is trusted 50 ms after its file's last change instead of a second (the kernel's tick is shorter).
    monkeypatch.setattr(_files, "SETTLED_NS", 50_000_000)
    path = Path(_artifacts.fetch(artifact, str(tmp_path / "cache"), mirror_url=base)[0])
    assert not Path(f"{path}.verified").exists()
    time.sleep(0.06)
    assert _artifacts.fetch(artifact, str(tmp_path / "cache"), mirror_url=base) == (str(path), False)
    status = os.stat(path)
    assert Path(f"{path}.verified").read_text() == (f"{artifact.sha256} 0644 {status.st_ino} {status.st_size} "
                                                    f"{status.st_mtime_ns} {status.st_ctime_ns}\n")

    def fetch_again() -> bool:
        again, fetched = _artifacts.fetch(artifact, str(tmp_path / "cache"), mirror_url=base)
        assert again == str(path) and path.read_bytes() == content
        return fetched

    return path, fetch_again, requests


def test_a_cached_file_with_its_recorded_fingerprint_is_not_hashed_again(cached, count_file_hashes):
    path, fetch_again, requests = cached
    hashes = count_file_hashes()
    assert fetch_again() is False and hashes.count == 0 and len(requests) == 1


def _keep_size_and_mtime(path: Path, content: bytes) -> None:
    before = os.stat(path)
    path.write_bytes(content)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(path).st_size == before.st_size and os.stat(path).st_mtime_ns == before.st_mtime_ns


def _replaced(path: Path, content: bytes) -> None:
    before = os.stat(path)
    Path(f"{path}.new").write_bytes(content)
    os.chmod(f"{path}.new", before.st_mode & 0o7777)
    os.utime(f"{path}.new", ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(f"{path}.new", path)


@pytest.mark.parametrize("corrupt", [
    lambda path: _keep_size_and_mtime(path, b"KUBEADM bytes for the fast path"),
    lambda path: _replaced(path, b"KUBEADM bytes for the fast path"),
    lambda path: os.truncate(path, 7),
], ids=["content changed keeping size and mtime", "replaced keeping size and mtime", "truncated"])
def test_a_cached_file_changed_since_its_fingerprint_was_recorded_is_hashed_and_fetched_again(cached, corrupt):
    path, fetch_again, requests = cached
    corrupt(path)
    assert fetch_again() is True and len(requests) == 2


@pytest.mark.parametrize("touch", [
    lambda path: os.chmod(path, 0o600),
    lambda path: _replaced(path, path.read_bytes()),
    lambda path: Path(f"{path}.verified").write_text("not a record\n"),
    lambda path: Path(f"{path}.verified").write_text(f"{'0' * 64} 0644 1 2 3 4\n"),
], ids=["chmod", "replaced by the same bytes", "a record that is none", "a record of another file"])
def test_a_cached_file_whose_fingerprint_cannot_vouch_for_it_is_hashed_and_kept_when_good(cached, touch, count_file_hashes):
    path, fetch_again, requests = cached
    touch(path)
    time.sleep(0.06)
    hashes = count_file_hashes()
    assert fetch_again() is False and hashes.count == 1 and len(requests) == 1
    # Hashed and good: its new fingerprint is recorded, and the next run trusts it.
    assert fetch_again() is False and hashes.count == 1
