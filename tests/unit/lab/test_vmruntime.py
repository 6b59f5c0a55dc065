"""Tests of what the lab puts on a VM node for its real kubelet (cklab.vmruntime): fast, no VM booted."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

import yaml

from cklab import plan, vmruntime


def _members(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {member.name: tar.extractfile(member).read() for member in tar.getmembers()}


def test_cni_conflist_bridges_a_per_vm_pod_subnet():
    node = plan.plan_nodes(1, 0, vm_workers=2)[-1]
    conflist = json.loads(vmruntime.cni_conflist(node))
    bridge = conflist["plugins"][0]
    assert bridge["type"] == "bridge"
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.244.241.0/24"}]]


def test_oci_archive_names_the_image_and_every_blob_matches_its_digest():
    archive = vmruntime.oci_archive("k8s.gcr.io/pause:3.2", "/pause", {"pause": (b"\x7fELF", 0o755)})
    assert archive == vmruntime.oci_archive("k8s.gcr.io/pause:3.2", "/pause", {"pause": (b"\x7fELF", 0o755)})
    members = _members(archive)
    index = json.loads(members["index.json"])
    (entry,) = index["manifests"]
    assert entry["annotations"] == {"io.containerd.image.name": "k8s.gcr.io/pause:3.2"}
    for name, content in members.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(content).hexdigest() == name.rsplit("/", 1)[1]
    manifest = json.loads(members["blobs/sha256/" + entry["digest"].split(":")[1]])
    config = json.loads(members["blobs/sha256/" + manifest["config"]["digest"].split(":")[1]])
    assert config["config"]["Entrypoint"] == ["/pause"]


def test_the_tools_image_links_its_applets_to_busybox_and_runs_the_cni_stand_ins_agent():
    files = vmruntime.tools_files(b"\x7fELF busybox")
    members = _members(vmruntime.oci_archive(vmruntime.TOOLS_IMAGE, "/bin/sh", files))
    layer_name = next(
        name
        for name, content in members.items()
        if name.startswith("blobs/") and content[:2] == b"\x1f\x8b"  # the gzip layer
    )
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(members[layer_name]))) as layer:
        entries = {member.name: member for member in layer.getmembers()}
        assert entries["bin/sh"].issym() and entries["bin/sh"].linkname == "busybox"
        assert entries["bin/busybox"].mode == 0o755
        agent = layer.extractfile(entries["bin/cilium-agent"]).read()
    # PID 1 of its container: it ends on TERM (a shell ignores it otherwise), so a pod or a node stops at once.
    assert agent.startswith(b"#!/bin/sh\n") and b"trap 'exit 0' TERM\n" in agent and agent.endswith(b"wait\n")


def test_the_cni_stand_in_runs_the_tools_image_only_when_told_to_as_cilium_does():
    """The chart's own image cannot be pulled in the lab: its agents run the tools image because the lab's row names it
    and the collection sets Cilium's image.override (its meaning in Cilium's chart: the whole reference)."""
    values = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "doubles" / "cilium-chart" / "values.yaml").read_text()
    )
    assert values["image"]["override"] is None
    assert f"{values['image']['repository']}:{values['image']['tag']}" != vmruntime.TOOLS_IMAGE
    assert not values["image"]["repository"].startswith("cklab.invalid/")


def test_kube_proxys_image_holds_the_binary_and_the_nf_tables_iptables_commands(tmp_path):
    root = tmp_path / "root"
    (root / "usr/sbin").mkdir(parents=True)
    (root / "usr/sbin/xtables-nft-multi").write_bytes(b"multi")
    (root / "usr/sbin/xtables-nft-multi").chmod(0o755)
    (root / "usr/lib/x86_64-linux-gnu/xtables").mkdir(parents=True)
    (root / "usr/lib/x86_64-linux-gnu/xtables/libxt_comment.so").write_bytes(b"module")
    (root / "usr/lib/x86_64-linux-gnu/libxtables.so.12").symlink_to("libxtables.so.12.7.0")
    (root / "usr/share/doc/iptables").mkdir(parents=True)
    (root / "usr/share/doc/iptables/copyright").write_bytes(b"doc")
    files = vmruntime.kube_proxy_files(b"kube-proxy", root)
    assert files["usr/local/bin/kube-proxy"] == (b"kube-proxy", 0o755)
    assert files["usr/sbin/xtables-nft-multi"] == (b"multi", 0o755)
    assert files["usr/lib/x86_64-linux-gnu/libxtables.so.12"] == "libxtables.so.12.7.0"
    assert "usr/lib/x86_64-linux-gnu/xtables/libxt_comment.so" in files
    for command in (
        "iptables",
        "iptables-save",
        "iptables-restore",
        "ip6tables",
        "ip6tables-save",
        "ip6tables-restore",
    ):
        assert files[f"usr/sbin/{command}"] == "xtables-nft-multi"
    assert not any(name.startswith("usr/share/") for name in files)
