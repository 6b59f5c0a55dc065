# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab as the day-2 drills see it: its nodes over real SSH, kubectl on the first control plane, and the
collection's playbooks run by ansible-playbook against the lab's inventory."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent.parent
LAB = REPO / "tests" / "lab" / "lab"
RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.MULTILINE)


def log(message: str) -> None:
    sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


def collection_root() -> Path:
    """The collection the drills run: the first ANSIBLE_COLLECTIONS_PATH entry's confidential.kubernetes (in CI the
    copy installed from its Galaxy tarball). An AssertionError when the variable is unset."""
    first = os.environ.get("ANSIBLE_COLLECTIONS_PATH", "").split(":")[0]
    if not first:
        raise AssertionError("ANSIBLE_COLLECTIONS_PATH is not set: the drills run the collection it names")
    return Path(first) / "ansible_collections" / "confidential" / "kubernetes"


@dataclass(frozen=True)
class PlaybookRun:
    """One ansible-playbook run: its exit status, its whole output and what its recap counted."""

    name: str
    rc: int
    output: str
    seconds: float
    changed: int = 0
    failed_hosts: tuple[str, ...] = field(default_factory=tuple)

    @classmethod
    def parse(cls, name: str, rc: int, output: str, seconds: float) -> PlaybookRun:
        recap = RECAP.findall(output)
        failed = tuple(host for host, _ok, _changed, unreachable, failed in recap if int(unreachable) or int(failed))
        return cls(name, rc, output, seconds, sum(int(changed) for _h, _o, changed, _u, _f in recap), failed)

    def last_failure(self) -> str:
        """The last failed task's lines (or the output's tail), for an assertion message."""
        marks = [m.start() for m in re.finditer(r"^fatal: |^failed: |^ERROR! ", self.output, re.MULTILINE)]
        return self.output[marks[-1] :][:3000] if marks else self.output[-3000:]


class DrillLab:
    """The running lab of this CK_LAB_INDEX/CK_LAB_DIR (the drills never start a second one)."""

    def __init__(self) -> None:
        self.dir = Path(os.environ.get("CK_LAB_DIR", "/var/tmp/confidential-kubernetes-lab"))
        self.inventory = self.dir / "inventory.yml"
        self.log = log

    def lab(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        completed = subprocess.run([str(LAB), *args], capture_output=True, text=True, check=False)
        if check and completed.returncode != 0:
            raise AssertionError(
                f"lab {' '.join(args)} failed (rc {completed.returncode}):\n{completed.stderr[-3000:]}"
            )
        return completed

    def _group(self, group: str) -> dict[str, str]:
        document = yaml.safe_load(self.inventory.read_text())
        hosts = document["all"]["children"].get(group, {}).get("hosts") or {}
        return {name: host_vars["ansible_host"] for name, host_vars in hosts.items()}

    def hosts(self) -> dict[str, str]:
        return {**self._group("control_plane"), **self._group("workers")}

    def control_planes(self) -> list[str]:
        return list(self._group("control_plane"))

    def workers(self) -> list[str]:
        return list(self._group("workers"))

    def ssh_argv(self, node: str, command: str) -> list[str]:
        ssh_dir = self.dir / "ssh"
        return [
            "ssh",
            "-i",
            str(ssh_dir / "id_ed25519"),
            "-o",
            "BatchMode=yes",
            "-o",
            f"UserKnownHostsFile={ssh_dir / 'known_hosts'}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "ConnectTimeout=10",
            f"root@{self.hosts()[node]}",
            command,
        ]

    def ssh(
        self, node: str, command: str, stdin: bytes | None = None, check: bool = True
    ) -> subprocess.CompletedProcess:
        completed = subprocess.run(self.ssh_argv(node, command), input=stdin or b"", capture_output=True, check=False)
        if check and completed.returncode != 0:
            raise AssertionError(
                f"ssh {node} {command!r} failed (rc {completed.returncode}): "
                f"{completed.stderr.decode(errors='replace')[-2000:]}"
            )
        return completed

    def kubectl(self, *args: str, check: bool = True, node: str | None = None) -> str:
        """kubectl with admin.conf on the first control plane (or NODE); arguments are quoted for the remote shell."""
        quoted = " ".join("'" + arg.replace("'", "'\\''") + "'" for arg in args)
        completed = self.ssh(
            node or self.control_planes()[0],
            f"kubectl --kubeconfig=/etc/kubernetes/admin.conf --request-timeout=20s {quoted}",
            check=check,
        )
        return completed.stdout.decode(errors="replace")

    def playbook(self, name: str, *extra_args: str, check: bool = True) -> PlaybookRun:
        """`ansible-playbook -i <inventory> confidential.kubernetes.<name>` (or a path, when NAME has a slash)."""
        target = str(REPO / name) if "/" in name else f"confidential.kubernetes.{name}"
        env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_STDOUT_CALLBACK="default")
        started = time.monotonic()
        completed = subprocess.run(
            ["ansible-playbook", "-i", str(self.inventory), target, *extra_args],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        run = PlaybookRun.parse(
            name, completed.returncode, completed.stdout + completed.stderr, time.monotonic() - started
        )
        log(f"{name} {' '.join(extra_args)}: rc {run.rc}, changed={run.changed}, {run.seconds:.1f} s")
        if check and run.rc != 0:
            raise AssertionError(
                f"{name} failed (rc {run.rc}, hosts {', '.join(run.failed_hosts) or '-'}):\n{run.last_failure()}"
            )
        return run

    def wait_ready(self, timeout: float = 300.0) -> float:
        """Seconds until every inventory node is a Ready Node; an AssertionError naming the others at TIMEOUT."""
        started = time.monotonic()
        want = set(self.hosts())
        not_ready = want
        while time.monotonic() - started < timeout:
            listing = self.kubectl(
                "get",
                "nodes",
                "-o",
                "jsonpath={range .items[*]}{.metadata.name} "
                '{.status.conditions[?(@.type=="Ready")].status}{"\\n"}{end}',
                check=False,
            )
            ready = {line.split()[0] for line in listing.splitlines() if line.endswith(" True")}
            not_ready = want - ready
            if not not_ready:
                return time.monotonic() - started
            time.sleep(2)
        raise AssertionError(f"nodes not Ready after {timeout:.0f} s: {', '.join(sorted(not_ready))}")
