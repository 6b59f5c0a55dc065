"""The lab's commands: up, down, status, ssh."""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from . import (
    LabError,
    base as base_image,
    cni,
    guest,
    kubernetes,
    measure,
    mirror,
    network,
    nodes,
    runtime,
    tpm,
    vm,
    vmruntime,
)
from .host import check_host, ensure_inotify_instances, missing_packages, run
from .inventory import render_inventory, ssh_options
from .paths import KUBERNETES_VERSION, LabPaths
from .plan import BRIDGE, KIND_NSPAWN, KIND_VM, NodeSpec, is_lab_node_name, plan_nodes

START_WORKERS = 8
SSH_PORT = 22


def log(message: str) -> None:
    print(f"lab: {message}", file=sys.stderr, flush=True)


@contextmanager
def locked(paths: LabPaths) -> Iterator[None]:
    """One lab command at a time per lab dir."""
    paths.lab_dir.mkdir(parents=True, exist_ok=True)
    with open(paths.lab_dir / ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise LabError(f"another lab command is running on {paths.lab_dir}") from exc
        yield


def boot_timeout(node_count: int) -> float:
    """Bound on the wait for SSH: generous for a loaded 2-core machine, still finite."""
    configured = os.environ.get("CK_LAB_BOOT_TIMEOUT")
    if configured:
        return float(configured)
    return 60.0 + 2.0 * node_count


def vm_boot_timeout() -> float:
    """Bound on a VM's wait for SSH: about 2 minutes alone under TCG on 2 cores, 5 beside others (REAL-NODE.md)."""
    return float(os.environ.get("CK_LAB_VM_BOOT_TIMEOUT") or 900.0)


# ---- up ---------------------------------------------------------------------------------


def up(paths: LabPaths, control_planes: int, workers: int, tamper: list[str], vm_workers: int = 0) -> None:
    wanted = plan_nodes(control_planes, workers, set(tamper), vm_workers)
    check_host()
    bin_dir = kubernetes.ensure_kubernetes(paths, log=log)
    # The relabelled build the upgrade moves to (its kube-* binaries are bound into the nodes, its row is offered).
    upgrade_dir = kubernetes.ensure_kubernetes(paths, log=log, release=kubernetes.RELABELLED).parent
    image = guest.ensure_guest(paths, log=log) if vm_workers else None
    # The nodes mount the Kubernetes tool doubles from here; they may not be written yet.
    (paths.doubles_dir / "bin").mkdir(parents=True, exist_ok=True)
    with locked(paths):
        base = base_image.ensure_base(paths, log=log)
        _ensure_lab_identity(paths)
        started = time.monotonic()
        try:
            fresh = _converge(paths, wanted, base, image)
            # The nodes get kubeadm, kubelet, kubectl and helm through the node role, from this mirror.
            network.ensure_bridge()
            tree = mirror.tree_dir(bin_dir.parent)
            mirror_url = mirror.serve(paths, tree)
            row = mirror.load_row(bin_dir.parent)
            rows = cni.with_chart({**row, **mirror.load_row(upgrade_dir)}, paths, tree)
            _write_outputs(paths, wanted, base, runtime.with_runtime(rows, paths, tree, log), mirror_url)
            _wait_for_ssh(paths, wanted, boot_timeout(len(fresh)))
            if image is not None:
                _enrol_vms(paths, wanted, base, image)
                _prepare_vm_runtimes(paths, wanted, row)
        except LabError:
            log("tearing the lab down after the failure")
            _teardown(paths)
            raise
    log(
        f"{len(wanted)} nodes up ({len(fresh)} started) in {time.monotonic() - started:.1f} s; "
        f"Kubernetes mirror at {mirror_url}"
    )
    print(paths.inventory)


def check_kubernetes_bin(paths: LabPaths) -> None:
    """Every binary the nodes run or get from the mirror is in paths.kubernetes_bin (nothing is built here)."""
    needed = {*base_image.IMAGE_BINARIES, *(artifact.source for artifact in mirror.ARTIFACTS)}
    missing = [name for name in sorted(needed) if not os.access(paths.kubernetes_bin / name, os.X_OK)]
    missing += [
        f"{paths.upgrade_bin.parent.name}/{name}"
        for name in base_image.UPGRADE_IMAGE_BINARIES
        if not os.access(paths.upgrade_bin / name, os.X_OK)
    ]
    if missing:
        raise LabError(
            f"Kubernetes binaries missing from {paths.kubernetes_bin}: {' '.join(missing)} "
            "(build them with tests/lab/lab kubernetes)"
        )


def cannot_boot(paths: LabPaths) -> str | None:
    """Why a lab of this index cannot be booted here now (for tests that skip), or None: nothing is built or changed."""
    if os.geteuid() != 0:
        return "the lab needs root"
    if missing_packages():
        return "missing host packages: " + " ".join(missing_packages())
    try:
        check_kubernetes_bin(paths)
    except LabError as exc:
        return str(exc)
    if Path("/sys/class/net", BRIDGE).exists():
        return f"a lab is already running (bridge {BRIDGE} exists); not disturbing it"
    return None


def _ensure_lab_identity(paths: LabPaths) -> None:
    """The lab SSH key and the lab EK CA, made once and kept across downs."""
    paths.ssh_dir.mkdir(parents=True, exist_ok=True)
    paths.ssh_dir.chmod(0o700)
    if not paths.ssh_key.is_file():
        run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "confidential-kubernetes-lab", "-f", paths.ssh_key],
            what="ssh-keygen for the lab key",
        )
    tpm.write_ca_config(paths)


