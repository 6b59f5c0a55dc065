# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Kubernetes versions table (``kubernetes_versions.yml`` beside this file) and its one parser.

One row per Kubernetes version pins every binary a node runs, the images kubeadm uses, the CNI's chart, the host
packages kubeadm's preflight needs, the row's provenance and the end of life of its minor. Everything that reads the
table - the ``kubernetes_artifacts`` action, the roles (through it), the docs generator and the tests - reads it here;
no other file spells its path or its keys.
"""

from __future__ import annotations

import datetime
import os
import re
import urllib.parse
from dataclasses import dataclass

try:
    import yaml
except ImportError:  # the controller has PyYAML (ansible-core requires it); nodes never load the table
    pass

TABLE_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kubernetes_versions.yml")
TABLE_KEY = "kubernetes_versions"
ARTIFACTS = ("kubeadm", "kubelet", "kubectl", "crictl", "containerd", "runc", "cni_plugins", "helm")
# Artefacts that are the same file on every architecture (Helm charts): version, url and sha256 in the entry itself.
CHARTS = ("cilium",)
# The images each chart deploys, which a chart entry names under `images` (by tag and, where upstream publishes one,
# digest): every node imports them where images are preloaded, and the chart is told to run exactly those.
CHART_IMAGES = {"cilium": ("cilium", "cilium-operator", "cilium-envoy")}
IMAGES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy", "etcd", "coredns", "pause")
# Every image name a row may pin: kubeadm's, then its charts'.
IMAGE_NAMES = IMAGES + tuple(image for chart in CHARTS for image in CHART_IMAGES[chart])
ARCHITECTURES = ("amd64", "arm64")
# Ansible's ansible_architecture (uname -m) to the architecture names release URLs use.
MACHINE_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
SHA256 = re.compile(r"^[0-9a-f]{64}$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
# An image reference with an explicit tag and, where upstream publishes one, its digest: registry/path:tag[@sha256:...].
IMAGE_REF = re.compile(
    r"^(?P<repository>[a-z0-9.-]+(?::[0-9]+)?(?:/[a-z0-9._-]+)+):(?P<tag>[A-Za-z0-9_][A-Za-z0-9._-]{0,127})"
    r"(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)
# A Debian package name (Debian policy 5.6.7).
PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
# The keys a row may carry beside its artefacts and images.
ROW_KEYS = ("artifacts", "images", "host_packages", "end_of_life", "kubespray")
# runc releases fixing the container escapes CVE-2025-31133, CVE-2025-52565 and CVE-2025-52881, per branch; a branch
# not named here is older than every fix (below 1.2) or newer than them (1.4 and later: every release is fixed).
RUNC_FIXED = {(1, 2): (1, 2, 8), (1, 3): (1, 3, 3)}
RUNC_FIRST_FIXED_BRANCH = (1, 4)
ALLOW_END_OF_LIFE = "kubernetes_allow_end_of_life"


class VersionTableError(ValueError):
    """The versions table is malformed, or the requested version is not in it (or may not be installed)."""


@dataclass(frozen=True)
class Row:
    """One checked row: what the action, the roles and the docs read."""

    version: str
    artifacts: dict
    images: dict
    host_packages: tuple[str, ...]
    end_of_life: datetime.date | None  # None: not recorded (an inventory's row)
    kubespray: dict  # {"kubernetes": commit, "runtime": commit}: where the checksums were copied from

    @property
    def minor(self) -> str:
        return ".".join(self.version.split(".")[:2])

    def is_end_of_life(self, today: datetime.date) -> bool:
        return self.end_of_life is not None and today >= self.end_of_life

    @property
    def all_images(self) -> dict:
        """kubeadm's images and those of the row's charts, by name."""
        images = dict(self.images)
        for chart in CHARTS:
            images.update((self.artifacts.get(chart) or {}).get("images") or {})
        return images

    def artifact_version(self, name: str) -> str | None:
        entry = self.artifacts.get(name)
        return None if entry is None else str(entry["version"])


def load_table(path: str = TABLE_FILE) -> dict:
    """The table's rows as mappings: {version: row}."""
    try:
        with open(path, encoding="utf-8") as stream:
            document = yaml.safe_load(stream)
    except (OSError, yaml.YAMLError) as exc:
        raise VersionTableError(f"cannot read the versions table {path}: {exc}") from exc
    if not isinstance(document, dict) or not isinstance(document.get(TABLE_KEY), dict):
        raise VersionTableError(f"{path} has no '{TABLE_KEY}' mapping")
    return {str(version): row for version, row in document[TABLE_KEY].items()}


def merged_table(shipped: dict, extra: dict | None) -> dict:
    """The shipped rows with the inventory's rows merged over them (an extra row replaces a shipped one whole)."""
    table = dict(shipped)
    table.update({str(version): row for version, row in (extra or {}).items()})
    return table


