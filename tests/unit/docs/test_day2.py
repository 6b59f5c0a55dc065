# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The day-2 runbook table says what recover.md and the boot-time join do: a rebooted node rejoins by itself only
while a join service answers it, and the reboot of the only control plane (no other join service) needs recover.yml."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _rows() -> list[list[str]]:
    lines = (REPO / "docs" / "day2.md").read_text().splitlines()
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines if line.startswith("| ")]


def test_a_reboot_that_needs_nothing_is_one_another_join_service_answers():
    needs_nothing = [row for row in _rows() if "reboot" in row[0] and row[1].startswith("nothing")]
    assert needs_nothing, "day2.md has no row for a rebooted node"
    for what_happened, _do, _runbook in needs_nothing:
        assert "another control plane's join service" in what_happened, what_happened


def test_the_only_control_plane_s_reboot_needs_recover():
    rows = [row for row in _rows() if "only control plane" in row[0] and "reboot" in row[0]]
    assert len(rows) == 1, "day2.md has no row for the reboot of the only control plane"
    _what, do, runbook = rows[0]
    assert do.startswith("`recover.yml`") and "(playbooks/recover.md)" in runbook
    # recover.md says the same of a lone rebooted control plane's join.
    assert "waits for keys" in do or "waiting for keys" in do
