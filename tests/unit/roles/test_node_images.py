"""The node role imports the row's pinned images into a real containerd before kubeadm would run: the stack staged into
a temporary root (as test_node_stack.py does), the images from a local directory of OCI archives the test builds, a
private containerd standing in for the node's."""

from __future__ import annotations

import json
import subprocess
import tomllib

import yaml

from tests.unit.plugins.module_utils._images.oci_layout import build_layout, write_archive
from tests.unit.roles.test_node_stack import _offline_tree, _play, _recap


def _images(root, row: dict, tampered: str = "") -> dict:
    """Every image of the row (kubeadm's and its CNI chart's, whose digests the test's archives do not have: the row's
    pins are dropped) as an OCI archive under root/images/<repository>/<tag>.oci.tar; their digests."""
    chart = row["artifacts"]["cilium"]["images"]
    chart.update({name: reference.split("@")[0] for name, reference in chart.items()})
    digests = {}
    for name, reference in {**row["images"], **chart}.items():
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


def _options(tmp_path, address: str, group: str = "control_plane") -> list[str]:
    """The play's options: the images from tmp_path/site into the containerd at address, localhost a member of group."""
    inventory = tmp_path / "groups.yml"
    groups = {"control_plane": {"hosts": {"cp-elsewhere": {}}}, group: {"hosts": {"localhost": {}}}}
    inventory.write_text(yaml.safe_dump({"all": {"children": groups}}))
    return [
        "-i",
        str(inventory),
        "-e",
        f"kubernetes_images_dir={tmp_path / 'site'}",
        "-e",
        f"node_images_containerd_address={address}",
        "-e",
        "node_images_ctr_path=/usr/bin/ctr",
    ]


def test_the_rows_images_are_imported_by_digest_and_a_rerun_changes_nothing(tmp_path, containerd):
    """A control plane imports every image of the row."""
    row = _offline_tree(tmp_path / "offline")
    digests = _images(tmp_path / "site", row)
    destdir = tmp_path / "root"
    first = _play(tmp_path, row, destdir, "cache", *_options(tmp_path, containerd))
    assert first.returncode == 0, first.stdout + first.stderr
    listed = _listed(containerd)
    assert {reference: listed.get(reference) for reference in digests} == digests
    lock = yaml.safe_load((tmp_path / "cache" / "images.lock.yml").read_text())["images"]
    assert lock == digests
    assert _recap(first.stdout)["changed"] > 0
    second = _play(tmp_path, row, destdir, "cache", *_options(tmp_path, containerd))
    assert second.returncode == 0 and _recap(second.stdout)["changed"] == 0, second.stdout
    # An image removed from containerd: check mode says so and imports nothing; a run imports it alone.
    pause = row["images"]["pause"]
    subprocess.run(["ctr", "--address", containerd, "--namespace", "k8s.io", "images", "rm", pause], check=True)
    checked = _play(tmp_path, row, destdir, "cache", *_options(tmp_path, containerd), "--check")
    assert checked.returncode == 0 and _recap(checked.stdout)["changed"] > 0, checked.stdout + checked.stderr
    assert pause not in _listed(containerd)
    third = _play(tmp_path, row, destdir, "cache", *_options(tmp_path, containerd))
    assert third.returncode == 0 and _listed(containerd)[pause] == digests[pause], third.stdout
    assert _recap(third.stdout)["changed"] > 0
    fourth = _play(tmp_path, row, destdir, "cache", *_options(tmp_path, containerd))
    assert fourth.returncode == 0 and _recap(fourth.stdout)["changed"] == 0, fourth.stdout


def test_a_worker_imports_only_its_pods_images_and_the_extra_ones(tmp_path, containerd):
    row = _offline_tree(tmp_path / "offline")
    digests = _images(tmp_path / "site", row)
    members, extra_digest = build_layout("registry.example.com/site/agent:1.0", b"agent\n")
    (tmp_path / "site/images/registry.example.com/site/agent").mkdir(parents=True)
    write_archive(tmp_path / "site/images/registry.example.com/site/agent/1.0.oci.tar", members)
    # A site image that is also one of the row's (the CNI's agent here) is fetched and imported once.
    agent = row["artifacts"]["cilium"]["images"]["cilium"]
    site_images = {"agent": "registry.example.com/site/agent:1.0", "also-the-agent": agent}
    extra = ["-e", json.dumps({"kubernetes_images_extra": site_images})]
    run = _play(tmp_path, row, tmp_path / "root", "cache", *_options(tmp_path, containerd, "workers"), *extra)
    assert run.returncode == 0, run.stdout + run.stderr
    wanted = {row["images"][name]: digests[row["images"][name]] for name in ("kube-proxy", "coredns", "pause")}
    # Every node imports the CNI chart's images (its agent and Envoy run everywhere, its operator anywhere).
    wanted.update({reference: digests[reference] for reference in row["artifacts"]["cilium"]["images"].values()})
    wanted["registry.example.com/site/agent:1.0"] = extra_digest
    assert run.stdout.count(f"(item={agent})") == 1, run.stdout  # pushed once
    # Each by its tag and by its digest (the name containerd's CRI looks up for an image referenced by digest).
    by_digest = {reference.rsplit(":", 1)[0] + "@" + digest: digest for reference, digest in wanted.items()}
    assert _listed(containerd) == {**wanted, **by_digest}
    # A worker gets no helm (only the control planes run it).
    assert not (tmp_path / "root/usr/local/bin/helm").exists()
    assert (tmp_path / "root/usr/local/bin/kubelet").exists()
    # The controller fetched and locked only what the batch imports.
    assert yaml.safe_load((tmp_path / "cache" / "images.lock.yml").read_text())["images"] == wanted
    again = _play(tmp_path, row, tmp_path / "root", "cache", *_options(tmp_path, containerd, "workers"), *extra)
    assert again.returncode == 0 and _recap(again.stdout)["changed"] == 0, again.stdout


