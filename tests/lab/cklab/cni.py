"""The lab's CNI chart: Cilium's stand-in (tests/doubles/cilium-chart, README there) packaged by the real helm, and the
entry for it in the lab's row of the versions table, its sha256 taken from the archive the lab just built.

The collection fetches it like any artefact - by URL path from the lab's artefact tree (``kubernetes_artifacts_dir``)
or a mirror serving that tree - verifies the sha256, pushes it and installs it with the real helm.
"""
from __future__ import annotations

import hashlib
import re
import subprocess
import tempfile
from pathlib import Path

from . import LabError
from .paths import LabPaths
from .plan import HOST_ADDRESS

# kubeadm v1.20.2's images (`kubeadm config images list --kubernetes-version v1.20.2`); the lab pulls none of them.
LAB_IMAGES = {
    "kube-apiserver": "k8s.gcr.io/kube-apiserver:v1.20.2",
    "kube-controller-manager": "k8s.gcr.io/kube-controller-manager:v1.20.2",
    "kube-scheduler": "k8s.gcr.io/kube-scheduler:v1.20.2",
    "kube-proxy": "k8s.gcr.io/kube-proxy:v1.20.2",
    "etcd": "k8s.gcr.io/etcd:3.4.13-0",
    "coredns": "k8s.gcr.io/coredns:1.7.0",
    "pause": "k8s.gcr.io/pause:3.2",
}
# The node binaries of the row: the lab's nodes get them bound from the host for now, not through the table.
LAB_BINARIES = ("kubeadm", "kubelet", "kubectl", "crictl", "containerd", "runc", "cni_plugins", "helm")


def artifacts_dir(paths: LabPaths) -> Path:
    """The lab's artefact tree: upstream-style URL paths under one directory (the collection's source_dir)."""
    return paths.lab_dir / "artifacts"


def chart_source(paths: LabPaths) -> Path:
    return paths.doubles_dir / "cilium-chart"


def chart_version(source: Path) -> str:
    match = re.search(r"^version:\s*(\S+)\s*$", (source / "Chart.yaml").read_text(), re.MULTILINE)
    if not match:
        raise LabError(f"{source / 'Chart.yaml'} has no version")
    return match.group(1)


def ensure_chart(paths: LabPaths, tree: Path, base_url: str = f"http://{HOST_ADDRESS}") -> dict:
    """Package the stand-in into ``tree`` (an artefact tree: URL paths under one directory) with the lab's real helm
    when the archive is missing or older than a source file; return its versions-table entry (version, url, sha256),
    the url being the archive's path in the tree under ``base_url``."""
    source = chart_source(paths)
    version = chart_version(source)
    archive = tree / "charts" / f"cilium-{version}.tgz"
    newest = max(path.stat().st_mtime for path in source.rglob("*") if path.is_file())
    if not archive.exists() or archive.stat().st_mtime < newest:
        archive.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=archive.parent) as staging:
            run = subprocess.run([str(paths.kubernetes_bin / "helm-3.17.2"), "package", str(source), "--destination", staging],
                                 capture_output=True, text=True, check=False)
            if run.returncode != 0:
                raise LabError(f"helm package {source} failed: {run.stderr.strip() or run.stdout.strip()}")
            (Path(staging) / archive.name).replace(archive)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    return {"version": version, "url": f"{base_url}/{archive.relative_to(tree)}", "sha256": digest}


def lab_row(paths: LabPaths) -> dict:
    """The lab's row of the versions table: the stand-in CNI chart, kubeadm's images, no node binaries (null)."""
    return {"artifacts": {**dict.fromkeys(LAB_BINARIES), "cilium": ensure_chart(paths, artifacts_dir(paths))},
            "images": dict(LAB_IMAGES)}
