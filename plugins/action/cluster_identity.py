# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Runs on the controller: the cluster ID, derived from the root secrets file."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import node_lock_mark
from ansible_collections.confidential.kubernetes.plugins.plugin_utils._secrets import (
    SOURCE_OPTIONS,
    ClusterSecretsError,
    load_from,
)

ARGUMENT_SPEC = dict(SOURCE_OPTIONS)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        validation, dummy = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        try:
            identity = load_from(validation.validated_parameters, self._loader).cluster_id()
        except ClusterSecretsError as exc:
            result.update(failed=True, msg=str(exc))
            return result
        result.update(changed=False, cluster_id=identity.hex(), node_lock_mark=node_lock_mark(identity).hex())
        return result