def _image_id(node: NodeSpec, base: base_image.Base, image: guest.GuestImage | None) -> str | None:
    """What a node boots: the nspawn base's image id, or a VM's guest image key."""
    if node.kind == KIND_VM:
        return image.key if image is not None else None
    return base.image_id


def _is_running(paths: LabPaths, node: NodeSpec) -> bool:
    return vm.is_running(paths, node.name) if node.kind == KIND_VM else nodes.is_running(paths, node.name)


def _converge(
    paths: LabPaths, wanted: list[NodeSpec], base: base_image.Base, image: guest.GuestImage | None
) -> list[NodeSpec]:
    """Make the running nodes exactly `wanted`; return the nodes that were (re)started."""
    wanted_names = {node.name for node in wanted}
    surplus = [name for name in _recorded_names(paths) if name not in wanted_names]
    if surplus:
        log(f"removing nodes not asked for: {' '.join(surplus)}")
        _stop_nodes(paths, surplus)
        for name in surplus:
            shutil.rmtree(paths.node_dir(name), ignore_errors=True)
    to_start = []
    for node in wanted:
        record = nodes.recorded(paths, node.name)
        image_id = _image_id(node, base, image)
        same = (
            record is not None
            and record.get("image_id") == image_id
            and record.get("tampered") == node.tampered
            and record.get("address") == node.address
            and record.get("kind", KIND_NSPAWN) == node.kind
        )
        if same and _is_running(paths, node):
            continue
        if record is not None and (record.get("image_id") != image_id or record.get("kind", KIND_NSPAWN) != node.kind):
            # A node over another base keeps nothing: its upper dir (a VM's root overlay) belongs to that base.
            _stop_nodes(paths, [node.name])
            shutil.rmtree(paths.node_dir(node.name), ignore_errors=True)
        to_start.append(node)
    if not to_start:
        log("all nodes already running")
        return []
    _stop_nodes(paths, [node.name for node in to_start])
    ensure_inotify_instances(len(wanted), log=log)
    network.ensure_bridge()
    setup_conf = paths.ca_dir / "swtpm_setup.conf"
    if not tpm.ca_exists(paths):
        # swtpm_localca makes the CA on first use; one node first so parallel setups share it.
        tpm.manufacture(paths, to_start[0].name, setup_conf)
    authorized_key = (paths.ssh_dir / "id_ed25519.pub").read_text()
    log(f"starting {' '.join(node.name for node in to_start)}")
    _start_nodes(paths, to_start, base, image, setup_conf, authorized_key)
    return to_start


