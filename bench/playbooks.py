"""Benchmark of the playbooks on the lab: wall time of init.yml (first run and idempotent re-runs)
and site.yml, beside a floor playbook on the same node (fact gathering plus one command).

Run as root: .venv/bin/python bench/playbooks.py [--runs N] [--figures FILE]
Brings up the lab of CK_LAB_INDEX (default 0) in CK_LAB_DIR (default: a temporary directory), 1 control plane +
1 worker, and tears it down after; refuses to run while this index's lab bridge exists (labs of other indexes run
side by side undisturbed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAB = REPO / "tests" / "lab" / "lab"
sys.path.insert(0, str(REPO / "tests" / "lab"))

from cklab import plan  # noqa: E402

import _figures  # noqa: E402

PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"


def floor_playbook(hosts: str) -> str:
    """The floor every playbook pays on those hosts: one SSH session each, fact gathering and one command."""
    return f"""---
- name: Floor
  hosts: {hosts}
  gather_facts: true
  tasks:
    - name: One command
      ansible.builtin.command: "true"
      changed_when: false
"""


def timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1200, check=False)
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}")
    return elapsed


def row(name: str, times: list[float]) -> str:
    return f"{name:<34} {statistics.median(times):8.2f} {min(times):8.2f} {max(times):8.2f}   ({len(times)} runs)"


def main() -> int:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--runs", type=int, default=3)
    _figures.add_option(options)
    args = options.parse_args()
    if Path("/sys/class/net", plan.BRIDGE).exists():
        raise SystemExit(
            f"lab {plan.LAB_INDEX} is running (bridge {plan.BRIDGE}): tear it down first (tests/lab/lab down)"
        )
    subprocess.run(["bash", str(REPO / "scripts" / "link-collection.sh")], check=True)
    with tempfile.TemporaryDirectory(prefix="ck-bench-playbooks-") as temporary:
        lab_dir = os.environ.get("CK_LAB_DIR") or temporary
        env = dict(
            os.environ,
            CK_LAB_DIR=lab_dir,
            ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"),
            ANSIBLE_HOST_KEY_CHECKING="True",
        )
        inventory = f"{lab_dir}/inventory.yml"
        floor = Path(temporary) / "floor.yml"
        floor.write_text(floor_playbook("control_plane[0]"))
        try:
            timed([str(LAB), "up", "--control-planes", "1", "--workers", "1"], env)
            floor_times = [timed([str(PLAYBOOK), "-i", inventory, str(floor)], env) for _run in range(args.runs)]
            # init.yml alone expects kubeadm on the node: the node stack first (site.yml's node play does it), untimed.
            timed([str(PLAYBOOK), "-i", inventory, str(REPO / "tests" / "lab" / "node-stack.yml")], env)
            first = [timed([str(PLAYBOOK), "-i", inventory, "confidential.kubernetes.init"], env)]
            rerun = [
                timed([str(PLAYBOOK), "-i", inventory, "confidential.kubernetes.init"], env)
                for _run in range(args.runs)
            ]
            site = [
                timed([str(PLAYBOOK), "-i", inventory, "confidential.kubernetes.site"], env)
                for _run in range(args.runs)
            ]
        finally:
            subprocess.run([str(LAB), "down"], env=env, capture_output=True, check=False)
    print(f"{'playbook on the lab':<34} {'median s':>8} {'min s':>8} {'max s':>8}")
    print(row("floor (facts + one command)", floor_times))
    print(row("init.yml, first run", first))
    print(row("init.yml, re-run (changed=0)", rerun))
    print(row("site.yml, re-run (changed=0)", site))
    ratio = statistics.median(rerun) / statistics.median(floor_times)
    print(f"init re-run / floor = {ratio:.2f}x   (target < 2x: {'met' if ratio < 2 else 'MISSED'})")
    _figures.write(
        args.figures,
        [
            _figures.figure(
                "playbooks", "floor: facts + one command (median)", round(statistics.median(floor_times), 2), "s"
            ),
            _figures.figure("playbooks", "init.yml first run", round(first[0], 2), "s"),
            _figures.figure(
                "playbooks", f"init.yml re-run (median of {len(rerun)})", round(statistics.median(rerun), 2), "s"
            ),
            _figures.figure(
                "playbooks", f"site.yml re-run (median of {len(site)})", round(statistics.median(site), 2), "s"
            ),
            _figures.figure("playbooks", "init re-run / floor", round(ratio, 2), "x", "< 2x", ratio < 2),
        ],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
