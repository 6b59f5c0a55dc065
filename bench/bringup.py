"""Benchmark of a whole bring-up on the lab's real control plane: `lab up` until every node answers SSH, then
site.yml's first run and its re-run (changed=0), each beside the floor playbook on the same nodes (fact gathering and
one command on every node), for 1 control plane + 2 workers and 3 control planes + 3 workers; with --scale for
1 control plane + 2 workers and 1 control plane + 29 workers instead, and the ratio of the two re-runs.
Before those, on a lab of 1 + 2 of its own, the first run's floor: raw `kubeadm init` on the control plane, then
`kubeadm join` on both workers at once (the node stack installed first, untimed: the same binaries and stand-in
kubelet site.yml installs). Each playbook run records its plays' wall times (bench/callback_plugins/play_times.py):
the first run's difference to the floor and the re-runs' shares are printed per play, largest first.

Run as root: .venv/bin/python bench/bringup.py [--scale] [--figures FILE]
Uses the lab of CK_LAB_INDEX (default 0) in CK_LAB_DIR (default: a temporary directory) and tears it down after;
refuses to run while this index's lab bridge exists. Ansible runs with at least as many forks as the lab has nodes.
The collection comes from ANSIBLE_COLLECTIONS_PATH when that is set (it must resolve to this tree), else from
.venv/collections.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAB = REPO / "tests" / "lab" / "lab"
sys.path.insert(0, str(REPO / "tests" / "lab"))

from cklab import nodes as lab_nodes, plan  # noqa: E402
from cklab.paths import LabPaths  # noqa: E402

import _figures  # noqa: E402
from playbooks import floor_playbook  # noqa: E402

PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"
NODE_STACK = REPO / "tests" / "lab" / "node-stack.yml"
SHAPES = ((1, 2), (3, 3))
SCALE_SHAPES = ((1, 2), (1, 29))
RERUN_TARGET = 2.0  # site.yml re-run <= 2x the floor playbook on the same nodes
SCALE_NODES, SCALE_SSH_TARGET = 30, 30.0  # 30 nodes answer SSH in under 30 s
SCALE_RERUN_TARGET = 1.5  # the 1 + 29 re-run <= 1.5x the 1 + 2 re-run
FIRST_RUN_MARGIN = 30.0  # site.yml's first run on 1 + 2 <= raw kubeadm init + join + 30 s
SHARES_SHOWN = 6  # plays given as figures, largest first; the rest as one
TASKS_SHOWN = 12  # tasks of each run printed, largest first
IDLE_SAMPLE = 10.0  # seconds the nodes' CPU is sampled with no playbook running, before each re-run
_CHANGED = re.compile(r"changed=(\d+)")
# The plays of site.yml on 1 + 2 that run kubeadm init and kubeadm join (the floor's two steps).
INIT_PLAY, JOIN_PLAY = "Initialise the first control-plane node", "Join the workers"
# What the lab's kubelet stand-in serves, and the one preflight error it leaves (tests/lab/README.md).
CRI_SOCKET = "unix:///run/kubelet-standin/runtime.sock"
IGNORED_PREFLIGHT_ERRORS = "ImagePull"
_JOIN_COMMAND = re.compile(
    r"kubeadm join \S+ --token \S+\s+(?:\\\s+)?--discovery-token-ca-cert-hash sha256:[0-9a-f]{64}"
)


def init_configuration(control_plane: plan.NodeSpec) -> str:
    """kubeadm's configuration for the floor's init, as tests/unit/lab/test_real_control_plane.py gives it."""
    return f"""apiVersion: kubeadm.k8s.io/v1beta2