def _start_nodes(
    paths: LabPaths,
    chosen: list[NodeSpec],
    base: base_image.Base,
    image: guest.GuestImage | None,
    setup_conf: Path,
    authorized_key: str,
) -> None:
    """VMs first, one after the other (their boot is the long one), then the nspawn nodes in parallel."""
    failures = []
    for node in (node for node in chosen if node.kind == KIND_VM):
        try:
            vm.start(paths, node, image, setup_conf, authorized_key, log)
        except LabError as exc:
            failures.append(f"{node.name}: {exc}")
    containers = [node for node in chosen if node.kind != KIND_VM]
    with ThreadPoolExecutor(max_workers=START_WORKERS) as pool:
        results = list(pool.map(lambda n: _start_node(paths, n, base, setup_conf, authorized_key), containers))
    failures += [message for message in results if message]
    if failures:
        raise LabError("; ".join(failures))


def _start_node(
    paths: LabPaths, node: NodeSpec, base: base_image.Base, setup_conf: Path, authorized_key: str
) -> str | None:
    """Manufacture (once), power on the TPM, measure the boot, boot the node. Return an error or None."""
    try:
        paths.node_dir(node.name).mkdir(parents=True, exist_ok=True)
        new_tpm = not (tpm.tpm_state_dir(paths, node.name) / "tpm2-00.permall").is_file()
        tpm.manufacture(paths, node.name, setup_conf)
        tpm.start(paths, node.name)
        if new_tpm:
            tpm.export_ek_ca(paths)
            tpm.verify_ek_certificate(paths, node.name)
        events = measure.boot_events(base.image_id, node.tampered)
        tpm.extend_events(paths, node.name, events)
        log = measure.event_log(events)
        (tpm.tpm_dir(paths, node.name) / measure.EVENT_LOG_FILE).write_bytes(log)
        # What the verifier will compute: the written log replayed by the collection's parser.
        expected = measure.replay_log(log)
        actual = tpm.read_pcrs(paths, node.name, measure.MEASURED_PCRS)
        if actual != expected:
            return f"{node.name}: TPM PCRs {actual} differ from the replayed event log {expected}"
        nodes.prepare(paths, node, base.image_id, authorized_key)
        nodes.start(paths, node, base)
    except LabError as exc:
        return f"{node.name}: {exc}"
    return None


def _write_outputs(
    paths: LabPaths, wanted: list[NodeSpec], base: base_image.Base, versions_row: dict, mirror_url: str
) -> None:
    tpm.export_ek_ca(paths)
    paths.measurement_policy.write_text(measure.golden_policy(base.image_id))
    known_hosts = []
    for node in wanted:
        public_key = vm.host_public_key if node.kind == KIND_VM else nodes.host_public_key
        key = public_key(paths, node.name).read_text().split()
        known_hosts.append(f"{node.address} {key[0]} {key[1]}\n")
    paths.known_hosts.write_text("".join(known_hosts))
    paths.inventory.write_text(
        render_inventory(wanted, paths.lab_dir, paths.ssh_key, paths.known_hosts, versions_row, mirror_url)
    )


