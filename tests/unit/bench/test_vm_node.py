# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""bench/vm_node.py's reading of what it measures (no VM here): the lab's log line of a VM's boot to SSH, as lab.py
writes it, and pytest's per-test durations."""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "bench"))

import vm_node  # noqa: E402 pylint: disable=wrong-import-position


def test_the_boot_figure_is_read_from_the_line_lab_up_writes():
    source = (REPO / "tests" / "lab" / "cklab" / "lab.py").read_text()
    (template,) = re.findall(r'log\(f"\{name\} answers SSH \{since:\.0f\} s after QEMU started[^"]*"\)', source)
    line = template[len('log(f"') : -len('")')].format(name="vm-0", since=37.4, rss=793.0)
    match = vm_node.SSH_LINE.search(f"lab: starting cp-0 vm-0\nlab: {line}\n")
    assert match and int(match.group(1)) == 37


def test_pytests_durations_are_read_per_test():
    output = """============================== slowest durations ===============================
374.01s call     tests/unit/lab/test_vm_join.py::test_site_joins_the_vm_through_the_real_flow
34.74s setup    tests/unit/lab/test_vm_join.py::test_site_joins_the_vm_through_the_real_flow
0.66s teardown tests/unit/lab/test_vm_join.py::test_another_kernel_command_line_is_refused_naming_the_event
"""
    assert vm_node.DURATION_LINE.findall(output) == [
        ("374.01", "call", "test_site_joins_the_vm_through_the_real_flow"),
        ("34.74", "setup", "test_site_joins_the_vm_through_the_real_flow"),
    ]
