# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Chart metadata (name, version) of a local chart: a directory or a ``.tgz`` archive, read without helm."""

from __future__ import annotations

import os
import tarfile
from dataclasses import dataclass

try:
    import yaml
except ImportError:  # reported by the modules through missing_required_lib()
    pass


class ChartError(ValueError):
    """The chart cannot be found or read."""


@dataclass(frozen=True)
class ChartRef:
    name: str
    version: str
    local: bool


def _chart_yaml(path: str) -> bytes:
    if os.path.isdir(path):
        try:
            with open(os.path.join(path, "Chart.yaml"), "rb") as handle:
                return handle.read()
        except OSError:
            raise ChartError(f"chart {path}: Chart.yaml file is missing") from None
    try:
        with tarfile.open(path, "r:gz") as archive:
            for member in archive.getmembers():
                parts = member.name.split("/")
                if member.isfile() and len(parts) == 2 and parts[1] == "Chart.yaml":
                    handle = archive.extractfile(member)
                    return handle.read() if handle else b""
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ChartError(f"chart {path} is not a gzipped chart archive: {exc}") from None
    raise ChartError(f"chart {path}: Chart.yaml file is missing")


def is_local(chart_ref: str, chart_repo_url: str | None) -> bool:
    """A chart given as a path (as helm decides: no repository URL, and the path exists or looks like one)."""
    if chart_repo_url:
        return False
    return os.path.exists(chart_ref) or chart_ref.startswith(("/", "./", "../")) or chart_ref.endswith(".tgz")


def resolve_chart(chart_ref: str, chart_version: str | None, chart_repo_url: str | None) -> ChartRef:
    """Name and version the release will run: read from a local chart, or the pinned version of a repository chart."""
    if not is_local(chart_ref, chart_repo_url):
        if not chart_version:
            raise ChartError(
                f"chart {chart_ref} comes from a repository: chart_version is required (upgrades use pinned versions)"
            )
        return ChartRef(chart_ref.rsplit("/", 1)[-1], chart_version, False)
    if not os.path.exists(chart_ref):
        raise ChartError(f"chart {chart_ref} not found: no such file or directory")
    try:
        metadata = yaml.safe_load(_chart_yaml(chart_ref)) or {}
    except yaml.YAMLError as exc:
        raise ChartError(f"chart {chart_ref}: cannot load Chart.yaml: {exc}") from None
    if not isinstance(metadata, dict) or not metadata.get("name") or not metadata.get("version"):
        raise ChartError(f"chart {chart_ref}: Chart.yaml needs a name and a version")
    version = str(metadata["version"])
    if chart_version and chart_version.lstrip("v") != version.lstrip("v"):
        raise ChartError(f"chart {chart_ref} is version {version}, not the pinned chart_version {chart_version}")
    return ChartRef(str(metadata["name"]), version, True)
