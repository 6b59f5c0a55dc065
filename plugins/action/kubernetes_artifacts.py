# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Runs on the controller: select a Kubernetes version's row and fetch its artefacts, verified, into the cache."""

from __future__ import annotations

import os

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.confidential.kubernetes.plugins.module_utils import _versions
from ansible_collections.confidential.kubernetes.plugins.plugin_utils import _artifacts

display = Display()

ARGUMENT_SPEC = dict(
    _artifacts.FETCH_ARGUMENT_SPEC,
    artifacts=dict(type="list", elements="str", default=list(_versions.ARTIFACTS)),
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        validation, dummy = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        params = validation.validated_parameters
        result["changed"] = False
        if params["mirror_url"] and params["source_dir"]:
            result.update(failed=True, msg=_artifacts.SOURCES_CONFLICT)
            return result
        names = _versions.ARTIFACTS + _versions.CHARTS
        unknown = [name for name in params["artifacts"] if name not in names]
        if unknown:
            result.update(failed=True, msg=f"unknown artefacts {', '.join(unknown)}; the table has {', '.join(names)}")
            return result
        wanted = tuple(name for name in names if name in params["artifacts"])
        try:
            row = _artifacts.row_of(params)
            arches = sorted({_versions.node_arch(machine) for machine in params["architectures"]})
            artifacts = _versions.row_artifacts(row, arches, wanted)
        except _versions.VersionTableError as exc:
            result.update(failed=True, msg=str(exc))
            return result
        host = task_vars.get("inventory_hostname", "controller")
        cache_dir = os.path.abspath(os.path.expanduser(params["cache_dir"]))
        if self._task.check_mode:
            missing = [a for a in artifacts if not os.path.exists(_artifacts.cache_path(cache_dir, a))]
            cached: dict = {}
            for artifact in artifacts:
                cached.setdefault(artifact.name, {})[artifact.arch] = _artifacts.cache_path(cache_dir, artifact)
            result.update(
                changed=bool(missing),
                fetched=[a.label for a in missing],
                cache_dir=cache_dir,
                msg="check mode: nothing fetched",
                **_row_facts(row),
                artifacts={
                    name: _entry(row.artifacts[name], paths)
                    for name, paths in cached.items()
                    if name not in {a.name for a in missing}
                },
            )
            return result
        try:
            paths, fetched = _artifacts.fetch_all(
                artifacts,
                cache_dir,
                mirror_url=params["mirror_url"] or None,
                source_dir=params["source_dir"] or None,
                timeout=params["timeout"],
                progress=lambda line: display.display(f"[{host}] kubernetes_artifacts: {line}"),
            )
        except _artifacts.ArtifactError as exc:
            result.update(failed=True, msg=str(exc))
            return result
        result.update(
            changed=bool(fetched),
            fetched=fetched,
            cache_dir=cache_dir,
            artifacts={
                name: _entry(row.artifacts[name], paths[name]) for name in wanted if row.artifacts[name] is not None
            },
            **_row_facts(row),
        )
        return result


def _row_facts(row: _versions.Row) -> dict:
    """What the roles read of the row besides its artefacts."""
    return dict(
        version=row.version,
        images=row.all_images,
        host_packages=list(row.host_packages),
        end_of_life=row.end_of_life.isoformat() if row.end_of_life else None,
    )


def _entry(table_entry: dict, paths: dict) -> dict:
    """The result of one artefact: its version and, per architecture (or once, for a chart), path, sha256, filename."""

    def item(path: str, sha256: str) -> dict:
        return dict(path=path, sha256=sha256, filename=os.path.basename(path))

    if None in paths:
        return dict(version=str(table_entry["version"]), **item(paths[None], table_entry["sha256"]))
    return dict(
        version=str(table_entry["version"]),
        **{arch: item(path, table_entry[arch]["sha256"]) for arch, path in paths.items()},
    )
