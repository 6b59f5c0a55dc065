# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A module's main() run in-process: with the ``module_outcome`` fixture, exit_json and fail_json raise the result
instead of printing it and exiting. A test file imports the fixture by name (it is autouse there only)."""

from __future__ import annotations

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args


class Outcome(Exception):
    pass


@pytest.fixture(autouse=True)
def module_outcome(monkeypatch):
    def exit_json(module, **kwargs):
        raise Outcome(dict(kwargs, failed=False))

    def fail_json(module, msg, **kwargs):
        raise Outcome(dict(kwargs, msg=msg, failed=True))

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)


def run_main(main, args: dict) -> dict:
    """The result main() exits or fails with for these module arguments."""
    with patch_module_args(args), pytest.raises(Outcome) as raised:
        main()
    return raised.value.args[0]
