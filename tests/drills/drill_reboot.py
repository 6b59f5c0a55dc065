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


# A leader election when the first control plane's etcd member goes away fails /readyz's etcd check for a moment; a lost
# quorum would fail it until the member came back. The longest run of failures must stay below this.
ELECTION_SECONDS = 6.0
# The watcher's own API server (admin.conf names the cluster's endpoint, the first control plane's without a VIP), with
# a generous timeout: the lab's 2 cores are shared, and a slow answer is no lost quorum.
READYZ_VERBOSE = (
    "kubectl --kubeconfig=/etc/kubernetes/admin.conf --server=https://{address}:6443 "
    "--request-timeout=15s get --raw='/readyz?verbose'"
)


def _watch_api(lab, node: str, failures: list, stop: threading.Event) -> None:
    """Every failed /readyz of NODE's API server: when (monotonic seconds, wall clock) and which checks failed."""
    while not stop.is_set():
        done = lab.ssh(node, READYZ_VERBOSE.format(address=lab.hosts()[node]), check=False)
        if done.returncode != 0:
            # kubectl quotes the body in its error with escaped newlines.
            said = (done.stdout + done.stderr).decode(errors="replace").replace("\\n", "\n")
            failed = [line.strip() for line in said.splitlines() if line.strip().startswith("[-]")] or [
                said.strip()[-200:]
            ]
            failures.append((time.monotonic(), time.strftime("%H:%M:%S"), "; ".join(failed)))
        time.sleep(1)


def longest_outage(failures: list, poll_seconds: float = 5.0) -> float:
    """The longest run of failed /readyz answers, in seconds: failures less than POLL_SECONDS apart belong together."""
    longest, run_start, last = 0.0, None, None
    for at, _clock, _checks in failures:
        if last is None or at - last > poll_seconds:
            run_start = at
        last = at
        longest = max(longest, last - run_start)
    return longest


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
    figures["readyz_longest_failure_seconds"] = round(longest_outage(failures), 1)
    said = " | ".join(f"{clock} {checks}" for _at, clock, checks in failures[:5])
    assert figures["readyz_longest_failure_seconds"] <= ELECTION_SECONDS, (
        f"the API of {watcher} failed /readyz for {figures['readyz_longest_failure_seconds']} s while {first} rebooted "
        f"(longer than an etcd leader election): {said}"
    )
    if failures:
        lab.log(f"/readyz of {watcher} failed {len(failures)} time(s) during an etcd leader election: {said}")
    lab.playbook("verify")
    return figures