def _enrol_vms(paths: LabPaths, wanted: list[NodeSpec], base: base_image.Base, image: guest.GuestImage) -> None:
    """The measurement policy with the VM nodes' golden values beside the nspawn nodes': PCRs 0-8 from a booted VM's
    firmware log (the firmware and kernel are the image's, the same in every VM), PCR 9 computed from the image's
    manifest and the untampered command line; every untampered VM must replay to exactly those values."""
    vms = [node for node in wanted if node.kind == KIND_VM]
    if not vms:
        return
    untampered = [node for node in vms if not node.tampered]
    raw_logs = {node.name: _read_event_log(paths, node) for node in untampered or vms[:1]}
    for name, raw in raw_logs.items():
        # Kept for a look when enrolment fails (the teardown removes the node directories).
        (paths.lab_dir / f"{name}-event-log.bin").write_bytes(raw)
    try:
        golden = measure.vm_golden(
            next(iter(raw_logs.values())), vm.KERNEL_COMMAND_LINE, guest.manifest_digests(image)["initrd.img"]
        )
        for node in untampered:
            replayed = measure.replay_log(raw_logs[node.name])
            differing = [pcr for pcr in measure.MEASURED_PCRS if replayed.get(pcr) != golden.pcrs.get(pcr)]
            if differing:
                raise ValueError(
                    f"{node.name}'s event log replays PCR(s) {differing} to other values than the golden ones"
                )
    except ValueError as exc:
        raise LabError(f"cannot enrol the VM nodes' measurements: {exc}") from exc
    paths.measurement_policy.write_text(measure.golden_policy(base.image_id, golden))
    log("measurement policy: VM golden " + ", ".join(f"PCR {pcr} {value[:12]}" for pcr, value in golden.pcrs.items()))


def _prepare_vm_runtimes(paths: LabPaths, wanted: list[NodeSpec], row: dict) -> None:
    """The images the VMs' pods run, in the lab's images directory for the node role, and each VM's CNI conflist."""
    vms = [node for node in wanted if node.kind == KIND_VM]
    if not vms:
        return
    images = row[KUBERNETES_VERSION.lstrip("v")]["images"]
    layout = kubernetes.CacheLayout(paths, kubernetes.RELEASE)
    vmruntime.pause_archive(paths, layout.tree, images["pause"])
    vmruntime.kube_proxy_archive(paths, layout.bin_dir / "kube-proxy", images["kube-proxy"])
    vmruntime.tools_archive(paths)
    for node in vms:
        if vmruntime.install(ssh_command(paths, node.address), node):
            log(f"{node.name}: CNI conflist written")
        else:
            log(f"{node.name}: has joined a cluster (node lock recorded): its configuration is its own")


