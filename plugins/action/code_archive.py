# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Runs on the controller, in its process: pack this collection's code into a deterministic archive at ``dest``."""

from __future__ import annotations

import hashlib
import os

from ansible.plugins.action import ActionBase

from ansible_collections.confidential.kubernetes.plugins.module_utils._files import write_file_atomically
from ansible_collections.confidential.kubernetes.plugins.plugin_utils import _code_archive

ARGUMENT_SPEC = dict(dest=dict(type="path", required=True))


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        validation, dummy = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        dest = os.path.abspath(validation.validated_parameters["dest"])
        archive = _code_archive.pack()
        try:
            with open(dest, "rb") as existing:
                current = existing.read(len(archive) + 1) == archive
        except FileNotFoundError:
            current = False
        except OSError as exc:
            result.update(failed=True, msg=f"cannot read {dest}: {exc}")
            return result
        if not current and not self._task.check_mode:
            try:
                # Renamed into place whole: a run packing at the same time never reads half an archive.
                write_file_atomically(dest, archive, 0o644)
            except OSError as exc:
                result.update(failed=True, msg=f"cannot write the code archive {dest}: {exc}")
                return result
        result.update(changed=not current, dest=dest, sha256=hashlib.sha256(archive).hexdigest(), size=len(archive))
        return result