def supported(table: dict) -> list[str]:
    """The table's versions, oldest first."""
    return sorted(table, key=version_key)


def row_problems(version: str, row, shipped: bool = True) -> list[str]:
    """Every problem of one row, not just the first: missing artefacts and arches, bad URLs, bad sha256, bad images,
    a runc without the container-escape fixes, bad host packages, provenance or end of life.

    A shipped row must be complete, use https, cite its kubespray commits and record its end of life. An inventory's
    extra row may point at a plain-http mirror and may set an artefact to null, saying explicitly that it provides
    none (a lab build without crictl).
    """
    problems: list[str] = []
    if not isinstance(row, dict):
        return [f"{version}: the row is not a mapping"]
    unknown = sorted(str(key) for key in row if key not in ROW_KEYS)
    if unknown:
        problems.append(f"{version}: unknown keys {unknown} (a row has {', '.join(ROW_KEYS)})")
    artifacts = row.get("artifacts")
    if not isinstance(artifacts, dict):
        return problems + [f"{version}: no 'artifacts' mapping"]
    for name in ARTIFACTS + CHARTS:
        entry = artifacts.get(name)
        if entry is None and name in artifacts and not shipped:
            continue
        if not isinstance(entry, dict):
            problems.append(f"{version}: artefact {name} is missing")
            continue
        if not str(entry.get("version") or ""):
            problems.append(f"{version}: artefact {name} has no version")
        if name in CHARTS:
            unknown = sorted(str(key) for key in entry if key not in ("version", "url", "sha256", "images"))
            if unknown:
                problems.append(f"{version}: artefact {name} is the same on every architecture; unknown keys {unknown}")
            problems += _item_problems(version, name, entry, shipped)
            problems += _chart_image_problems(version, name, entry.get("images"), shipped)
            continue
        arches = [arch for arch in entry if arch != "version"]
        if not arches:
            problems.append(f"{version}: artefact {name} has no architecture")
        for arch in arches:
            if arch not in ARCHITECTURES:
                problems.append(f"{version}: artefact {name} has an unknown architecture {arch!r}")
                continue
            problems += _item_problems(version, f"{name} {arch}", entry[arch], shipped)
    if isinstance(artifacts.get("runc"), dict):
        problems += runc_problems(version, str(artifacts["runc"].get("version") or ""))
    images = row.get("images")
    if not isinstance(images, dict):
        problems.append(f"{version}: no 'images' mapping")
    else:
        for image in IMAGES:
            if not IMAGE_REF.match(str(images.get(image) or "")):
                problems.append(
                    f"{version}: image {image} is missing or not registry/path:tag[@sha256:<digest>] "
                    f"({images.get(image)!r})"
                )
    packages = row.get("host_packages", [])
    if not isinstance(packages, list) or not all(isinstance(p, str) and PACKAGE.match(p) for p in packages):
        problems.append(f"{version}: host_packages is not a list of Debian package names ({packages!r})")
    if "end_of_life" in row or shipped:
        if _date(row.get("end_of_life")) is None:
            problems.append(f"{version}: end_of_life is not a date YYYY-MM-DD ({row.get('end_of_life')!r})")
    if "kubespray" in row or shipped:
        provenance = row.get("kubespray")
        if (
            not isinstance(provenance, dict)
            or sorted(provenance) != ["kubernetes", "runtime"]
            or not all(COMMIT.match(str(commit)) for commit in provenance.values())
        ):
            problems.append(f"{version}: kubespray is not {{kubernetes: <commit>, runtime: <commit>}} ({provenance!r})")
    return problems


def _chart_image_problems(version: str, chart: str, images, shipped: bool) -> list[str]:
    """A shipped chart names every image it deploys; an inventory's row may name some (the lab's stand-in deploys
    only the agent) or none."""
    if images is None and not shipped:
        return []
    if not isinstance(images, dict):
        return [f"{version}: chart {chart} has no 'images' mapping (its {', '.join(CHART_IMAGES[chart])})"]
    problems = []
    unknown = sorted(str(name) for name in images if name not in CHART_IMAGES[chart])
    if unknown:
        problems.append(f"{version}: chart {chart} names unknown images {unknown} (it deploys {CHART_IMAGES[chart]})")
    for image in CHART_IMAGES[chart]:
        if image not in images and not shipped:
            continue
        if not IMAGE_REF.match(str(images.get(image) or "")):
            problems.append(
                f"{version}: chart {chart} image {image} is missing or not registry/path:tag[@sha256:<digest>] "
                f"({images.get(image)!r})"
            )
    return problems