def _read_event_log(paths: LabPaths, node: NodeSpec) -> bytes:
    done = subprocess.run(
        ssh_command(paths, node.address, "cat", vm.EVENT_LOG),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0 or not done.stdout:
        raise LabError(
            f"{node.name}: cannot read its event log {vm.EVENT_LOG}: {done.stderr.decode(errors='replace').strip()}"
        )
    return done.stdout


def _port_open(address: str) -> bool:
    try:
        with socket.create_connection((address, SSH_PORT), timeout=1.0):
            return True
    except OSError:
        return False


def ssh_command(paths: LabPaths, address: str, *remote: str, connect_timeout: int = 5, batch: bool = True) -> list[str]:
    return [
        "ssh",
        "-i",
        str(paths.ssh_key),
        *ssh_options(paths.known_hosts, batch=batch),
        "-o",
        f"ConnectTimeout={connect_timeout}",
        f"root@{address}",
        *remote,
    ]


def ssh_ok(paths: LabPaths, address: str, timeout: float = 10.0) -> bool:
    try:
        done = subprocess.run(
            ssh_command(paths, address, "true"),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def _main_pid(paths: LabPaths, node: NodeSpec) -> int | None:
    """The process that is the node: its QEMU, or its nspawn."""
    return nodes.live_pid(paths, node.name, "qemu" if node.kind == KIND_VM else "nspawn")


def _wait_for_ssh(paths: LabPaths, wanted: list[NodeSpec], seconds: float) -> None:
    """Wait (bounded: `seconds` for nspawn nodes, vm_boot_timeout() for VMs) until every node runs a command over SSH;
    report the ones that do not."""
    started = time.monotonic()
    bound = {node.name: vm_boot_timeout() if node.kind == KIND_VM else seconds for node in wanted}
    waiting = {node.name: node for node in wanted}

    def answers(node: NodeSpec) -> bool:
        return _port_open(node.address) and ssh_ok(paths, node.address)

    def overdue() -> list[str]:
        return [name for name in waiting if time.monotonic() - started > bound[name]]

    with ThreadPoolExecutor(max_workers=START_WORKERS) as pool:
        while waiting and not overdue():
            if any(_main_pid(paths, node) is None for node in waiting.values()):
                break
            ready = dict(zip(waiting, pool.map(answers, waiting.values())))
            for name, ok in ready.items():
                if ok and waiting.pop(name).kind == KIND_VM:
                    since = vm.seconds_since_start(paths, name)
                    rss = (vm.qemu_rss_kib(paths, name) or 0) / 1024
                    log(f"{name} answers SSH {since:.0f} s after QEMU started (QEMU RSS {rss:.0f} MiB)")
            if waiting:
                # A VM boots for minutes: no need to knock every 0.2 s.
                time.sleep(2.0 if any(node.kind == KIND_VM for node in waiting.values()) else 0.2)
    if waiting:
        for node in waiting.values():
            state = "exited" if _main_pid(paths, node) is None else "no SSH answer"
            log(f"{node.name} ({state}); console log tail:\n{nodes.console_tail(paths, node.name)}")
        limits = " / ".join(sorted({f"{bound[name]:g} s" for name in waiting}))
        raise LabError(f"nodes did not answer SSH within {limits}: {' '.join(waiting)}")


# ---- power: stop, start, reboot ---------------------------------------------------------


def recorded_nodes(paths: LabPaths, names: list[str]) -> list[NodeSpec]:
    """The lab's nodes of these names (every recorded node for none), as `up` made them; unknown names are an error."""
    known = {name: nodes.recorded(paths, name) for name in _recorded_names(paths)}
    known = {name: record for name, record in known.items() if record is not None}
    if not known:
        raise LabError(f"no lab nodes in {paths.lab_dir}; run 'lab up' first")
    unknown = sorted(set(names) - set(known))
    if unknown:
        have = " ".join(sorted(known, key=_node_order))
        raise LabError(f"not nodes of this lab: {' '.join(unknown)} (it has {have})")
    chosen = sorted(names or known, key=_node_order)
    return [
        NodeSpec(
            known[n]["name"],
            known[n]["role"],
            known[n]["address"],
            bool(known[n].get("tampered")),
            known[n].get("kind", KIND_NSPAWN),
        )
        for n in chosen
    ]


def stop(paths: LabPaths, names: list[str]) -> None:
    """Power nodes off (all for none): the container and its swtpm stop; overlay, TPM state and state disk stay."""
    chosen = recorded_nodes(paths, names)
    with locked(paths):
        started = time.monotonic()
        _stop_nodes(paths, [node.name for node in chosen])
    log(f"stopped {' '.join(node.name for node in chosen)} in {time.monotonic() - started:.1f} s")


def start(paths: LabPaths, names: list[str]) -> None:
    """Power nodes on (all for none; running ones are left alone): swtpm started afresh (PCRs reset), boot measured."""
    chosen = recorded_nodes(paths, names)
    base, image = _base_of(paths, chosen)
    with locked(paths):
        started = time.monotonic()
        stopped = [node for node in chosen if not _is_running(paths, node)]
        _power_on(paths, stopped, base, image)
    names = " ".join(node.name for node in stopped) or "nothing (all running)"
    log(f"started {names} in {time.monotonic() - started:.1f} s")


def reboot(paths: LabPaths, names: list[str]) -> None:
    """Power nodes off and on (all for none): like a host's reboot, the TPM restarts, so PCRs (15 too) reset."""
    chosen = recorded_nodes(paths, names)
    base, image = _base_of(paths, chosen)
    with locked(paths):
        started = time.monotonic()
        _stop_nodes(paths, [node.name for node in chosen])
        _power_on(paths, chosen, base, image)
    log(f"rebooted {' '.join(node.name for node in chosen)} in {time.monotonic() - started:.1f} s")


def _base_of(paths: LabPaths, chosen: list[NodeSpec]) -> tuple[base_image.Base, guest.GuestImage | None]:
    """The cached base (and guest image, for VMs) the nodes were made over, verified (nothing is built: a node over
    another base needs `lab up`)."""
    base = base_image.cached_base(paths)
    image = None
    if any(node.kind == KIND_VM for node in chosen):
        image = guest.cached_guest(paths, log=log)
    for node in chosen:
        if base is None or (nodes.recorded(paths, node.name) or {}).get("image_id") != _image_id(node, base, image):
            raise LabError(
                f"{node.name} was made over another base image than the cached one; run 'lab up' to rebuild it"
            )
    return base, image


def _power_on(paths: LabPaths, chosen: list[NodeSpec], base: base_image.Base, image: guest.GuestImage | None) -> None:
    if not chosen:
        return
    network.ensure_bridge()
    setup_conf = tpm.write_ca_config(paths)
    authorized_key = (paths.ssh_dir / "id_ed25519.pub").read_text()
    _start_nodes(paths, chosen, base, image, setup_conf, authorized_key)
    _wait_for_ssh(paths, chosen, boot_timeout(len(chosen)))


# ---- down -------------------------------------------------------------------------------


def down(paths: LabPaths) -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root to tear nodes down")
    started = time.monotonic()
    with locked(paths):
        _teardown(paths)
    log(f"lab down in {time.monotonic() - started:.1f} s")


def _recorded_names(paths: LabPaths) -> list[str]:
    if not paths.nodes_dir.is_dir():
        return []
    return sorted(entry.name for entry in paths.nodes_dir.iterdir() if entry.is_dir())


def _stop_nodes(paths: LabPaths, names: list[str]) -> None:
    vms = [name for name in names if (nodes.recorded(paths, name) or {}).get("kind") == KIND_VM]
    for name in vms:
        vm.stop(paths, name)
    names = [name for name in names if name not in vms]
    nspawn_pids = [pid for name in names if (pid := nodes.live_pid(paths, name, "nspawn"))]
    swtpm_pids = [pid for name in names if (pid := nodes.live_pid(paths, name, "swtpm"))]
    nodes.stop_processes(nspawn_pids, swtpm_pids)


def _teardown(paths: LabPaths) -> None:
    """Stop every node and remove what they leave on the host; keep the base, key and CA."""
    names = _recorded_names(paths)
    _stop_nodes(paths, names)
    nspawn_leftovers, other_leftovers = lab_processes(paths)
    if nspawn_leftovers or other_leftovers:
        nodes.stop_processes(nspawn_leftovers, other_leftovers)
    orphans = orphaned_containers(paths)
    if orphans:
        nodes.stop_processes([], [], orphans)
    mirror.stop(paths)
    _unmount_under(paths.lab_dir)
    network.remove_network()
    shutil.rmtree(paths.nodes_dir, ignore_errors=True)
    paths.inventory.unlink(missing_ok=True)
    remove_cluster_files(paths)
    paths.known_hosts.unlink(missing_ok=True)


# What the playbooks keep beside the lab's inventory for its cluster: the root secrets and admin kubeconfig, and
# backup.yml's snapshots (confidential_backup_dir's default).
CLUSTER_FILES = ("secrets", "backups")


def remove_cluster_files(paths: LabPaths) -> None:
    """The lab's cluster dies with its nodes: its secrets/ and backups/ beside the inventory go too, so that the next
    up starts a new cluster, and restore.yml there finds no snapshot of a dead one."""
    for name in CLUSTER_FILES:
        shutil.rmtree(paths.lab_dir / name, ignore_errors=True)


# Programs the lab starts with the lab dir in their arguments; nothing else is ever killed.
LAB_PROGRAMS = (
    "systemd-nspawn",
    vm.QEMU,
    "swtpm",
    "swtpm_setup",
    "swtpm_localca",
    "ssh",
    "ssh-keygen",
    "openssl",
    "mkfs.ext4",
    "qemu-img",
)


def _ancestors() -> set[int]:
    found, pid = set(), os.getpid()
    while pid > 1:
        found.add(pid)
        try:
            pid = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return found


def lab_processes(paths: LabPaths) -> tuple[list[int], list[int]]:
    """Lab programs whose command line names the lab dir: (nspawn ones, others). Never our callers."""
    marker = str(paths.lab_dir) + "/"
    nspawn_pids, other_pids = [], []
    own = _ancestors()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in own:
            continue
        line = nodes.cmdline(int(entry.name))
        program = os.path.basename(line.split(" ", 1)[0])
        if marker not in line or not (program in LAB_PROGRAMS or program.startswith("tpm2_")):
            continue
        (nspawn_pids if program == "systemd-nspawn" else other_pids).append(int(entry.name))
    return nspawn_pids, other_pids


def orphaned_containers(paths: LabPaths) -> list[int]:
    """Inits of containers whose nspawn died: pid-namespace inits whose mounts name the lab dir."""
    marker = str(paths.lab_dir) + "/"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            nspid = next(line for line in status.splitlines() if line.startswith("NSpid:")).split()
            if len(nspid) < 3 or nspid[-1] != "1":
                continue
            if marker in (entry / "mountinfo").read_text():
                found.append(int(entry.name))
        except (OSError, StopIteration):
            continue
    return found


def _unmount_under(directory: Path) -> None:
    marker = str(directory) + "/"
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mount_point = line.split()[4].replace("\\040", " ")
        if (mount_point + "/").startswith(marker):
            mounts.append(mount_point)
    for mount_point in sorted(mounts, key=len, reverse=True):
        run(["umount", "--lazy", mount_point], what=f"umount {mount_point}")


# ---- status and ssh ---------------------------------------------------------------------


def status(paths: LabPaths) -> int:
    names = _recorded_names(paths)
    if not names:
        print("no lab nodes")
        return 0
    rows = [("NAME", "ROLE", "ADDRESS", "TAMPERED", "NSPAWN/QEMU", "SWTPM", "SSH")]
    with ThreadPoolExecutor(max_workers=START_WORKERS) as pool:
        records = {name: nodes.recorded(paths, name) or {} for name in names}
        reachable = dict(
            zip(
                names,
                pool.map(
                    lambda n: (
                        bool(records[n].get("address"))
                        and paths.known_hosts.is_file()
                        and _port_open(records[n]["address"])
                        and ssh_ok(paths, records[n]["address"], timeout=5)
                    ),
                    names,
                ),
            )
        )
    for name in sorted(names, key=_node_order):
        record = records[name]
        rows.append(
            (
                name,
                record.get("role", "?"),
                record.get("address", "?"),
                "yes" if record.get("tampered") else "no",
                str(nodes.live_pid(paths, name, "qemu" if record.get("kind") == KIND_VM else "nspawn") or "-"),
                str(nodes.live_pid(paths, name, "swtpm") or "-"),
                "ok" if reachable[name] else "no",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    return 0 if all(reachable.values()) else 1


def _node_order(name: str) -> tuple[int, int]:
    role, index = name.rpartition("-")[::2]
    return (0 if role == "cp" else 1, int(index) if index.isdigit() else 0)


def ssh(paths: LabPaths, name: str, command: list[str]) -> int:
    if not is_lab_node_name(name):
        raise LabError(f"no lab node is called {name!r} (names are cp-N, worker-N and vm-N)")
    record = nodes.recorded(paths, name)
    if record is None:
        raise LabError(f"{name} is not part of the lab in {paths.lab_dir}; run 'lab up' first")
    argv = ssh_command(paths, record["address"], *command, batch=bool(command))
    os.execvp(argv[0], argv)
    return 127
