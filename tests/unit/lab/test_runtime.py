"""The lab rows' container runtime (cklab.runtime): Debian packages pinned by version and sha256, repacked into
upstream's release shapes. Fast: packages built here with dpkg-deb, nothing downloaded."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils import _versions
from cklab import LabError, mirror, runtime
from cklab.paths import LabPaths


def _deb(tmp_path: Path, files: dict[str, bytes]) -> Path:
    root = tmp_path / "pkg"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        "Package: containerd\nVersion: 1.6.20~ds1-1+deb12u3\nArchitecture: amd64\nMaintainer: lab <lab@invalid>\n"
        "Description: test\n"
    )
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content)
    deb = tmp_path / "containerd.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-b", str(root), str(deb)], check=True, capture_output=True)
    return deb


CONTAINERD = next(package for package in runtime.PACKAGES if package.artifact == "containerd")
BINARIES = {path: f"{path} binary".encode() for path in CONTAINERD.members}


def test_containerd_is_repacked_in_upstreams_shape_byte_identically(tmp_path):
    deb = _deb(tmp_path, BINARIES)
    packed = runtime.artefact_bytes(deb, CONTAINERD)
    assert packed == runtime.artefact_bytes(deb, CONTAINERD)
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(packed))) as archive:
        members = {member.name: archive.extractfile(member).read() for member in archive.getmembers()}
        assert all(member.mode == 0o755 and member.mtime == 0 for member in archive.getmembers())
    assert members == {f"bin/{Path(path).name}": content for path, content in BINARIES.items()}
    assert set(members) >= {"bin/containerd", "bin/ctr", "bin/containerd-shim-runc-v2"}


def test_a_package_missing_a_file_is_refused_naming_it(tmp_path):
    deb = _deb(tmp_path, {path: content for path, content in BINARIES.items() if not path.endswith("/ctr")})
    with pytest.raises(LabError, match="has no usr/bin/ctr"):
        runtime.artefact_bytes(deb, CONTAINERD)


def test_a_cached_package_that_is_not_the_pinned_one_is_removed_and_refused(tmp_path):
    paths = LabPaths(tmp_path / "lab", tmp_path / "cache", tmp_path)
    deb = _deb(tmp_path, BINARIES)
    cached = paths.cache_dir / "runtime" / CONTAINERD.filename
    cached.parent.mkdir(parents=True)
    cached.write_bytes(deb.read_bytes())
    with pytest.raises(LabError, match=f"not the pinned {CONTAINERD.sha256}"):
        runtime.package_file(paths, CONTAINERD, print)
    assert not cached.exists()
    # The same bytes pinned are taken as they are (no download).
    cached.write_bytes(deb.read_bytes())
    pinned = dataclasses.replace(CONTAINERD, sha256=hashlib.sha256(deb.read_bytes()).hexdigest())
    assert runtime.package_file(paths, pinned, print) == cached


def test_the_rows_provide_no_runc_and_every_runtime_artefact_is_upstreams_url_path():
    assert all(package.artifact in ("containerd", "cni_plugins") for package in runtime.PACKAGES)
    for package in runtime.PACKAGES:
        assert f"/download/v{package.upstream_version}/" in package.url_path
        assert package.version.startswith(package.upstream_version + "~") or package.version.startswith(
            package.upstream_version + "+"
        )


def test_a_lab_row_with_the_runtime_is_a_valid_extra_row_and_names_no_runc():
    row = mirror.render_row({name: "e" * 64 for name in ("kubeadm", "kubelet", "kubectl", "helm")})
    chart = {"version": "1.18.0-standin", "url": f"{mirror.ROW_BASE_URL}/charts/cilium.tgz", "sha256": "b" * 64}
    runtime_entries = {package.artifact: runtime.row_entry(package, "c" * 64) for package in runtime.PACKAGES}
    row["artifacts"].update(cilium=chart, runc=None, **runtime_entries)
    assert _versions.row_problems("1.20.2", row, shipped=False) == []
    # Debian's runc would be refused in any row: it lacks the 2025 container-escape fixes.
    refused = {**row, "artifacts": {**row["artifacts"], "runc": {**runtime_entries["containerd"], "version": "1.1.5"}}}
    assert any("runc 1.1.5 has container escapes" in problem for problem in _versions.row_problems("1.20.2", refused))


def test_a_packed_artefact_that_is_still_the_recorded_one_is_not_packed_again(tmp_path, monkeypatch):
    paths = LabPaths(tmp_path / "lab", tmp_path / "cache", tmp_path)
    debs = {}
    for package in runtime.PACKAGES:
        files = {path: f"{path} binary".encode() for path in package.members}
        debs[package.artifact] = _deb(tmp_path / package.artifact, files)
    pinned = tuple(
        dataclasses.replace(package, sha256=hashlib.sha256(debs[package.artifact].read_bytes()).hexdigest())
        for package in runtime.PACKAGES
    )
    monkeypatch.setattr(runtime, "PACKAGES", pinned)
    for package in pinned:
        cached = paths.cache_dir / "runtime" / package.filename
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_bytes(debs[package.artifact].read_bytes())
    lines: list[str] = []
    first = runtime.ensure_runtime(paths, tmp_path / "tree", lines.append)
    assert len([line for line in lines if line.startswith("runtime: packed")]) == 2
    lines.clear()
    assert runtime.ensure_runtime(paths, tmp_path / "tree", lines.append) == first and lines == []
    # A changed artefact in the tree is packed again from its package.
    (tmp_path / "tree" / pinned[0].url_path).write_bytes(b"changed")
    assert runtime.ensure_runtime(paths, tmp_path / "tree", lines.append) == first
    assert lines == [f"runtime: packed {pinned[0].url_path} from {pinned[0].filename}"]
