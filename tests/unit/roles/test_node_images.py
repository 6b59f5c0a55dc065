"""The node role imports the row's pinned images into a real containerd before kubeadm would run: the stack staged into
a temporary root (as test_node_stack.py does), the images from a local directory of OCI archives the test builds, a
private containerd standing in for the node's."""

from __future__ import annotations

import subprocess

import yaml

from tests.unit.plugins.module_utils._images.oci_layout import build_layout, write_archive
from tests.unit.roles.test_node_stack import _offline_tree, _play, _recap


def _images(root, row: dict, tampered: str = "") -> dict:
    """Every image of the row as an OCI archive under root/images/<repository>/<tag>.oci.tar; their digests."""
    digests = {}
    for name, reference in row["images"].items():
        members, digests[reference] = build_layout(reference, f"{name}\n".encode())
        if name == tampered:
            layer = next(n for n, blob in members.items() if n.startswith("blobs/") and b"hello.txt" in blob)
            members[layer] = members[layer].replace(f"{name}\n".encode(), f"{name}!".encode())
        repository, tag = reference.rsplit(":", 1)
        target = root / "images" / repository / f"{tag}.oci.tar"
        target.parent.mkdir(parents=True, exist_ok=True)
        write_archive(target, members)
    return digests


def _listed(address: str) -> dict[str, str]:
    output = subprocess.run(
        ["ctr", "--address", address, "--namespace", "k8s.io", "images", "ls"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    return {line.split()[0]: line.split()[2] for line in output.splitlines()[1:]}


def _options(tmp_path, address: str) -> list[str]:
    return [
        "-e",
        f"kubernetes_images_dir={tmp_path / 'site'}",
        "-e",
        f"node_images_containerd_address={address}",
        "-e",
        "node_images_ctr_path=/usr/bin/ctr",
    ]


def test_the_rows_images_are_imported_by_digest_and_a_rerun_changes_nothing(tmp_path, containerd):
    row = _offline_tree(tmp_path / "offline")
    digests = _images(tmp_path / "site", row)
    destdir = tmp_path / "root"
    first = _play(tmp_path, row, destdir, "cache", *_options(tmp_path, containerd))
    assert first.returncode == 0, first.stdout + first.stderr
    listed = _listed(containerd)
    assert {reference: listed.get(reference) for reference in digests} == digests
    lock = yaml.safe_load((tmp_path / "cache" / "images.lock.yml").read_text())["images"]
    assert lock == digests
    second = _play(tmp_path, row, destdir, "cache", *_options(tmp_path, containerd))
    assert second.returncode == 0 and _recap(second.stdout)["changed"] == 0, second.stdout


def test_a_tampered_image_archive_is_refused_naming_it_and_nothing_is_imported(tmp_path, containerd):
    row = _offline_tree(tmp_path / "offline")
    _images(tmp_path / "site", row, tampered="etcd")
    run = _play(tmp_path, row, tmp_path / "root", "cache", *_options(tmp_path, containerd))
    assert run.returncode != 0
    assert f"etcd ({row['images']['etcd']})" in run.stdout and "tampered" in run.stdout, run.stdout
    assert _listed(containerd) == {}
