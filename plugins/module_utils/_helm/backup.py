# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""CRD and custom resource backups before an upgrade, in Constellation's layout, on the controller.

``<backup_dir>/upgrade-<UTC time>/backups/crds/<crd name>.yaml`` and
``.../backups/<group>/<version>/<namespace>/<Kind>/<name>.yaml`` (no namespace level for cluster-scoped resources),
every object exactly as the API serves it (status, managedFields, resourceVersion and uid included: a restore drops
resourceVersion and uid itself). Directories are 0700 and files 0600: custom resources may hold secrets.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
from typing import Callable

try:
    import yaml
except ImportError:  # reported by the action plugin
    pass

from .._files import write_private_file
from .values import dump_values

CRD_LIST = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

# GET an API path, return the decoded JSON body (tests pass the API double; the action plugin the kubernetes client).
ApiGet = Callable[[str], dict]


class BackupError(RuntimeError):
    """The backup could not be completed; the upgrade must not go ahead."""


def dump_object(obj: dict) -> bytes:
    """The backup file's bytes: the served object as block YAML, keys in the order the API served them."""
    return yaml.safe_dump(obj, default_flow_style=False, sort_keys=False, allow_unicode=True).encode()


def _component(value: str, what: str) -> str:
    if not _SAFE.match(value) or value in (".", ".."):
        raise BackupError(f"refusing to write a backup path from the {what} {value!r}")
    return value


def make_upgrade_dir(backup_dir: str, now: datetime.datetime | None = None) -> str:
    """A new ``upgrade-<UTC time>`` directory (0700), never an existing one."""
    stamp = (now or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
    os.makedirs(backup_dir, mode=0o700, exist_ok=True)
    for attempt in range(100):
        path = os.path.join(backup_dir, f"upgrade-{stamp}" + (f"-{attempt}" if attempt else ""))
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            continue
    raise BackupError(f"cannot create a new upgrade directory in {backup_dir}")


def _items(listing: dict, api_version: str, kind: str) -> list[dict]:
    items = []
    for item in listing.get("items") or []:
        if "apiVersion" not in item or "kind" not in item:
            # List items of built-in types come without apiVersion/kind: put them first, as a GET serves them.
            item = dict({"apiVersion": api_version, "kind": kind}, **item)
        items.append(item)
    return items


def backup_crds(api_get: ApiGet, upgrade_dir: str) -> dict:
    """Write every CRD and every custom resource of every served version; returns counts and the file list."""
    root = os.path.join(upgrade_dir, "backups")
    files: list[str] = []
    try:
        crds = _items(api_get(CRD_LIST), "apiextensions.k8s.io/v1", "CustomResourceDefinition")
    except Exception as exc:
        raise BackupError(f"cannot list the CustomResourceDefinitions: {exc}") from None
    os.makedirs(os.path.join(root, "crds"), mode=0o700, exist_ok=True)
    resources = 0
    for crd in crds:
        name = _component(crd["metadata"]["name"], "CRD name")
        path = os.path.join(root, "crds", f"{name}.yaml")
        write_private_file(path, dump_object(crd))
        files.append(path)
        spec = crd.get("spec", {})
        group, plural, kind = spec.get("group", ""), spec["names"]["plural"], spec["names"]["kind"]
        for version in [v["name"] for v in spec.get("versions", []) if v.get("served")]:
            try:
                listing = api_get(f"/apis/{group}/{version}/{plural}")
            except Exception as exc:
                raise BackupError(f"cannot list {plural}.{group}/{version}: {exc}") from None
            for obj in _items(listing, f"{group}/{version}", kind):
                metadata = obj.get("metadata", {})
                parts = [_component(group, "group"), _component(version, "version")]
                if metadata.get("namespace"):
                    parts.append(_component(metadata["namespace"], "namespace"))
                parts += [_component(kind, "kind"), _component(metadata["name"], "name") + ".yaml"]
                path = os.path.join(root, *parts)
                write_private_file(path, dump_object(obj))
                files.append(path)
                resources += 1
    _tighten(root)
    return dict(crds=len(crds), custom_resources=resources, files=files)


def save_release_inputs(upgrade_dir: str, releases: list[dict]) -> list[str]:
    """Copy each local chart and write each release's merged values (``values/<namespace>/<release>.yaml``)."""
    written = []
    for release in releases:
        name = _component(release["release_name"], "release name")
        namespace = _component(release.get("release_namespace") or "default", "namespace")
        values_path = os.path.join(upgrade_dir, "values", namespace, f"{name}.yaml")
        write_private_file(values_path, dump_values(release.get("merged_values") or {}).encode())
        written.append(values_path)
        chart = release.get("chart_ref") or ""
        chart_dir = os.path.join(upgrade_dir, "charts", namespace, name)
        os.makedirs(chart_dir, mode=0o700, exist_ok=True)
        if os.path.isdir(chart):
            target = os.path.join(chart_dir, os.path.basename(os.path.normpath(chart)))
            shutil.copytree(chart, target)
            written.append(target)
        elif os.path.isfile(chart):
            target = os.path.join(chart_dir, os.path.basename(chart))
            shutil.copyfile(chart, target)
            written.append(target)
        reference = {
            k: release.get(k)
            for k in ("release_name", "release_namespace", "chart_ref", "chart_version", "chart_repo_url")
        }
        write_private_file(os.path.join(chart_dir, "reference.json"), json.dumps(reference, indent=2).encode())
    # Only what was written here: backup_crds has tightened backups/ already (it can hold thousands of files).
    for written_root in ("values", "charts"):
        _tighten(os.path.join(upgrade_dir, written_root))
    return written


def _tighten(root: str) -> None:
    for current, dirs, files in os.walk(root):
        os.chmod(current, 0o700)
        for name in files:
            os.chmod(os.path.join(current, name), 0o600)