kind: InitConfiguration
localAPIEndpoint: {{advertiseAddress: {control_plane.address}, bindPort: 6443}}
nodeRegistration: {{name: {control_plane.name}, criSocket: "{CRI_SOCKET}"}}
---
apiVersion: kubeadm.k8s.io/v1beta2
kind: ClusterConfiguration
kubernetesVersion: v1.20.2
---
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
"""


def timed(argv: list[str], env: dict[str, str], plays: Path | None = None, stdin: str = "") -> tuple[float, str]:
    """Seconds the command took and its output; with ``plays``, a playbook run records its plays' times there."""
    if plays is not None:
        env = dict(
            env,
            ANSIBLE_CALLBACK_PLUGINS=str(REPO / "bench" / "callback_plugins"),
            ANSIBLE_CALLBACKS_ENABLED="play_times",
            CK_BENCH_PLAY_TIMES=str(plays),
        )
    started = time.monotonic()
    done = subprocess.run(argv, env=env, input=stdin, capture_output=True, text=True, timeout=3600, check=False)
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}")
    return elapsed, done.stdout


def play_times(path: Path, total: float) -> dict[str, float]:
    """Seconds per play name (a play imported several times counts once, summed), and what ran outside any play."""
    seconds: dict[str, float] = {}
    for play in json.loads(path.read_text()):
        seconds[play["play"]] = seconds.get(play["play"], 0.0) + play["seconds"]
    seconds["(outside the plays: start-up, parsing)"] = total - sum(seconds.values())
    return seconds


def cpu_seconds(lab_dir: Path, names: list[str]) -> tuple[float, float]:
    """CPU seconds used so far by this process's children (ansible on the controller) and by the lab nodes.

    A node's share is every live process in its pid namespace with what it has reaped (utime, stime, cutime,
    cstime), so a module's process that ran and exited counts through the process that reaped it.
    """
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    paths = LabPaths(lab_dir=lab_dir, cache_dir=lab_dir, repo_root=REPO)
    namespaces = set()
    for name in names:
        nspawn = lab_nodes.live_pid(paths, name, "nspawn")
        if nspawn is None:
            raise SystemExit(f"lab node {name} is not running")
        for child in Path(f"/proc/{nspawn}/task/{nspawn}/children").read_text().split():
            namespaces.add(os.readlink(f"/proc/{child}/ns/pid"))
    namespaces.discard(os.readlink("/proc/self/ns/pid"))
    ticks = 0
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.readlink(entry / "ns" / "pid") in namespaces:
                ticks += sum(int(field) for field in (entry / "stat").read_text().rsplit(")", 1)[1].split()[11:15])
        except OSError:
            continue  # exited meanwhile
    return children.ru_utime + children.ru_stime, ticks / os.sysconf("SC_CLK_TCK")


def task_times(path: Path, measure: str = "seconds") -> list[tuple[str, float]]:
    """Seconds per task name ("ROLE : NAME" in a role; a task that ran several times counts once, summed), largest
    first; with measure="cpu", the machine's CPU seconds during each task instead (the callback's "cpu")."""
    seconds: dict[str, float] = {}
    for play in json.loads(path.read_text()):
        for task in play["tasks"]:
            seconds[task["task"]] = seconds.get(task["task"], 0.0) + task[measure]
    return sorted(seconds.items(), key=lambda item: -item[1])


def kubeadm_floor(env: dict[str, str]) -> dict[str, float]:
    """On a fresh 1 + 2 lab with the node stack installed (untimed): raw kubeadm init, then both joins at once."""
    control_plane, *workers = plan.plan_nodes(1, 2)

    def ssh(node: plan.NodeSpec, command: str, stdin: str = "") -> tuple[float, str]:
        return timed([str(LAB), "ssh", node.name, command], env, stdin=stdin)

    try:
        timed([str(LAB), "up", "--control-planes", "1", "--workers", str(len(workers))], env)
        timed([str(PLAYBOOK), "-i", f"{env['CK_LAB_DIR']}/inventory.yml", str(NODE_STACK)], env)
        ssh(control_plane, "cat > /root/init.yaml", init_configuration(control_plane))
        init, output = ssh(
            control_plane,
            f"kubeadm init --config /root/init.yaml --ignore-preflight-errors={IGNORED_PREFLIGHT_ERRORS}",
        )
        printed = _JOIN_COMMAND.search(output)
        if not printed:
            raise SystemExit(f"kubeadm init printed no join command:\n{output[-3000:]}")
        join_command = " ".join(printed.group(0).replace("\\", " ").split()) + f" --cri-socket {CRI_SOCKET}"
        started = time.monotonic()
        with ThreadPoolExecutor(len(workers)) as pool:
            list(pool.map(lambda worker: ssh(worker, join_command), workers))
        join = time.monotonic() - started
    finally:
        subprocess.run([str(LAB), "down"], env=env, capture_output=True, check=False)
    return {"init": init, "join": join, "floor": init + join}


