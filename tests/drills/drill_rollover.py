# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Drill: roll a new node image's measurements over (measurements.yml add / retire / rollback) on the lab.

One worker reboots into a "new image" (the lab's --tamper: another kernel command line, so its PCR 8 changes; its
PCR 15 is zero after the reboot). Without the rollover its rejoin is refused naming PCR 8; after ``add`` it rejoins and
verify.yml names the nodes still on the old values; ``retire`` is refused naming each of them, and once forced the old
values are refused (the worker, rebooted into the old image, is refused); ``rollback`` restores the policy from before,
byte for byte, and the worker rejoins. The cluster is left as found: untampered, every node Ready, verify passing.

The rejoin is driven by join.yml on that worker: the join role's NodeJoin, the code the boot agent
(confidential-join.service) runs at boot. Where the boot agent is on the node it tries too; both are safe together.
"""

from __future__ import annotations

import hashlib
import re
import time

import yaml

PCR_KERNEL_COMMAND_LINE = 8


def drill(lab) -> dict:
    workers = lab.workers()
    node = workers[-1]
    others = sorted(name for name in lab.hosts() if name != node)
    shape = [f"--control-planes={len(lab.control_planes())}", f"--workers={len(workers)}"]
    policy_file = lab.dir / "measurement-policy.yml"
    before_rollover = policy_file.read_bytes()
    figures: dict = {"node": node}
    state = {"tampered": False, "rollover": False}

    def reboot(tampered: bool) -> float:
        # `lab up` writes the lab's golden policy over the controller's file on every run: keep the controller's.
        kept = policy_file.read_bytes()
        started = time.monotonic()
        lab.lab("up", *shape, *(["--tamper", node] if tampered else []))
        policy_file.write_bytes(kept)
        state["tampered"] = tampered
        return time.monotonic() - started

    def rejoin(expect_refusal: bool) -> float:
        started = time.monotonic()
        run = lab.playbook("join", "-l", node, check=not expect_refusal)
        if expect_refusal:
            assert run.rc != 0, f"{node}'s rejoin with PCR 8 outside the policy was not refused"
            refusal = run.last_failure()
            assert re.search(rf"PCR\(s\) [0-9,]*\b{PCR_KERNEL_COMMAND_LINE}\b[0-9,]* do not match", refusal), (
                f"{node}'s rejoin was refused, but not naming PCR {PCR_KERNEL_COMMAND_LINE}:\n{refusal}"
            )
        else:
            lab.wait_ready()
        return time.monotonic() - started

    def measurements(mode: str, *extra: str, check: bool = True):
        return lab.playbook("measurements", "-e", f"measurements_mode={mode}", *extra, check=check)

    def allowed(index: int) -> list[str]:
        return yaml.safe_load(policy_file.read_text())["pcrs"][str(index)]["allowed"]

    def enforced_everywhere(run) -> str:
        """The digest the run says every join service enforces: the controller file's, and each node's file's."""
        found = re.search(r"enforces the policy with SHA-256\s+([0-9a-f]{64})", run.output)
        assert found, f"measurements.yml printed no confirmed digest:\n{run.output[-2000:]}"
        digest = hashlib.sha256(policy_file.read_bytes()).hexdigest()
        assert found.group(1) == digest, f"confirmed digest {found.group(1)} is not the policy file's {digest}"
        for control_plane in lab.control_planes():
            on_node = lab.ssh(control_plane, "sha256sum /etc/confidential-kubernetes/measurement-policy.yml")
            assert on_node.stdout.decode().split()[0] == digest, f"{control_plane}'s join service has another policy"
        return digest

    try:
        old_values = allowed(PCR_KERNEL_COMMAND_LINE)
        figures["reboot_new_image_seconds"] = round(reboot(tampered=True), 1)
        figures["refused_before_add_seconds"] = round(rejoin(expect_refusal=True), 1)

        state["rollover"] = True
        added = measurements("add", "-e", f"measurements_golden_node={node}")
        figures["add_seconds"] = round(added.seconds, 1)
        new_values = [value for value in allowed(PCR_KERNEL_COMMAND_LINE) if value not in old_values]
        assert allowed(PCR_KERNEL_COMMAND_LINE) == old_values + new_values and len(new_values) == 1, (
            f"add did not allow exactly one new PCR 8 value beside the old: {allowed(PCR_KERNEL_COMMAND_LINE)}"
        )
        backups = sorted(policy_file.parent.glob(policy_file.name + ".*~"), key=lambda path: path.stat().st_mtime)
        assert backups and backups[-1].read_bytes() == before_rollover, "add kept no backup of the policy before"
        enforced_everywhere(added)
        assert measurements("add", "-e", f"measurements_golden_node={node}").changed == 0, "add re-run changed"

        figures["rejoin_after_add_seconds"] = round(rejoin(expect_refusal=False), 1)
        verified = lab.playbook("verify")
        note = re.search(r"nodes still on the values that retire: ([^\"\n]*)", verified.output)
        assert note, f"verify.yml named no node on the old values:\n{verified.output[-2000:]}"
        named = sorted(re.findall(r"([\w.-]+) \(PCR", note.group(1)))
        assert named == others, f"verify.yml named {named} as still on the old values, not {others}"

        refused = measurements("retire", check=False)
        assert refused.rc != 0, "retire was not refused while nodes run the old values"
        for other in others:
            assert f"{other} (PCR {PCR_KERNEL_COMMAND_LINE})" in refused.output, f"retire's refusal names no {other}"
        assert allowed(PCR_KERNEL_COMMAND_LINE) == old_values + new_values, "a refused retire changed the policy"
        # The other nodes are not rebooted into the new image here (control planes would need a recovery): force it.
        retired = measurements("retire", "-e", "measurements_force=true")
        figures["retire_seconds"] = round(retired.seconds, 1)
        assert allowed(PCR_KERNEL_COMMAND_LINE) == new_values, f"retire left {allowed(PCR_KERNEL_COMMAND_LINE)}"
        enforced_everywhere(retired)
        assert measurements("retire", "-e", "measurements_force=true").changed == 0, "retire re-run changed"

        reboot(tampered=False)
        figures["refused_after_retire_seconds"] = round(rejoin(expect_refusal=True), 1)

        refused_rollback = measurements("rollback", check=False)
        assert refused_rollback.rc != 0 and "measurements_force=true" in refused_rollback.output, (
            "rollback after retire was not refused without measurements_force"
        )
        assert allowed(PCR_KERNEL_COMMAND_LINE) == new_values, "a refused rollback changed the policy"
        rolled_back = measurements("rollback", "-e", "measurements_force=true")
        figures["rollback_seconds"] = round(rolled_back.seconds, 1)
        assert policy_file.read_bytes() == before_rollover, "rollback did not restore the policy from before"
        enforced_everywhere(rolled_back)
        assert measurements("rollback").changed == 0, "rollback re-run changed"
        state["rollover"] = False
        figures["rejoin_after_rollback_seconds"] = round(rejoin(expect_refusal=False), 1)
        final = lab.playbook("verify")
        assert "nodes still on the values that retire" not in final.output, "verify.yml still reports a rollover"
    except BaseException:
        lab.log("rollover drill failed: putting the policy from before back and the node on its old image")
        if state["rollover"]:
            measurements("rollback", "-e", "measurements_force=true", check=False)
        if state["tampered"]:
            reboot(tampered=False)
        lab.playbook("join", "-l", node, check=False)
        raise
    return figures
