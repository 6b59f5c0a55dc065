"""The lab's Kubernetes mirror (cklab.mirror): its row of the versions table, and the install path it proves.

The pure tests build a mirror from small stand-in binaries. The `lab` tests boot their own lab (one control plane)
under a temporary CK_LAB_DIR and run the node role's kubernetes entry point against it over real SSH: an unknown
version and a mirror serving a tampered kubeadm (a real HTTP server on loopback) are refused with nothing installed,
then the lab's own mirror installs kubeadm, kubelet, kubectl and helm 1.20.2 / 3.17.2, and a re-run changes nothing.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
import urllib.parse
from pathlib import Path

import pytest
import yaml

from ansible_collections.confidential.kubernetes.plugins.module_utils import _versions
from cklab import LabError, kubernetes, lab as lab_commands, mirror
from cklab.base import STANDIN_KUBELET
from cklab.paths import LabPaths

REPO = Path(__file__).resolve().parents[3]
LAB = REPO / "tests" / "lab" / "lab"
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
SOURCES = {
    "kubeadm": b"kubeadm 1.20.2",
    "kubelet": b"kubelet 1.20.2",
    "kubectl": b"kubectl 1.20.2",
    "helm-3.17.2": b"helm 3.17.2",
}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _build(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A version dir with bin/ as a build leaves it, and the digests its SHA256SUMS records."""
    version_dir = tmp_path / "v1.20.2"
    (version_dir / "bin").mkdir(parents=True)
    for name, data in SOURCES.items():
        (version_dir / "bin" / name).write_bytes(data)
    return version_dir, {name: _sha256(data) for name, data in SOURCES.items()}


def test_helm_is_packed_as_upstream_shapes_it_and_byte_identical_every_time():
    packed = mirror.helm_tarball(b"helm binary")
    assert packed == mirror.helm_tarball(b"helm binary")
    with tarfile.open(fileobj=io.BytesIO(packed), mode="r:gz") as archive:
        member = archive.getmember("linux-amd64/helm")
        assert member.mode == 0o755 and member.mtime == 0 and member.uid == 0
        assert archive.extractfile(member).read() == b"helm binary"


def test_the_row_is_written_with_the_build_from_its_recorded_checksums(tmp_path):
    version_dir, recorded = _build(tmp_path)
    lines: list[str] = []
    mirror.ensure_mirror(version_dir, recorded, lines.append)
    row = mirror.load_row(version_dir)["1.20.2"]
    # The CNI chart is entered by lab up (cni.with_chart, which packages it with the real helm); with it the row is whole.
    assert "cilium" not in row["artifacts"]
    chart = {
        "version": "1.18.0-standin",
        "url": f"{mirror.ROW_BASE_URL}/charts/cilium-1.18.0-standin.tgz",
        "sha256": "b" * 64,
    }
    assert (
        _versions.row_problems("1.20.2", {**row, "artifacts": {**row["artifacts"], "cilium": chart}}, shipped=False)
        == []
    )
    assert sorted(name for name, entry in row["artifacts"].items() if entry is None) == sorted(mirror.NOT_PROVIDED)
    # kubeadm 1.20's preflight checks: the row names their packages, the shared build's file does not carry them.
    assert row["host_packages"] == ["conntrack", "iptables", "iproute2", "ethtool", "socat", "ebtables"]
    assert "host_packages" not in json.loads(mirror.row_file(version_dir).read_text())["1.20.2"]
    for name in ("kubeadm", "kubelet", "kubectl", "helm"):
        item = row["artifacts"][name]["amd64"]
        served = mirror.tree_dir(version_dir) / urllib.parse.urlsplit(item["url"]).path.lstrip("/")
        assert _sha256(served.read_bytes()) == item["sha256"], name
    assert row["artifacts"]["kubelet"]["amd64"]["sha256"] == recorded["kubelet"]
    assert row["artifacts"]["helm"]["amd64"]["sha256"] == _sha256(mirror.helm_tarball(b"helm 3.17.2"))
    assert row["artifacts"]["helm"]["amd64"]["url"] == "http://lab-mirror.invalid/helm-v3.17.2-linux-amd64.tar.gz"
    assert len(lines) == 1
    # Already right: nothing is written again.
    row_inode = mirror.row_file(version_dir).stat().st_ino
    mirror.ensure_mirror(version_dir, recorded, lines.append)
    assert len(lines) == 1 and mirror.row_file(version_dir).stat().st_ino == row_inode


def test_a_binarys_checksum_is_the_recorded_one_never_the_files(tmp_path):
    version_dir, recorded = _build(tmp_path)
    recorded["kubeadm"] = "e" * 64
    mirror.ensure_mirror(version_dir, recorded, lambda line: None)
    assert mirror.load_row(version_dir)["1.20.2"]["artifacts"]["kubeadm"]["amd64"]["sha256"] == "e" * 64


def test_a_mirror_without_a_row_names_the_command_that_writes_it(tmp_path):
    with pytest.raises(LabError, match=r"no lab versions row at .*versions-row.json .*run tests/lab/lab kubernetes"):
        mirror.load_row(tmp_path)


# ---- on a lab node ------------------------------------------------------------------------


