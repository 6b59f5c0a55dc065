"""The lab's CNI chart: Cilium's stand-in (tests/doubles/cilium-chart, README there) packaged by the real helm, and the
entry for it in the lab's row of the versions table, its sha256 taken from the archive the lab just built.

It goes into the lab mirror's tree (cklab/mirror.py), which `lab up` serves on the bridge; the collection fetches it
like any artefact, by its URL path from the mirror, verifies the sha256, pushes it and installs it with the real helm.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

from . import LabError, mirror
from .host import file_sha256
from .paths import LabPaths
from .vmruntime import TOOLS_IMAGE


def chart_source(paths: LabPaths) -> Path:
    return paths.doubles_dir / "cilium-chart"


def chart_version(source: Path) -> str:
    match = re.search(r"^version:\s*(\S+)\s*$", (source / "Chart.yaml").read_text(), re.MULTILINE)
    if not match:
        raise LabError(f"{source / 'Chart.yaml'} has no version")
    return match.group(1)


def ensure_chart(paths: LabPaths, tree: Path, base_url: str) -> dict:
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
            run = subprocess.run(
                [str(paths.kubernetes_bin / "helm-3.17.2"), "package", str(source), "--destination", staging],
                capture_output=True,
                text=True,
                check=False,
            )
            if run.returncode != 0:
                raise LabError(f"helm package {source} failed: {run.stderr.strip() or run.stdout.strip()}")
            (Path(staging) / archive.name).replace(archive)
    digest = file_sha256(archive)
    return {"version": version, "url": f"{base_url}/{archive.relative_to(tree)}", "sha256": digest}


def with_chart(rows: dict, paths: LabPaths, tree: Path) -> dict:
    """The lab's rows of the versions table (mirror.load_row) with the stand-in chart packaged into the mirror's tree
    and entered as each row's `cilium` artefact, its url on the rows' base (the mirror serves the tree), naming the
    lab's tools image as the agent's image (the stand-in deploys only the agent), which the VM nodes import."""
    chart = {**ensure_chart(paths, tree, mirror.ROW_BASE_URL), "images": {"cilium": TOOLS_IMAGE}}
    return {version: {**row, "artifacts": {**row["artifacts"], "cilium": chart}} for version, row in rows.items()}
