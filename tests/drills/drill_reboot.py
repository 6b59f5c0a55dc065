# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reboot drill: a worker, then the first control plane, reboot (their swtpm restarts, so PCR 15 resets); each comes
back by itself through its boot-time join (a rejoin ticket from a serving control plane), marked again, while the API
never loses its quorum (another control plane answers /readyz throughout). No Ansible run brings them back.

Figures: seconds from the reboot to the node's boot-time join reporting it a member, and to Ready; /readyz failures."""

from __future__ import annotations

import threading
import time

from drill_outage import WAIT_SECONDS, _boot_state, _lock_marks, _pcr15, _wait_for


# The watcher's own API server (admin.conf names the cluster's endpoint, the first control plane's without a VIP), with
# a generous timeout: the lab's 2 cores are shared, and a slow answer is no lost quorum.
READYZ_VERBOSE = ("kubectl --kubeconfig=/etc/kubernetes/admin.conf --server=https://{address}:6443 "
                  "--request-timeout=15s get --raw='/readyz?verbose'")


def _watch_api(lab, node: str, failures: list, stop: threading.Event) -> None:
    """Every failed /readyz of NODE's API server, with the time and what it said."""
    while not stop.is_set():
        done = lab.ssh(node, READYZ_VERBOSE.format(address=lab.hosts()[node]), check=False)
        if done.returncode != 0:
            said = (done.stdout + done.stderr).decode(errors="replace")
            failed = [line.strip() for line in said.splitlines() if line.startswith("[-]")] or [said.strip()[-200:]]
            failures.append(f"{time.strftime('%H:%M:%S')} {'; '.join(failed)}")
        time.sleep(1)


def _reboot(lab, node: str, figures: dict, marks: dict) -> None:
    started = time.monotonic()
    lab.lab("reboot", node)
    assert _pcr15(lab, node) in ("00" * 32, marks[node]), f"{node}: PCR 15 neither reset nor marked after the reboot"
    _wait_for(f"{node} a member again", lambda: _boot_state(lab, node) == "member")
    figures[f"{node}_member_seconds"] = round(time.monotonic() - started, 1)
    assert _pcr15(lab, node) == marks[node], f"{node}: PCR 15 does not carry the cluster's mark after its rejoin"
    lab.wait_ready(WAIT_SECONDS)
    figures[f"{node}_ready_seconds"] = round(time.monotonic() - started, 1)


def drill(lab) -> dict:
    figures: dict = {}
    marks = _lock_marks(lab)
    _reboot(lab, lab.workers()[0], figures, marks)
    first, watcher = lab.control_planes()[0], lab.control_planes()[-1]
    failures: list = []
    stop = threading.Event()
    watch = threading.Thread(target=_watch_api, args=(lab, watcher, failures, stop), daemon=True)
    watch.start()
    try:
        _reboot(lab, first, figures, marks)
    finally:
        stop.set()
        watch.join(timeout=30)
    figures["readyz_failures"] = len(failures)
    assert not failures, f"the API of {watcher} failed /readyz while {first} rebooted: {' | '.join(failures[:5])}"
    lab.playbook("verify")
    return figures
