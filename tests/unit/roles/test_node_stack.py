"""The node role's kubernetes entry point, staged into a temporary root on this host with real ansible-playbook.

Host preparation that changes this machine (swap, modules, sysctls, services) is switched off with the role's
explicit variables; everything else runs as on a node: fetch and verify on the controller, push, unpack, configure.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import os
import re
import subprocess
import tomllib
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from ansible_collections.confidential.kubernetes.plugins.module_utils import _versions

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}[os.uname().machine]


def _tgz(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.uid, info.gid = len(content), 0o755, 1001, 1001
            archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def _offline_tree(root: Path) -> dict:
    """A mirror tree on disk with upstream's layout and a lab-style row for it (the archives shaped like upstream's)."""
    files = {
        "kubeadm": b"#!/bin/sh\necho kubeadm\n",
        "kubelet": b"#!/bin/sh\necho kubelet\n",
        "kubectl": b"#!/bin/sh\necho kubectl\n",
        "runc": b"#!/bin/sh\necho runc\n",
        "crictl": _tgz({"crictl": b"crictl"}),
        "containerd": _tgz(
            {"bin/containerd": b"containerd", "bin/ctr": b"ctr", "bin/containerd-shim-runc-v2": b"shim"}
        ),
        "cni_plugins": _tgz({"./bridge": b"bridge", "./loopback": b"loopback", "./host-local": b"host-local"}),
        "helm": _tgz({f"linux-{ARCH}/helm": b"helm", f"linux-{ARCH}/LICENSE": b"license"}),
    }
    row = copy.deepcopy(_versions.load_table()[_versions.supported(_versions.load_table())[-1]])
    for name, content in files.items():
        url = row["artifacts"][name][ARCH]["url"]
        target = root / url.split("/", 3)[3]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        row["artifacts"][name] = {
            "version": row["artifacts"][name]["version"],
            ARCH: {"url": url, "sha256": hashlib.sha256(content).hexdigest()},
        }
    return row


def _play(tmp_path: Path, row: dict, destdir: Path, cache: str = "cache", *options: str) -> subprocess.CompletedProcess:
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "localhost",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "ansible.builtin.include_role": {
                                "name": "confidential.kubernetes.node",
                                "tasks_from": "kubernetes",
                            }
                        }
                    ],
                }
            ]
        )
    )
    extra = dict(
        ansible_python_interpreter=sys.executable,
        kubernetes_version="9.9.9",
        kubernetes_versions_extra={"9.9.9": row},
        kubernetes_artifacts_dir=str(tmp_path / "offline"),
        kubernetes_artifacts_cache=str(tmp_path / cache),
        node_stack_destdir=str(destdir),
        node_stack_swap_off=False,
        node_stack_kernel_modules=False,
        node_stack_sysctl=False,
        node_stack_services=False,
    )
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"), ANSIBLE_NOCOLOR="1")
    return subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", "localhost,", "-c", "local", "-e", json.dumps(extra), *options, str(playbook)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )


def _recap(stdout: str) -> dict:
    line = next(line for line in stdout.splitlines() if line.startswith("localhost") and "ok=" in line)
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", line)}


def _install_skipped(stdout: str) -> bool:
    """The re-run decided from the probe alone: the install was not even included."""
    included = re.search(
        r"TASK \[confidential.kubernetes.node : Install the stack's binaries, configuration and units\]"
        r"[^\n]*\n(skipping: [^\n]*\n)+\n",
        stdout,
    )
    return bool(included) and "TASK [confidential.kubernetes.node : Install the binaries]" not in stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="installs root-owned files")
def test_install_then_rerun_changes_nothing(tmp_path):
    row = _offline_tree(tmp_path / "offline")
    destdir = tmp_path / "root"
    # What stood there before (the lab links its doubles into /usr/local/bin) is replaced, never written through.
    (tmp_path / "double").write_bytes(b"a double")
    (destdir / "usr/local/bin").mkdir(parents=True)
    for name in ("helm", "kubeadm", "crictl"):
        (destdir / "usr/local/bin" / name).symlink_to(tmp_path / "double")
    first = _play(tmp_path, row, destdir)
    assert first.returncode == 0, first.stdout + first.stderr
    assert _recap(first.stdout)["changed"] > 0
    bin_dir = destdir / "usr/local/bin"
    assert (bin_dir / "kubeadm").read_bytes() == b"#!/bin/sh\necho kubeadm\n" and os.access(
        bin_dir / "kubeadm", os.X_OK
    )
    expected = {
        "kubeadm",
        "kubelet",
        "kubectl",
        "runc",
        "crictl",
        "containerd",
        "ctr",
        "containerd-shim-runc-v2",
        "helm",
    }
    assert {p.name for p in bin_dir.iterdir()} >= expected
    assert not (bin_dir / "LICENSE").exists() and not (bin_dir / f"linux-{ARCH}").exists()
    assert (bin_dir / "helm").read_bytes() == b"helm" and not (bin_dir / "helm").is_symlink()
    assert (bin_dir / "crictl").read_bytes() == b"crictl" and (tmp_path / "double").read_bytes() == b"a double"
    assert {p.name for p in (destdir / "opt/cni/bin").iterdir()} == {"bridge", "loopback", "host-local"}
    config = (destdir / "etc/containerd/config.toml").read_text()
    assert (
        "SystemdCgroup = true" in config
        and f"sandbox = '{row['images']['pause']}'" in config
        and "version = 3" in config
    )
    assert "runtime-endpoint: unix:///run/containerd/containerd.sock" in (destdir / "etc/crictl.yaml").read_text()
    dropin = (destdir / "etc/systemd/system/kubelet.service.d/10-kubeadm.conf").read_text()
    assert (
        "ExecStart=/usr/local/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS" in dropin
    )
    assert "ExecStart=/usr/local/bin/containerd" in (destdir / "etc/systemd/system/containerd.service").read_text()

    # The stamp fingerprints every file it lists, so that the probe reads none of them on a re-run.
    stamp = next((destdir / "var/cache/confidential-kubernetes/artifacts").glob("installed-*.sha256")).read_text()
    listed = [line.split("  ", 1)[1] for line in stamp.splitlines() if not line.startswith("#")]
    fingerprinted = [line.split(" ", 6)[6] for line in stamp.splitlines() if line.startswith("#stat ")]
    assert len(listed) > 10 and fingerprinted == listed, stamp

    second = _play(tmp_path, row, destdir)
    assert second.returncode == 0, second.stdout + second.stderr
    assert _recap(second.stdout)["changed"] == 0, second.stdout
    # The re-run decided from the stamp alone: the install tasks were skipped.
    assert _install_skipped(second.stdout), second.stdout

    # A changed binary (one of them with its size and mtime kept), a changed CNI plugin and a removed unit drop-in
    # fail the stamp's check: check mode says so and changes nothing; a real run installs again and restores all.
    kubeadm = os.stat(bin_dir / "kubeadm")
    (bin_dir / "kubeadm").write_bytes(b"#!/bin/sh\necho KUBEADM\n")
    os.utime(bin_dir / "kubeadm", ns=(kubeadm.st_atime_ns, kubeadm.st_mtime_ns))
    assert os.stat(bin_dir / "kubeadm").st_size == kubeadm.st_size
    (bin_dir / "kubectl").write_bytes(b"tampered")
    (destdir / "opt/cni/bin/bridge").write_bytes(b"tampered")
    (destdir / "etc/systemd/system/kubelet.service.d/10-kubeadm.conf").unlink()
    checked = _play(tmp_path, row, destdir, "cache", "--check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert _recap(checked.stdout)["changed"] > 0 and not _install_skipped(checked.stdout)
    assert (bin_dir / "kubectl").read_bytes() == b"tampered"
    third = _play(tmp_path, row, destdir)
    assert third.returncode == 0, third.stdout + third.stderr
    assert _recap(third.stdout)["changed"] > 0
    assert (bin_dir / "kubectl").read_bytes() == b"#!/bin/sh\necho kubectl\n"
    assert (bin_dir / "kubeadm").read_bytes() == b"#!/bin/sh\necho kubeadm\n"
    assert (destdir / "opt/cni/bin/bridge").read_bytes() == b"bridge"
    assert (destdir / "etc/systemd/system/kubelet.service.d/10-kubeadm.conf").read_text() == dropin
    fourth = _play(tmp_path, row, destdir)
    assert _recap(fourth.stdout)["changed"] == 0 and _install_skipped(fourth.stdout), fourth.stdout

    # Another controller (its own artefact cache) finds the same stamp.
    other_controller = _play(tmp_path, row, destdir, cache="other-cache")
    assert other_controller.returncode == 0 and _install_skipped(other_controller.stdout), other_controller.stdout

    # A changed input (another unit path for the kubelet) names another stamp: the install runs and keeps only the
    # new stamp, so the next probe verifies one.
    staging = destdir / "var/cache/confidential-kubernetes/artifacts"
    before = {p.name for p in staging.glob("installed-*.sha256")}
    assert len(before) == 1
    moved = _play(tmp_path, row, destdir, "cache", "-e", "node_stack_kubelet_path=/usr/local/bin/kubelet-other")
    assert moved.returncode == 0 and _recap(moved.stdout)["changed"] > 0, moved.stdout
    after = {p.name for p in staging.glob("installed-*.sha256")}
    assert len(after) == 1 and after != before
    assert (
        "/usr/local/bin/kubelet-other" in (destdir / "etc/systemd/system/kubelet.service.d/10-kubeadm.conf").read_text()
    )


def test_a_containerd_1_row_without_runc_gets_the_1_x_config_and_the_hosts_runc(tmp_path):
    row = _offline_tree(tmp_path / "offline")
    row["artifacts"]["containerd"]["version"] = "1.6.20"
    row["artifacts"]["runc"] = None
    destdir = tmp_path / "root"
    run = _play(tmp_path, row, destdir)
    assert run.returncode == 0, run.stdout + run.stderr
    config = tomllib.loads((destdir / "etc/containerd/config.toml").read_text())
    assert config["version"] == 2
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == row["images"]["pause"]
    # No BinaryName: containerd's shim runs the host's runc from its PATH.
    assert cri["containerd"]["runtimes"]["runc"]["options"] == {"SystemdCgroup": True}
    assert not (destdir / "usr/local/bin/runc").exists()


def test_a_host_with_its_own_container_runtime_gets_none_of_the_rows(tmp_path):
    row = _offline_tree(tmp_path / "offline")
    destdir = tmp_path / "root"
    options = ("-e", "node_stack_container_runtime=false", "-e", f"kubernetes_images_dir={tmp_path / 'site'}")
    first = _play(tmp_path, row, destdir, "cache", *options)
    assert first.returncode == 0, first.stdout + first.stderr
    assert {p.name for p in (destdir / "usr/local/bin").iterdir()} == {"kubeadm", "kubelet", "kubectl", "helm"}
    assert not (destdir / "etc/containerd/config.toml").exists()
    assert not (destdir / "etc/systemd/system/containerd.service").exists()
    assert not (destdir / "etc/crictl.yaml").exists() and not any((destdir / "opt/cni/bin").iterdir())
    # No image was fetched (the images' directory does not even exist) and none imported.
    assert "Fetch and verify the images" not in first.stdout and not (tmp_path / "cache/images.lock.yml").exists()
    second = _play(tmp_path, row, destdir, "cache", *options)
    assert second.returncode == 0 and _recap(second.stdout)["changed"] == 0, second.stdout
    # The runtime switched on later is an input change: the row's runtime is installed.
    third = _play(tmp_path, row, destdir)
    assert third.returncode == 0, third.stdout + third.stderr
    assert (destdir / "usr/local/bin/containerd").read_bytes() == b"containerd"


@pytest.mark.skipif(os.geteuid() != 0, reason="installs root-owned files")
def test_a_tampered_artefact_installs_nothing(tmp_path):
    row = _offline_tree(tmp_path / "offline")
    url = row["artifacts"]["helm"][ARCH]["url"]
    (tmp_path / "offline" / url.split("/", 3)[3]).write_bytes(b"not helm")
    destdir = tmp_path / "root"
    run = _play(tmp_path, row, destdir)
    assert run.returncode != 0
    assert f"sha256 mismatch for helm 3.18.4 ({ARCH}) from {tmp_path}/offline/" in run.stdout
    assert not destdir.exists()


def _versioned_rows(root: Path) -> dict:
    """Rows 9.9.9 and 9.9.10 of the same offline tree, whose kubeadm binaries report their own version."""
    base = _offline_tree(root)
    rows = {}
    for version in ("9.9.9", "9.9.10"):
        row = copy.deepcopy(base)
        content = f"#!/bin/sh\necho v{version}\n".encode()
        shipped = row["artifacts"]["kubeadm"]["version"]
        url = row["artifacts"]["kubeadm"][ARCH]["url"].replace(f"/v{shipped}/", f"/v{version}/")
        assert url != row["artifacts"]["kubeadm"][ARCH]["url"]
        target = root / url.split("/", 3)[3]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        row["artifacts"]["kubeadm"] = {
            "version": version,
            ARCH: {"url": url, "sha256": hashlib.sha256(content).hexdigest()},
        }
        rows[version] = row
    return rows


def _node_in_cluster(tmp_path: Path):
    """A node with the 9.9.9 stack installed and a kubelet.conf (a member of a cluster): the rows, its root, its
    kubeadm, its artefact staging directory and the install stamps there."""
    rows = _versioned_rows(tmp_path / "offline")
    destdir = tmp_path / "root"
    assert _play(tmp_path, rows["9.9.9"], destdir).returncode == 0
    kubeadm = destdir / "usr/local/bin/kubeadm"
    staging = destdir / "var/cache/confidential-kubernetes/artifacts"
    stamps = {p.name for p in staging.glob("installed-*.sha256")}
    (destdir / "etc/kubernetes").mkdir(parents=True)
    (destdir / "etc/kubernetes/kubelet.conf").write_text("kind: Config\n")
    return rows, destdir, kubeadm, staging, stamps


@pytest.mark.skipif(os.geteuid() != 0, reason="installs root-owned files")
def test_another_version_is_refused_on_a_node_in_a_cluster_and_nothing_is_swapped(tmp_path):
    rows, destdir, kubeadm, staging, stamps = _node_in_cluster(tmp_path)
    other = ["-e", json.dumps({"kubernetes_version": "9.9.10", "kubernetes_versions_extra": rows})]

    refused = _play(tmp_path, rows["9.9.9"], destdir, "cache", *other)
    # Only the controller's artefact cache took the new version.
    assert refused.returncode != 0 and _recap(refused.stdout)["changed"] == 1, refused.stdout
    message = " ".join(refused.stdout.split())
    assert "runs Kubernetes v9.9.9, but kubernetes_version asks for 9.9.10" in message, refused.stdout
    assert "run playbooks/upgrade_kubernetes.yml" in message and "nothing was changed" in message
    assert (
        kubeadm.read_bytes() == b"#!/bin/sh\necho v9.9.9\n"
        and {p.name for p in staging.glob("installed-*.sha256")} == stamps
    )

    # The running version again: converged, nothing asked of kubeadm; a damaged file of it is repaired.
    again = _play(tmp_path, rows["9.9.9"], destdir)
    assert _recap(again.stdout)["changed"] == 0, again.stdout
    assert re.search(
        r"TASK \[confidential.kubernetes.node : Learn the Kubernetes version[^\n]*\nskipping", again.stdout
    ), again.stdout
    (destdir / "usr/local/bin/kubectl").write_bytes(b"damaged")
    repaired = _play(tmp_path, rows["9.9.9"], destdir)
    assert (
        repaired.returncode == 0 and (destdir / "usr/local/bin/kubectl").read_bytes() == b"#!/bin/sh\necho kubectl\n"
    ), repaired.stdout

    # Out of the cluster (no kubelet.conf), a node takes another version's stack.
    (destdir / "etc/kubernetes/kubelet.conf").unlink()
    swapped = _play(tmp_path, rows["9.9.9"], destdir, "cache", *other)
    assert swapped.returncode == 0, swapped.stdout
    assert kubeadm.read_bytes() == b"#!/bin/sh\necho v9.9.10\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="installs root-owned files")
def test_the_upgrade_playbooks_request_installs_another_version_under_a_running_node(tmp_path):
    rows, destdir, kubeadm, staging, stamps = _node_in_cluster(tmp_path)
    upgrade = {"kubernetes_version": "9.9.10", "kubernetes_versions_extra": rows, "node_stack_upgrade": True}

    upgraded = _play(tmp_path, rows["9.9.9"], destdir, "cache", "-e", json.dumps(upgrade))
    assert upgraded.returncode == 0 and kubeadm.read_bytes() == b"#!/bin/sh\necho v9.9.10\n", upgraded.stdout
    # The new version's stamp is the node's record of it; a re-run changes nothing.
    assert len({p.name for p in staging.glob("installed-*.sha256")} - stamps) == 1
    again = _play(tmp_path, rows["9.9.9"], destdir, "cache", "-e", json.dumps(upgrade))
    assert _recap(again.stdout)["changed"] == 0, again.stdout
    # Without the request the old version is now the other one: refused, naming both.
    back = _play(tmp_path, rows["9.9.9"], destdir)
    assert back.returncode != 0 and "runs Kubernetes v9.9.10, but kubernetes_version asks for 9.9.9" in " ".join(
        back.stdout.split()
    ), back.stdout


def test_a_pause_image_the_row_pins_by_digest_is_containerds_sandbox_by_digest(tmp_path):
    """containerd's CRI looks a name:tag@sha256 sandbox image up as name@sha256, a name the import gives it: the
    sandbox is the pinned image, not whatever the tag names."""
    row = _offline_tree(tmp_path / "offline")
    digest = "sha256:" + "5" * 64
    row["images"]["pause"] = row["images"]["pause"] + "@" + digest
    tag = row["images"]["pause"].split("@")[0].rsplit(":", 1)[1]
    run = _play(tmp_path, row, tmp_path / "root", "cache", "-e", "kubernetes_image_repository=registry.example.com/k8s")
    assert run.returncode == 0, run.stdout + run.stderr
    config = tomllib.loads((tmp_path / "root/etc/containerd/config.toml").read_text())
    sandbox = config["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"]
    assert sandbox == f"registry.example.com/k8s/pause:{tag}@{digest}"