class Lab:
    def __init__(self, lab_dir: Path, tmp: Path) -> None:
        self.dir = lab_dir
        self.tmp = tmp
        self.env = {
            **os.environ,
            "CK_LAB_DIR": str(lab_dir),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_COLLECTIONS_PATH": str(REPO / ".venv" / "collections"),
        }
        self.playbook = LAB.with_name("node-stack.yml")

    def lab(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(LAB), *args], env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def on_node(self, command: str) -> str:
        done = self.lab("ssh", "cp-0", command, timeout=120)
        assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
        return done.stdout

    def stack(self, **extra) -> subprocess.CompletedProcess:
        extra.setdefault("kubernetes_artifacts_cache", str(self.tmp / "cache"))
        return subprocess.run(
            [ANSIBLE_PLAYBOOK, "-i", str(self.dir / "inventory.yml"), "-e", json.dumps(extra), str(self.playbook)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=1200,
            check=False,
        )

    def installed(self) -> str:
        return self.on_node(
            "ls /usr/local/bin /var/cache/confidential-kubernetes/artifacts /etc/systemd/system/kubelet.service "
            "2>/dev/null; true"
        )

    @functools.cached_property
    def row(self) -> dict:
        return yaml.safe_load((self.dir / "inventory.yml").read_text())["all"]["vars"]["kubernetes_versions_extra"]


def _recap(stdout: str) -> dict:
    line = next(line for line in stdout.splitlines() if line.startswith("cp-0") and "ok=" in line)
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", line)}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    reason = lab_commands.cannot_boot(LabPaths.from_environment())
    if reason:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("mirror")
    created = Lab(tmp / "lab", tmp)
    try:
        started = created.lab("up", "--control-planes", "1", "--workers", "0")
        assert started.returncode == 0, started.stderr
        yield created
    finally:
        stopped = created.lab("down", timeout=180)
        assert stopped.returncode == 0, stopped.stderr


@pytest.fixture
def tampered_mirror(lab, tmp_path):
    """The lab's mirror tree on loopback, with kubeadm replaced by other bytes."""
    real = mirror.tree_dir(LabPaths.from_environment().kubernetes_bin.parent)
    tree = tmp_path / "tampered"
    for source in real.rglob("*"):
        if source.is_file():
            target = tree / source.relative_to(real)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(source)
    kubeadm = tree / "release/v1.20.2/bin/linux/amd64/kubeadm"
    kubeadm.unlink()
    kubeadm.write_bytes(b"#!/bin/sh\necho not the recorded kubeadm\n")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(tree)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.mark.lab
def test_a_fresh_node_has_no_kubernetes_tools_of_the_labs_hand(lab):
    assert lab.on_node("for t in kubeadm kubectl kubelet helm; do command -v $t || echo no-$t; done").split() == [
        "no-kubeadm",
        "no-kubectl",
        "no-kubelet",
        "no-helm",
    ]


@pytest.mark.lab
def test_an_unknown_version_is_refused_with_the_supported_list(lab):
    before = lab.installed()
    run = lab.stack(kubernetes_version="1.19.0")
    assert run.returncode != 0
    # The lab's rows: its 1.20.2 build and the relabelled one the upgrade drill targets.
    lab_rows = {release.version.lstrip("v"): {} for release in kubernetes.RELEASES}
    supported = ", ".join(_versions.supported(_versions.merged_table(_versions.load_table(), lab_rows)))
    assert f"Kubernetes 1.19.0 is not in the versions table; supported: {supported}" in run.stdout
    assert lab.installed() == before


@pytest.mark.lab
def test_a_mirror_serving_a_tampered_kubeadm_is_refused_and_nothing_is_installed(lab, tampered_mirror):
    before = lab.installed()
    run = lab.stack(kubernetes_mirror_url=tampered_mirror)
    assert run.returncode != 0
    assert (
        f"sha256 mismatch for kubeadm 1.20.2 (amd64) from {tampered_mirror}/release/v1.20.2/bin/linux/amd64/kubeadm: "
        f"expected {lab.row['1.20.2']['artifacts']['kubeadm']['amd64']['sha256']}"
    ) in run.stdout
    assert lab.installed() == before
    assert "kubeadm" not in before and "kubelet.service" not in before


@pytest.mark.lab
def test_the_labs_mirror_installs_the_stack_and_a_rerun_changes_nothing(lab):
    first = lab.stack()
    assert first.returncode == 0, first.stdout[-3000:]
    assert _recap(first.stdout)["changed"] > 0
    assert lab.on_node("kubeadm version -o short").strip() == "v1.20.2"
    assert "v1.20.2" in lab.on_node("kubectl version --client --short")
    assert lab.on_node("helm version --short").startswith("v3.17.2+")
    kubelet = lab.row["1.20.2"]["artifacts"]["kubelet"]["amd64"]["sha256"]
    assert lab.on_node("sha256sum /usr/local/bin/kubelet").split()[0] == kubelet
    unit = lab.on_node("systemctl cat kubelet")
    assert f"ExecStart={STANDIN_KUBELET} $KUBELET_KUBECONFIG_ARGS" in unit and "KillMode=process" in unit
    assert lab.on_node("systemctl is-enabled kubelet").strip() == "enabled"
    assert lab.on_node("test -e /etc/systemd/system/containerd.service && echo unit || echo none").strip() == "none"

    again = lab.stack()
    assert again.returncode == 0, again.stdout[-3000:]
    assert _recap(again.stdout)["changed"] == 0, again.stdout
