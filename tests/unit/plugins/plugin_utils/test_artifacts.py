"""The verified artefact cache, against a real HTTP server on 127.0.0.1 (the table: module_utils/test_versions.py)."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils import _files
from ansible_collections.confidential.kubernetes.plugins.module_utils import _versions
from ansible_collections.confidential.kubernetes.plugins.plugin_utils import _artifacts


def _publish(root: Path, path: str, content: bytes) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(content)


def _artifact(content: bytes, path: str = "/release/v1.34.4/bin/linux/amd64/kubeadm") -> _versions.Artifact:
    return _versions.Artifact(
        "kubeadm", "1.34.4", "amd64", "https://dl.k8s.io" + path, hashlib.sha256(content).hexdigest()
    )


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
    with pytest.raises(
        _artifacts.ArtifactError, match=f"cannot download kubeadm 1.34.4 \\(amd64\\) from {base}/release"
    ):
        _artifacts.fetch(_artifact(b"x"), str(tmp_path / "cache"), mirror_url=base)
    assert not any((tmp_path / "cache").rglob("*"))


def test_local_directory_mode_reads_the_mirror_tree_without_network(tmp_path):
    content = b"air-gapped kubeadm"
    _publish(tmp_path / "offline", "/release/v1.34.4/bin/linux/amd64/kubeadm", content)
    artifact = _artifact(content)
    path, fetched = _artifacts.fetch(artifact, str(tmp_path / "cache"), source_dir=str(tmp_path / "offline"))
    assert fetched and Path(path).read_bytes() == content
    _publish(tmp_path / "offline", "/release/v1.34.4/bin/linux/amd64/kubeadm", b"swapped")
    with pytest.raises(
        _artifacts.ArtifactError, match="sha256 mismatch for kubeadm 1.34.4 \\(amd64\\) from .*offline/release"
    ):
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
    assert Path(f"{path}.verified").read_text() == (
        f"{artifact.sha256} 0644 {status.st_ino} {status.st_size} {status.st_mtime_ns} {status.st_ctime_ns}\n"
    )

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


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda path: _keep_size_and_mtime(path, b"KUBEADM bytes for the fast path"),
        lambda path: _replaced(path, b"KUBEADM bytes for the fast path"),
        lambda path: os.truncate(path, 7),
    ],
    ids=["content changed keeping size and mtime", "replaced keeping size and mtime", "truncated"],
)
def test_a_cached_file_changed_since_its_fingerprint_was_recorded_is_hashed_and_fetched_again(cached, corrupt):
    path, fetch_again, requests = cached
    corrupt(path)
    assert fetch_again() is True and len(requests) == 2


@pytest.mark.parametrize(
    "touch",
    [
        lambda path: os.chmod(path, 0o600),
        lambda path: _replaced(path, path.read_bytes()),
        lambda path: Path(f"{path}.verified").write_text("not a record\n"),
        lambda path: Path(f"{path}.verified").write_text(f"{'0' * 64} 0644 1 2 3 4\n"),
    ],
    ids=["chmod", "replaced by the same bytes", "a record that is none", "a record of another file"],
)
def test_a_cached_file_whose_fingerprint_cannot_vouch_for_it_is_hashed_and_kept_when_good(
    cached, touch, count_file_hashes
):
    path, fetch_again, requests = cached
    touch(path)
    time.sleep(0.06)
    hashes = count_file_hashes()
    assert fetch_again() is False and hashes.count == 1 and len(requests) == 1
    # Hashed and good: its new fingerprint is recorded, and the next run trusts it.
    assert fetch_again() is False and hashes.count == 1
