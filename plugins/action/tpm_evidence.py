# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Runs tpm_evidence on the node as usual; the result of a credential activation is no_log.

A module cannot mark one of its return values no_log, so this action does: a result that carries
``activated_secret`` (the credential secret the TPM released, which proves the AK to whoever holds it) is censored in
the task output, the callbacks and -vvv, exactly as ``no_log: true`` on the task would. A registered variable still
holds it for the tasks that need it.
"""

from __future__ import annotations

from ansible.plugins.action.normal import ActionModule as NormalAction

SECRET_RETURNS = ("activated_secret",)


class ActionModule(NormalAction):
    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        if any(name in result for name in SECRET_RETURNS):
            result["_ansible_no_log"] = True
        return result
