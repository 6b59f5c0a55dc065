# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drills read ansible-playbook's recap: changed counts and failed hosts."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "drills"))

from drilllab import PlaybookRun  # noqa: E402 pylint: disable=wrong-import-position

OUTPUT = """
TASK [x] ***
fatal: [worker-1]: FAILED! => {"msg": "pcr-policy: PCR 8"}

PLAY RECAP *********************************************************************
cp-0                       : ok=12   changed=0    unreachable=0    failed=0    skipped=3    rescued=0    ignored=0
worker-0                   : ok=10   changed=2    unreachable=0    failed=0    skipped=3    rescued=0    ignored=0
worker-1                   : ok=4    changed=1    unreachable=0    failed=1    skipped=0    rescued=0    ignored=0
worker-2                   : ok=0    changed=0    unreachable=1    failed=0    skipped=0    rescued=0    ignored=0
"""


def test_recap_sums_changed_and_names_failed_and_unreachable_hosts():
    run = PlaybookRun.parse("site", 2, OUTPUT, 1.0)
    assert run.changed == 3
    assert run.failed_hosts == ("worker-1", "worker-2")
    assert run.last_failure().startswith('fatal: [worker-1]: FAILED! => {"msg": "pcr-policy: PCR 8"}')


def test_a_converged_run_reports_nothing_changed():
    run = PlaybookRun.parse("site", 0, OUTPUT.replace("changed=2", "changed=0").replace("changed=1", "changed=0"), 1.0)
    assert run.changed == 0