def runc_problems(version: str, runc: str) -> list[str]:
    """A runc older than the container-escape fixes (CVE-2025-31133, CVE-2025-52565, CVE-2025-52881) is refused."""
    match = re.match(r"^(\d+)\.(\d+)\.(\d+)", runc)
    if match is None:
        return [f"{version}: runc {runc} is not a version MAJOR.MINOR.PATCH"]
    found = tuple(int(part) for part in match.groups())
    fixed = RUNC_FIXED.get(found[:2])
    if found[:2] >= RUNC_FIRST_FIXED_BRANCH or (fixed is not None and found >= fixed):
        return []
    wanted = " or ".join(".".join(map(str, f)) for f in RUNC_FIXED.values())
    return [
        f"{version}: runc {runc} has container escapes CVE-2025-31133, CVE-2025-52565 and CVE-2025-52881; use "
        f"runc {wanted} or later on its branch, or any 1.4"
    ]


def _item_problems(version: str, label: str, item, shipped: bool) -> list[str]:
    """The problems of one file's url and sha256."""
    if not isinstance(item, dict):
        return [f"{version}: {label} is not a mapping"]
    problems = []
    url = str(item.get("url") or "")
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in (("https",) if shipped else ("https", "http")) or not urllib.parse.urlsplit(url).path:
        problems.append(f"{version}: {label} url {url!r} is not an {'https' if shipped else 'http(s)'} URL")
    if not SHA256.match(str(item.get("sha256") or "")):
        problems.append(f"{version}: {label} sha256 is not 64 lower-case hex digits")
    return problems


def _date(value) -> datetime.date | None:
    if isinstance(value, datetime.date):
        return value
    try:
        return datetime.date.fromisoformat(str(value))
    except ValueError:
        return None


def parse_row(version: str, row, shipped: bool = True) -> Row:
    """The typed row; a malformed one fails naming every problem."""
    problems = row_problems(version, row, shipped)
    if problems:
        raise VersionTableError("the versions table row is malformed: " + "; ".join(problems))
    return Row(
        version=version,
        artifacts=row["artifacts"],
        images=row["images"],
        host_packages=tuple(row.get("host_packages") or ()),
        end_of_life=_date(row.get("end_of_life")),
        kubespray=dict(row.get("kubespray") or {}),
    )


def select_row(table: dict, version: str, shipped_versions: frozenset[str] = frozenset()) -> Row:
    """The row for ``version``, checked; an unknown version fails with the list of supported ones."""
    version = str(version).lstrip("v")
    if version not in table:
        raise VersionTableError(
            f"Kubernetes {version or '(empty)'} is not in the versions table; supported: "
            f"{', '.join(supported(table)) or 'none'}"
        )
    return parse_row(version, table[version], shipped=version in shipped_versions)


def refuse_end_of_life(row: Row, today: datetime.date, allow: bool) -> None:
    """A row whose Kubernetes minor is end of life is refused unless the operator allows it explicitly."""
    if row.is_end_of_life(today) and not allow:
        raise VersionTableError(
            f"Kubernetes {row.minor} is end of life since {row.end_of_life.isoformat()}; upgrade, or set "
            f"{ALLOW_END_OF_LIFE}: true"
        )


@dataclass(frozen=True)
class Artifact:
    name: str
    version: str
    arch: str | None  # None: the same file on every architecture (a chart)
    url: str
    sha256: str

    @property
    def filename(self) -> str:
        return os.path.basename(urllib.parse.urlsplit(self.url).path)

    @property
    def label(self) -> str:
        return f"{self.name} {self.version} ({self.arch or 'chart'})"


def row_artifacts(row: Row, arches: list[str], names: tuple[str, ...] = ARTIFACTS) -> list[Artifact]:
    """The artefacts ``names`` of a row (the node binaries by default) for the given arches, in table order; a chart
    once, whatever the arches. An arch the row lacks is an error; an artefact the row sets to null is left out."""
    result = []
    for name in (name for name in CHARTS if name in names):
        entry = row.artifacts[name]
        if entry is not None:
            result.append(Artifact(name, str(entry["version"]), None, entry["url"], entry["sha256"]))
    for arch in arches:
        for name in (name for name in ARTIFACTS if name in names):
            entry = row.artifacts[name]
            if entry is None:
                continue
            if arch not in entry:
                raise VersionTableError(f"Kubernetes {row.version} has no {name} for {arch}")
            result.append(Artifact(name, str(entry["version"]), arch, entry[arch]["url"], entry[arch]["sha256"]))
    return result


def node_arch(machine: str) -> str:
    try:
        return MACHINE_ARCH[machine]
    except KeyError:
        raise VersionTableError(
            f"no Kubernetes builds for the node architecture {machine!r} (supported: x86_64, aarch64)"
        ) from None


def version_key(version: str) -> tuple:
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"[.+-]", version))
