# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""tpm_evidence against a real swtpm: an event log the node cannot use is left out with a warning (the evidence is
still produced), event_log none includes none, and a log that cannot be read still fails."""

from __future__ import annotations

import os

import pytest
from ansible.module_utils import basic

from ansible_collections.confidential.kubernetes.plugins.modules import tpm_evidence
from module_runner import module_outcome, run_main  # noqa: F401  # pylint: disable=unused-import


@pytest.fixture
def warned(monkeypatch) -> list[str]:
    said: list[str] = []
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda module, warning: said.append(warning))
    return said


def _args(swtpm, **more) -> dict:
    return dict(tcti=swtpm.tcti, nonce=os.urandom(32).hex(), include_ek_certificate=False, **more)


def test_an_unparseable_log_is_left_out_with_a_warning(swtpm, tmp_path, warned):
    log = tmp_path / "binary_bios_measurements"
    log.write_bytes(b"\x00" * 7)
    result = run_main(tpm_evidence.main, _args(swtpm, event_log_path=str(log)))
    assert not result["failed"] and "event_log" not in result["evidence"] and "warnings" not in result
    assert len(warned) == 1 and warned[0].startswith(f"event log {log}: ")
    assert warned[0].endswith("the evidence goes without the event log (its PCRs are checked as quoted)")


def test_event_log_none_includes_none_and_an_unreadable_log_still_fails(swtpm, tmp_path, warned):
    log = tmp_path / "binary_bios_measurements"
    log.write_bytes(b"\x00" * 7)
    result = run_main(tpm_evidence.main, _args(swtpm, event_log_path=str(log), event_log="none"))
    assert not result["failed"] and "event_log" not in result["evidence"] and warned == []
    missing = run_main(tpm_evidence.main, _args(swtpm, event_log_path=str(tmp_path / "absent")))
    assert missing["failed"] and "cannot read the event log" in missing["msg"]