def bring_up(control_planes: int, workers: int, env: dict[str, str], floor: Path, workdir: Path) -> dict:
    inventory = f"{env['CK_LAB_DIR']}/inventory.yml"
    env = dict(env, ANSIBLE_FORKS=str(max(int(env.get("ANSIBLE_FORKS", "5")), control_planes + workers)))
    shape = f"{control_planes}+{workers}"
    try:
        up, _up_output = timed(
            [str(LAB), "up", "--control-planes", str(control_planes), "--workers", str(workers)], env
        )
        floor_time, _floor_output = timed([str(PLAYBOOK), "-i", inventory, str(floor)], env)
        site = [str(PLAYBOOK), "-i", inventory, "confidential.kubernetes.site"]
        first, _first_output = timed(site, env, workdir / f"{shape}-first.json")
        names = [node.name for node in plan.plan_nodes(control_planes, workers)]
        idle = cpu_seconds(Path(env["CK_LAB_DIR"]), names)[1]
        time.sleep(IDLE_SAMPLE)
        before = cpu_seconds(Path(env["CK_LAB_DIR"]), names)
        idle_rate = (before[1] - idle) / IDLE_SAMPLE
        rerun, output = timed(site, env, workdir / f"{shape}-rerun.json")
        after = cpu_seconds(Path(env["CK_LAB_DIR"]), names)
    finally:
        subprocess.run([str(LAB), "down"], env=env, capture_output=True, check=False)
    changed = sum(int(count) for count in _CHANGED.findall(output.split("PLAY RECAP", 1)[-1]))
    if changed:
        raise SystemExit(f"site.yml re-run on {control_planes}+{workers} changed {changed} things: not idempotent")
    return {
        "up": up,
        "floor": floor_time,
        "first": first,
        "rerun": rerun,
        "rerun cpu controller": after[0] - before[0],
        "rerun cpu nodes": after[1] - before[1],
        "rerun cpu idle": idle_rate * rerun,
        "first plays": play_times(workdir / f"{shape}-first.json", first),
        "rerun plays": play_times(workdir / f"{shape}-rerun.json", rerun),
        "first tasks": task_times(workdir / f"{shape}-first.json"),
        "rerun tasks": task_times(workdir / f"{shape}-rerun.json"),
        "rerun tasks cpu": task_times(workdir / f"{shape}-rerun.json", "cpu"),
    }


def beyond_floor(first_plays: dict[str, float], kubeadm: dict[str, float]) -> list[tuple[str, float]]:
    """Where the first run's time beyond the kubeadm floor goes, per play, largest first (sums to first - floor)."""
    missing = {INIT_PLAY, JOIN_PLAY} - set(first_plays)
    if missing:
        raise SystemExit(f"site.yml ran no play named {', '.join(sorted(missing))}: bench/bringup.py is out of date")
    difference = dict(first_plays)
    difference[INIT_PLAY] -= kubeadm["init"]
    difference[JOIN_PLAY] -= kubeadm["join"]
    return sorted(difference.items(), key=lambda item: -item[1])


