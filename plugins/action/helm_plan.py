# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Runs on the controller: reads each release's chart (name, version) and values files where the upgrade role's copy
tasks would find them, then plans every release on the node in one call, before anything is copied there."""

from __future__ import annotations

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase

from ansible_collections.confidential.kubernetes.plugins.module_utils._helm import PLAN_OPTIONS
from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.chart import ChartError
from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.release import resolve_inputs
from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.values import HAS_YAML, ValuesError

# What the node needs of a release besides what the controller resolved (its values travel in resolved, once).
NODE_RELEASE_KEYS = ("release_name", "release_namespace", "chart_ref", "chart_repo_url", "skip_version_policy")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        validation, dummy = self.validate_argument_spec(argument_spec=PLAN_OPTIONS)
        params = validation.validated_parameters
        if not HAS_YAML:
            result.update(failed=True, msg="PyYAML is needed on the controller to read the charts and values files")
            return result
        resolved, failures = [], []
        for release in params["releases"]:
            try:
                resolved.append(resolve_inputs(release, self._find_controller_file))
            except (ChartError, ValuesError) as exc:
                failures.append(f"release {release['release_name']}: {exc}")
        if failures:
            result.update(failed=True, msg="; ".join(failures), plans=[])
            return result
        module_args = dict(
            params,
            resolved=resolved,
            releases=[{key: release[key] for key in NODE_RELEASE_KEYS} for release in params["releases"]],
        )
        planned = self._execute_module(
            module_name="confidential.kubernetes.helm_plan", module_args=module_args, task_vars=task_vars
        )
        result.update(planned)
        return result

    def _find_controller_file(self, path: str) -> str | None:
        """Where the role's copy task finds ``path`` as its src (a relative path is looked up in files/ of the role
        and the playbook); None when it finds nothing."""
        try:
            return self._find_needle("files", path)
        except AnsibleError:
            return None
