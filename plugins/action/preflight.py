# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Runs on the controller, with no round trip: the controller's Python and ansible-core, and what a node reported
(its machine and Python), against what the collection supports."""

from __future__ import annotations

import os
import sys

from ansible.plugins.action import ActionBase
from ansible.release import __version__ as ANSIBLE_CORE_VERSION

from ansible_collections.confidential.kubernetes.plugins.module_utils._node.preflight import (
    controller_problems,
    node_problems,
)

try:
    import yaml
except ImportError:  # ansible-core requires PyYAML
    pass

RUNTIME_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "meta", "runtime.yml")

ARGUMENT_SPEC = dict(
    node_architecture=dict(type="str"),
    node_python_version=dict(type="str"),
)


def requires_ansible(runtime_file: str = RUNTIME_FILE) -> str:
    with open(runtime_file, encoding="utf-8") as handle:
        return yaml.safe_load(handle)["requires_ansible"]


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        validation, dummy = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        params = validation.validated_parameters
        host = (task_vars or {}).get("inventory_hostname", "controller")
        try:
            problems = controller_problems(tuple(sys.version_info[:3]), ANSIBLE_CORE_VERSION, requires_ansible())
            problems += node_problems(host, params["node_architecture"], params["node_python_version"])
        except ValueError as exc:
            result.update(failed=True, msg=f"preflight: {exc}")
            return result
        result.update(changed=False, problems=problems)
        if problems:
            result.update(failed=True, msg="; ".join(problems) + ". Nothing was changed.")
        return result
