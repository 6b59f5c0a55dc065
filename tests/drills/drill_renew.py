# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Drill: certificates a year later, on the real control plane.

1. A forced renew.yml moves every expiry of kubeadm's files and the join service's certificate later on every control
   plane, the API server and the join service serve the new certificates, and a re-run without force changes nothing.
2. "Expired while powered off": every such certificate is re-signed by its own CA on the node as it is but expired
   yesterday (no clock is touched) and the static pods restarted on them, so kubectl with admin.conf fails; renew.yml
   (not forced: expired is below the threshold) renews, restarts and the API serves again.
3. verify.yml passes and every node is Ready.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import sys
from pathlib import Path

# The product's own list of the files kubeadm renews (read from the source tree: the drill runs outside the collection).
_SPEC = importlib.util.spec_from_file_location(
    "drill_renew_expiry", Path(__file__).resolve().parents[2] / "plugins/module_utils/_kubeadm/expiry.py"
)
expiry = sys.modules.setdefault(_SPEC.name, importlib.util.module_from_spec(_SPEC))
_SPEC.loader.exec_module(expiry)

HELPER = (Path(__file__).with_name("certificates_on_node.py")).read_bytes()
PYTHON = "/opt/confidential-kubernetes/venv/bin/python"
JOINSERVICE_CRT = "/etc/confidential-kubernetes/joinservice.crt"
FILES = [f"/etc/kubernetes/{name}" for name in expiry.RENEWABLE_CERTIFICATES + expiry.RENEWABLE_KUBECONFIGS] + [
    JOINSERVICE_CRT
]
STATIC_PODS = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"]


def _on_node(lab, node: str, *args: str) -> str:
    done = lab.ssh(node, " ".join([PYTHON, "-", *args]), stdin=HELPER, check=False)
    assert done.returncode == 0, (
        f"{node}: certificates_on_node {args[0]} failed: {done.stderr.decode(errors='replace')}"
    )
    return done.stdout.decode()


def _expiries(lab) -> dict[str, dict[str, datetime.datetime]]:
    found = {}
    for node in lab.control_planes():
        report = json.loads(_on_node(lab, node, "report", *FILES))
        assert sorted(report) == sorted(FILES), f"{node}: missing {sorted(set(FILES) - set(report))}"
        found[node] = {path: datetime.datetime.fromisoformat(value) for path, value in report.items()}
    return found


def _assert_served(lab) -> None:
    for node in lab.control_planes():
        served = json.loads(_on_node(lab, node, "served"))
        assert all(served.values()), f"{node}: serves certificates other than those on disk: {served}"


def _assert_later(before: dict, after: dict, what: str) -> None:
    for node, files in before.items():
        stale = [path for path, not_after in files.items() if not after[node][path] > not_after]
        assert not stale, f"{what}: {node}: the expiry did not move later for {', '.join(stale)}"


def _renew(lab, *args: str):
    run = lab.playbook("renew", *args, check=False)
    assert run.rc == 0 and not run.failed_hosts, (
        f"renew.yml {' '.join(args)} failed on {run.failed_hosts}:\n{run.last_failure()}"
    )
    return run, round(run.seconds, 1)


def drill(lab) -> dict:
    first = lab.control_planes()[0]

    before = _expiries(lab)
    forced, forced_seconds = _renew(lab, "-e", "certificates_force=true")
    after = _expiries(lab)
    _assert_later(before, after, "forced renewal")
    _assert_served(lab)
    lab.kubectl("get", "--raw=/readyz")
    again, again_seconds = _renew(lab)
    assert again.changed == 0, f"renew.yml above the threshold changed {again.changed} things:\n{again.output[-4000:]}"
    lab.log(f"forced renewal {forced_seconds} s (changed={forced.changed}), re-run {again_seconds} s (changed=0)")

    # What a year's power-off leaves: every certificate expired, the control plane restarted on them.
    for node in lab.control_planes():
        _on_node(lab, node, "expire", *FILES)
    for node in lab.control_planes():
        _on_node(lab, node, "restart", *STATIC_PODS)
    refused = lab.ssh(
        first, "kubectl --kubeconfig=/etc/kubernetes/admin.conf get --raw=/readyz --request-timeout=10s", check=False
    )
    assert refused.returncode != 0, "kubectl with an expired admin.conf still got an answer"
    expired = _expiries(lab)
    now = datetime.datetime.now(datetime.timezone.utc)
    assert all(v < now for files in expired.values() for v in files.values()), "the drill did not expire every file"
    expired_seconds = _renew(lab)[1]
    renewed = _expiries(lab)
    _assert_later(expired, renewed, "renewal after expiry")
    soon = now + datetime.timedelta(days=300)
    short = [f"{node}:{path}" for node, files in renewed.items() for path, v in files.items() if v < soon]
    assert not short, f"renewed for less than 300 days: {', '.join(short)}"
    _assert_served(lab)
    lab.kubectl("get", "--raw=/readyz")

    verify = lab.playbook("verify", check=False)
    assert verify.rc == 0, f"verify.yml failed after the renewals on {verify.failed_hosts}:\n{verify.last_failure()}"
    verify_seconds = round(verify.seconds, 1)
    ready_seconds = round(lab.wait_ready(), 1)
    return {
        "control_planes": len(lab.control_planes()),
        "files_per_control_plane": len(FILES),
        "forced_renew_s": forced_seconds,
        "forced_changed": forced.changed,
        "rerun_s": again_seconds,
        "expired_renew_s": expired_seconds,
        "verify_s": verify_seconds,
        "ready_after_s": ready_seconds,
    }