def test_with_a_site_image_repository_each_image_is_also_named_where_kubeadm_looks(tmp_path, containerd):
    row = _offline_tree(tmp_path / "offline")
    digests = _images(tmp_path / "site", row)
    options = [*_options(tmp_path, containerd), "-e", "kubernetes_image_repository=registry.example.com/k8s"]
    run = _play(tmp_path, row, tmp_path / "root", "cache", *options)
    assert run.returncode == 0, run.stdout + run.stderr
    listed = _listed(containerd)
    for reference in row["images"].values():
        repository, tag = reference.rsplit(":", 1)
        alias = f"registry.example.com/k8s/{repository.rsplit('/', 1)[1]}:{tag}"
        assert listed[reference] == listed[alias] == digests[reference], (reference, listed)
    # kubeadm's imageRepository moves kubeadm's images only: the CNI's keep their names.
    for reference in row["artifacts"]["cilium"]["images"].values():
        assert listed[reference] == digests[reference]
        assert not any(name.startswith("registry.example.com/k8s/cilium") for name in listed), listed
    # containerd's sandbox image is one of those names.
    config = tomllib.loads((tmp_path / "root/etc/containerd/config.toml").read_text())
    assert config["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] in listed
    again = _play(tmp_path, row, tmp_path / "root", "cache", *options)
    assert again.returncode == 0 and _recap(again.stdout)["changed"] == 0, again.stdout
    # A lost alias is a missing image: imported and tagged again.
    pause_alias = config["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"]
    subprocess.run(["ctr", "--address", containerd, "--namespace", "k8s.io", "images", "rm", pause_alias], check=True)
    third = _play(tmp_path, row, tmp_path / "root", "cache", *options)
    assert third.returncode == 0 and _recap(third.stdout)["changed"] > 0, third.stdout
    assert _listed(containerd)[pause_alias] == digests[row["images"]["pause"]]


def test_an_extra_image_may_not_take_a_rows_name(tmp_path, containerd):
    row = _offline_tree(tmp_path / "offline")
    _images(tmp_path / "site", row)
    extra = ["-e", json.dumps({"kubernetes_images_extra": {"pause": "registry.example.com/site/pause:1"}})]
    run = _play(tmp_path, row, tmp_path / "root", "cache", *_options(tmp_path, containerd, "workers"), *extra)
    assert run.returncode != 0
    assert "images_extra names pause, which are the row's images" in run.stdout, run.stdout
    assert _listed(containerd) == {}


def test_a_tampered_image_archive_is_refused_naming_it_and_nothing_is_imported(tmp_path, containerd):
    row = _offline_tree(tmp_path / "offline")
    _images(tmp_path / "site", row, tampered="etcd")
    run = _play(tmp_path, row, tmp_path / "root", "cache", *_options(tmp_path, containerd))
    assert run.returncode != 0
    assert f"etcd ({row['images']['etcd']})" in run.stdout and "tampered" in run.stdout, run.stdout
    assert _listed(containerd) == {}


def test_a_site_registry_moves_the_pause_image_and_mirrors_are_written_as_hosts_toml(tmp_path):
    row = _offline_tree(tmp_path / "offline")
    destdir = tmp_path / "root"
    mirrors = {
        "registry.k8s.io": ["https://registry.example.com", "http://10.0.0.5:5000"],
        "quay.io": ["https://q.example"],
    }
    options = [
        "-e",
        "kubernetes_image_repository=registry.example.com/k8s",
        "-e",
        json.dumps({"confidential_registry_mirrors": mirrors}),
    ]
    run = _play(tmp_path, row, destdir, "cache", *options)
    assert run.returncode == 0, run.stdout + run.stderr
    config = tomllib.loads((destdir / "etc/containerd/config.toml").read_text())
    pause_tag = row["images"]["pause"].rsplit(":", 1)[1]
    assert config["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == (
        f"registry.example.com/k8s/pause:{pause_tag}"
    )
    assert config["plugins"]["io.containerd.cri.v1.images"]["registry"]["config_path"] == "/etc/containerd/certs.d"
    hosts = tomllib.loads((destdir / "etc/containerd/certs.d/registry.k8s.io/hosts.toml").read_text())
    assert hosts["server"] == "https://registry.k8s.io"
    assert list(hosts["host"]) == mirrors["registry.k8s.io"]
    assert all(host["capabilities"] == ["pull", "resolve"] for host in hosts["host"].values())
    assert (
        tomllib.loads((destdir / "etc/containerd/certs.d/quay.io/hosts.toml").read_text())["server"]
        == "https://quay.io"
    )
    stamp = next((destdir / "var/cache/confidential-kubernetes/artifacts").glob("installed-*.sha256")).read_text()
    assert "/etc/containerd/certs.d/quay.io/hosts.toml" in stamp
    again = _play(tmp_path, row, destdir, "cache", *options)
    assert again.returncode == 0 and _recap(again.stdout)["changed"] == 0, again.stdout


def test_without_a_site_registry_the_rows_pause_image_and_no_registry_config(tmp_path):
    row = _offline_tree(tmp_path / "offline")
    destdir = tmp_path / "root"
    run = _play(tmp_path, row, destdir)
    assert run.returncode == 0, run.stdout + run.stderr
    images = tomllib.loads((destdir / "etc/containerd/config.toml").read_text())["plugins"][
        "io.containerd.cri.v1.images"
    ]
    assert images == {"pinned_images": {"sandbox": row["images"]["pause"]}}
    assert not (destdir / "etc/containerd/certs.d").exists()