def largest(ranked: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """The first SHARES_SHOWN plays of a list ranked largest first, the others summed as one."""
    rest = ranked[SHARES_SHOWN:]
    return ranked[:SHARES_SHOWN] + ([(f"{len(rest)} other plays", sum(s for _n, s in rest))] if rest else [])


def collections_path() -> str:
    """Where ansible finds confidential.kubernetes: ANSIBLE_COLLECTIONS_PATH if set, else .venv/collections; it
    must be this tree (a worktree's .venv may be another tree's)."""
    path = os.environ.get("ANSIBLE_COLLECTIONS_PATH")
    if not path:
        subprocess.run(["bash", str(REPO / "scripts" / "link-collection.sh")], check=True)
        path = str(REPO / ".venv" / "collections")
    for entry in path.split(os.pathsep):
        collection = Path(entry, "ansible_collections", "confidential", "kubernetes")
        if collection.exists():
            if collection.resolve() != REPO:
                raise SystemExit(f"{collection} is {collection.resolve()}, not this tree ({REPO})")
            return path
    raise SystemExit(f"no confidential.kubernetes under {path}")


def main() -> int:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument(
        "--scale",
        action="store_true",
        help=f"1+2 and 1+29 nodes (lab up target: {SCALE_NODES} nodes in < {SCALE_SSH_TARGET:g} s)",
    )
    _figures.add_option(options)
    args = options.parse_args()
    if Path("/sys/class/net", plan.BRIDGE).exists():
        raise SystemExit(
            f"lab {plan.LAB_INDEX} is running (bridge {plan.BRIDGE}): tear it down first (tests/lab/lab down)"
        )
    figures, rows = [], []
    with tempfile.TemporaryDirectory(prefix="ck-bench-bringup-") as temporary:
        env = dict(
            os.environ,
            CK_LAB_DIR=os.environ.get("CK_LAB_DIR") or temporary,
            ANSIBLE_COLLECTIONS_PATH=collections_path(),
        )
        floor = Path(temporary) / "floor.yml"
        floor.write_text(floor_playbook("cluster"))
        kubeadm = kubeadm_floor(env)
        figures += [
            _figures.figure("bring-up", "1 cp + 2 workers: raw kubeadm init", round(kubeadm["init"], 2), "s"),
            _figures.figure(
                "bring-up", "1 cp + 2 workers: raw kubeadm join, both at once", round(kubeadm["join"], 2), "s"
            ),
        ]
        for control_planes, workers in SCALE_SHAPES if args.scale else SHAPES:
            nodes = control_planes + workers
            shape = f"{control_planes} cp + {workers} workers"
            times = bring_up(control_planes, workers, env, floor, Path(temporary))
            rows.append((shape, times))
            ratio = times["rerun"] / times["floor"]
            up_target = (
                (f"< {SCALE_SSH_TARGET:g} s", times["up"] < SCALE_SSH_TARGET) if nodes >= SCALE_NODES else ("", None)
            )
            figures += [
                _figures.figure(
                    "bring-up", f"{shape}: lab up (booted, SSH answers)", round(times["up"], 2), "s", *up_target
                ),
                _figures.figure(
                    "bring-up", f"{shape}: floor playbook (facts + one command)", round(times["floor"], 2), "s"
                ),
                _figures.figure("bring-up", f"{shape}: site.yml first run", round(times["first"], 2), "s"),
            ]
            if (control_planes, workers) == (1, 2):
                over = times["first"] - kubeadm["floor"]
                figures.append(
                    _figures.figure(
                        "bring-up",
                        f"{shape}: site.yml first run - raw kubeadm ({kubeadm['floor']:.1f} s)",
                        round(over, 1),
                        "s",
                        f"<= {FIRST_RUN_MARGIN:g} s",
                        over <= FIRST_RUN_MARGIN,
                    )
                )
                figures += [
                    _figures.figure("bring-up", f"{shape}: first run beyond kubeadm: {play}", round(seconds, 1), "s")
                    for play, seconds in largest(beyond_floor(times["first plays"], kubeadm))
                ]
            figures += [
                _figures.figure("bring-up", f"{shape}: site.yml re-run (changed=0)", round(times["rerun"], 2), "s"),
                _figures.figure(
                    "bring-up",
                    f"{shape}: site.yml re-run / floor",
                    round(ratio, 1),
                    "x",
                    f"<= {RERUN_TARGET:g}x",
                    ratio <= RERUN_TARGET,
                ),
            ]
            cpu = times["rerun cpu controller"] + times["rerun cpu nodes"]
            figures += [
                _figures.figure(
                    "bring-up",
                    f"{shape}: re-run CPU, controller {times['rerun cpu controller']:.1f} s + nodes "
                    f"{times['rerun cpu nodes']:.1f} s (of which their cluster idling {times['rerun cpu idle']:.1f} s)",
                    round(cpu, 1),
                    "s",
                ),
                # The wall time these CPU seconds need at the least on this machine's cores (the other load aside).
                _figures.figure(
                    "bring-up", f"{shape}: re-run CPU / {os.cpu_count()} cores", round(cpu / os.cpu_count(), 1), "s"
                ),
            ]
            figures += [
                _figures.figure(
                    "bring-up",
                    f"{shape}: re-run share: {play} ({seconds:.1f} s)",
                    round(100 * seconds / times["rerun"], 1),
                    "%",
                )
                for play, seconds in largest(sorted(times["rerun plays"].items(), key=lambda item: -item[1]))
            ]
        if args.scale:
            small, large = (times["rerun"] for _shape, times in rows)
            scale = large / small
            figures.append(
                _figures.figure(
                    "bring-up",
                    f"re-run 1 cp + 29 workers / 1 cp + 2 workers ({large:.1f} s / {small:.1f} s)",
                    round(scale, 2),
                    "x",
                    f"<= {SCALE_RERUN_TARGET:g}x",
                    scale <= SCALE_RERUN_TARGET,
                )
            )
    print(
        f"{'real bring-up on the lab':<26} {'lab up s':>9} {'floor s':>8} {'site.yml s':>11} {'re-run s':>9} {'re-run/floor':>13}"
    )
    for shape, times in rows:
        print(
            f"{shape:<26} {times['up']:9.2f} {times['floor']:8.2f} {times['first']:11.2f} {times['rerun']:9.2f} "
            f"{times['rerun'] / times['floor']:12.1f}x"
        )
    print(f"raw kubeadm on 1 cp + 2 workers: init {kubeadm['init']:.2f} s, both joins {kubeadm['join']:.2f} s")
    for shape, times in rows:
        if shape == "1 cp + 2 workers":
            print(f"{shape}: first run beyond raw kubeadm, per play:")
            for play, seconds in beyond_floor(times["first plays"], kubeadm):
                print(f"  {seconds:8.2f} s  {play}")
        print(f"{shape}: first run's slowest tasks:")
        for task, seconds in times["first tasks"][:TASKS_SHOWN]:
            print(f"  {seconds:8.2f} s  {task}")
        print(
            f"{shape}: re-run CPU: controller {times['rerun cpu controller']:.1f} s, nodes {times['rerun cpu nodes']:.1f} s "
            f"(of which their cluster idling, at the rate of {IDLE_SAMPLE:g} s before the re-run: "
            f"{times['rerun cpu idle']:.1f} s)"
        )
        print(f"{shape}: re-run per play:")
        for play, seconds in sorted(times["rerun plays"].items(), key=lambda item: -item[1]):
            print(f"  {seconds:8.2f} s {100 * seconds / times['rerun']:5.1f} %  {play}")
        print(f"{shape}: re-run's slowest tasks:")
        for task, seconds in times["rerun tasks"][:TASKS_SHOWN]:
            print(f"  {seconds:8.2f} s {100 * seconds / times['rerun']:5.1f} %  {task}")
        # The lab's nodes share the controller's cores: where a re-run that is CPU-bound here spends them.
        machine = sum(cpu for _task, cpu in times["rerun tasks cpu"])
        print(f"{shape}: re-run's tasks by the machine's CPU seconds (controller and nodes; {machine:.1f} s in all):")
        for task, cpu in times["rerun tasks cpu"][:TASKS_SHOWN]:
            print(f"  {cpu:8.2f} s {100 * cpu / machine:5.1f} %  {task}")
    _figures.write(args.figures, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
