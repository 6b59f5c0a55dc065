"""Tests of the lab tool (tests/lab): pure functions, and one real up/ssh/down run marked `lab`."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import socket
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from ansible_collections.confidential.kubernetes.plugins.module_utils import _versions
from cklab import (
    LabError,
    __main__ as cli,
    base,
    cni,
    host,
    lab as lab_commands,
    measure,
    mirror,
    nodes,
    plan,
    tpm,
    vmruntime,
)
from cklab.inventory import render_inventory, ssh_options
from cklab.paths import LabPaths

LAB = Path(__file__).resolve().parents[2] / "lab" / "lab"
IMAGE_ID = "7897f4d0de52b9cf38ee49621214c44fb3c93c38d33edd2f8eb43f6c280e867f"


# ---- address plan -----------------------------------------------------------------------


def test_down_removes_the_dead_cluster_s_secrets_and_backups_and_keeps_the_rest(tmp_path):
    # The next lab in this folder must not list a dead cluster's snapshot (restore.yml would offer it).
    paths = LabPaths(lab_dir=tmp_path, cache_dir=tmp_path / "cache", repo_root=tmp_path)
    for name in ("secrets", "backups/etcd-20261201T000000Z", "ca", "ssh"):
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "file").write_text("x")
    lab_commands.remove_cluster_files(paths)
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["ca", "ssh"]
    lab_commands.remove_cluster_files(paths)  # nothing to remove: nothing fails


def test_the_readme_lists_every_command_of_the_lab():
    readme = (LAB.parent / "README.md").read_text()
    commands = cli.parser()._subparsers._group_actions[0].choices
    missing = [name for name in commands if f"tests/lab/lab {name}" not in readme]
    assert not missing, f"tests/lab/README.md does not list: {', '.join(missing)}"


def test_default_lab_is_one_control_plane_and_two_workers_with_fixed_addresses():
    nodes = plan.plan_nodes(1, 2)
    assert [(n.name, n.role, n.address, n.tampered) for n in nodes] == [
        ("cp-0", "control_plane", f"{plan.NETWORK_PREFIX}.10", False),
        ("worker-0", "worker", f"{plan.NETWORK_PREFIX}.20", False),
        ("worker-1", "worker", f"{plan.NETWORK_PREFIX}.21", False),
    ]


def test_thirty_node_lab_has_unique_addresses_inside_the_lab_network():
    nodes = plan.plan_nodes(3, 27)
    addresses = [n.address for n in nodes]
    assert len(set(addresses)) == 30
    assert all(a.startswith(f"{plan.NETWORK_PREFIX}.") and 10 <= int(a.rsplit(".", 1)[1]) <= 254 for a in addresses)
    assert plan.HOST_ADDRESS not in addresses


def test_adding_a_worker_keeps_existing_addresses():
    before = {n.name: n.address for n in plan.plan_nodes(1, 2)}
    after = {n.name: n.address for n in plan.plan_nodes(1, 3)}
    assert {name: after[name] for name in before} == before
    assert after["worker-2"] == f"{plan.NETWORK_PREFIX}.22"


@pytest.mark.parametrize(
    "control_planes, workers, message",
    [
        (0, 2, "--control-planes must be between 1 and 10"),
        (11, 2, "--control-planes must be between 1 and 10"),
        (1, -1, "--workers must be between 0 and 220"),
        (1, 221, "--workers must be between 0 and 220"),
    ],
)
def test_lab_sizes_beyond_the_address_plan_are_rejected(control_planes, workers, message):
    with pytest.raises(LabError, match=message):
        plan.plan_nodes(control_planes, workers)


def test_largest_lab_ends_at_the_last_host_address():
    nodes = plan.plan_nodes(plan.MAX_CONTROL_PLANES, plan.MAX_WORKERS, vm_workers=plan.MAX_VM_WORKERS)
    assert nodes[plan.MAX_CONTROL_PLANES - 1].address == f"{plan.NETWORK_PREFIX}.19"
    assert nodes[plan.MAX_CONTROL_PLANES + plan.MAX_WORKERS - 1].address == f"{plan.NETWORK_PREFIX}.239"
    assert nodes[-1].address == f"{plan.NETWORK_PREFIX}.254"
    assert len({node.address for node in nodes}) == len(nodes)


def test_tamper_marks_only_the_named_node():
    nodes = plan.plan_nodes(1, 2, {"worker-1"})
    assert [n.name for n in nodes if n.tampered] == ["worker-1"]


def test_tamper_of_a_node_outside_the_lab_is_rejected():
    with pytest.raises(LabError, match="worker-5"):
        plan.plan_nodes(1, 2, {"worker-5"})


def test_network_unit_gives_host0_a_static_address_and_the_host_as_gateway():
    unit = plan.network_unit(plan.NodeSpec("worker-3", "worker", f"{plan.NETWORK_PREFIX}.23"))
    assert "Name=host0" in unit
    assert f"Address={plan.NETWORK_PREFIX}.23/24" in unit
    assert f"Gateway={plan.HOST_ADDRESS}" in unit
    assert "DHCP" not in unit


@pytest.mark.parametrize(
    "name, is_node",
    [
        ("cp-0", True),
        ("worker-12", True),
        ("cp-", False),
        ("worker-x", False),
        ("eth0", False),
        ("cp-0a", False),
    ],
)
def test_lab_node_names_are_recognised_for_leftover_search(name, is_node):
    assert plan.is_lab_node_name(name) is is_node


# ---- measured boot ----------------------------------------------------------------------


def test_extend_matches_a_value_read_from_swtpm():
    # Known answer: swtpm's PCR 8 after `tpm2_pcrextend 8:sha256=<sha256("abc")>` from reset.
    digest = hashlib.sha256(b"abc").hexdigest()
    assert measure.extend(bytes(32), digest).hex() == (
        "589f9ffed4c477966bfb8d41f37895b08c69047df8f911d6f3b57fbe08faee8d"
    )


def test_replay_chains_extensions_of_the_same_pcr():
    first, second = "11" * 32, "22" * 32
    events = [measure.BootEvent(8, first, "a"), measure.BootEvent(8, second, "b")]
    chained = hashlib.sha256(hashlib.sha256(bytes(32) + bytes.fromhex(first)).digest() + bytes.fromhex(second))
    assert measure.replay(events) == {8: chained.hexdigest()}


def test_boot_events_extend_pcrs_4_8_9_in_that_order():
    events = measure.boot_events(IMAGE_ID, tampered=False)
    assert [e.pcr for e in events] == [4, 8, 9]
    assert events[1].digest == hashlib.sha256(measure.KERNEL_COMMAND_LINE.encode()).hexdigest()
    assert events[2].digest == hashlib.sha256(IMAGE_ID.encode()).hexdigest()
    assert events[1].description == f"kernel_cmdline: {measure.KERNEL_COMMAND_LINE}"
    assert [e.type for e in events] == ["EV_EFI_BOOT_SERVICES_APPLICATION", "EV_IPL", "EV_IPL"]


def test_tampered_node_differs_from_the_policy_in_pcr_8_only():
    good = measure.replay(measure.boot_events(IMAGE_ID, tampered=False))
    bad = measure.replay(measure.boot_events(IMAGE_ID, tampered=True))
    assert good[4] == bad[4] and good[9] == bad[9]
    assert good[8] != bad[8]
    assert measure.kernel_command_line(True).endswith(" lab.tamper=1")


def test_another_image_changes_pcrs_4_and_9():
    one = measure.replay(measure.boot_events(IMAGE_ID, tampered=False))
    other = measure.replay(measure.boot_events("0" * 64, tampered=False))
    assert one[4] != other[4] and one[9] != other[9] and one[8] == other[8]


@pytest.mark.parametrize("tampered", [False, True], ids=["untampered", "tampered"])
def test_event_log_is_a_tcg_log_that_tpm2_eventlog_reads_and_that_replays_to_the_extended_pcrs(tmp_path, tampered):
    events = measure.boot_events(IMAGE_ID, tampered=tampered)
    raw = measure.event_log(events)
    parsed = measure.eventlog().parse(raw)
    assert [(e.pcr, e.type_name, e.description) for e in parsed.events] == [
        (e.pcr, e.type, e.description) for e in events
    ]
    assert parsed.events[0].description == "\\EFI\\cklab\\vmlinuz-cklab"
    assert parsed.events[1].description.endswith("lab.tamper=1") is tampered
    assert measure.replay_log(raw) == measure.replay(events)
    (tmp_path / "log").write_bytes(raw)
    theirs = yaml.safe_load(
        subprocess.run(["tpm2_eventlog", str(tmp_path / "log")], check=True, capture_output=True, text=True).stdout
    )
    assert [(e["PCRIndex"], e["EventType"], e["Digests"][0]["Digest"]) for e in theirs["events"][1:]] == [
        (e.pcr, e.type, e.digest) for e in events
    ]
    assert {pcr: f"{value:064x}" for pcr, value in theirs["pcrs"]["sha256"].items()} == measure.replay(events)


def test_policy_file_has_the_exact_documented_layout():
    expected = {4: "a" * 64, 8: "b" * 64, 9: "c" * 64}
    assert measure.render_policy(expected) == (
        "version: 1\n"
        "hash_algorithm: sha256\n"
        "ak_trust: ek-certificate\n"
        "pcrs:\n"
        f'  "4": {{allowed: ["{"a" * 64}"], warn_only: false}}\n'
        f'  "8": {{allowed: ["{"b" * 64}"], warn_only: false}}\n'
        f'  "9": {{allowed: ["{"c" * 64}"], warn_only: false}}\n'
    )


def test_golden_policy_enrols_the_untampered_log_and_the_collection_reads_it():
    from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import parse_policy

    policy = parse_policy(measure.golden_policy(IMAGE_ID))
    events = measure.boot_events(IMAGE_ID, tampered=False)
    assert [(e.pcr, e.type, e.description, e.digest.hex()) for e in policy.event_log] == [
        (e.pcr, e.type, e.description, e.digest) for e in events
    ]


def test_golden_policy_parses_and_holds_the_untampered_replay():
    policy = yaml.safe_load(measure.golden_policy(IMAGE_ID))
    replayed = measure.replay(measure.boot_events(IMAGE_ID, tampered=False))
    assert policy["version"] == 1 and policy["hash_algorithm"] == "sha256"
    assert policy["ak_trust"] == "ek-certificate"
    assert {int(pcr): rule["allowed"] for pcr, rule in policy["pcrs"].items()} == {
        pcr: [value] for pcr, value in replayed.items()
    }
    assert all(rule["warn_only"] is False for rule in policy["pcrs"].values())


def test_pcrread_output_is_parsed_to_lowercase_hex():
    text = "  sha256:\n    4 : 0x00AB\n    8 : 0xFF01\n"
    assert tpm.parse_pcrread(text) == {4: "00ab", 8: "ff01"}


# ---- inventory --------------------------------------------------------------------------


def _inventory(tmp_path: Path, nodes) -> dict:
    text = render_inventory(
        nodes,
        tmp_path,
        tmp_path / "ssh/id_ed25519",
        tmp_path / "ssh/known_hosts",
        {
            "1.20.2": mirror.render_row(
                {"kubeadm": "a" * 64, "kubelet": "b" * 64, "kubectl": "c" * 64, "helm": "d" * 64}
            )
        },
        "http://10.77.0.1:8780",
    )
    return yaml.safe_load(text)


def test_inventory_groups_and_hosts(tmp_path):
    inventory = _inventory(tmp_path, plan.plan_nodes(1, 2))
    children = inventory["all"]["children"]
    assert children["control_plane"]["hosts"] == {"cp-0": {"ansible_host": f"{plan.NETWORK_PREFIX}.10"}}
    assert children["workers"]["hosts"] == {
        "worker-0": {"ansible_host": f"{plan.NETWORK_PREFIX}.20"},
        "worker-1": {"ansible_host": f"{plan.NETWORK_PREFIX}.21"},
    }
    assert set(children["cluster"]["children"]) == {"control_plane", "workers"}


def test_inventory_vars_name_the_lab_files(tmp_path):
    variables = _inventory(tmp_path, plan.plan_nodes(1, 0))["all"]["vars"]
    assert variables["ansible_user"] == "root"
    assert variables["ansible_python_interpreter"] == "/opt/confidential-kubernetes/venv/bin/python"
    assert variables["confidential_tpm_tcti"] == "swtpm:path=/run/tpm/swtpm.sock"
    assert variables["confidential_ek_ca_file"] == f"{tmp_path}/ca/ek-ca.pem"
    assert variables["confidential_measurement_policy_file"] == f"{tmp_path}/measurement-policy.yml"
    assert variables["confidential_state_disk"]["device"] == "/srv/state-disk.img"
    assert variables["confidential_tpm_event_log"] == "/run/tpm/binary_bios_measurements"
    assert variables["ansible_ssh_private_key_file"] == f"{tmp_path}/ssh/id_ed25519"
    assert variables["lab_dir"] == str(tmp_path)


def test_inventory_gives_the_node_role_the_lab_row_and_mirror(tmp_path):
    variables = _inventory(tmp_path, plan.plan_nodes(1, 0))["all"]["vars"]
    assert variables["kubernetes_mirror_url"] == "http://10.77.0.1:8780"
    row = variables["kubernetes_versions_extra"]["1.20.2"]
    assert row["artifacts"]["kubeadm"] == {
        "version": "1.20.2",
        "amd64": {"url": "http://lab-mirror.invalid/release/v1.20.2/bin/linux/amd64/kubeadm", "sha256": "a" * 64},
    }
    assert sorted(name for name, entry in row["artifacts"].items() if entry is None) == [
        "cni_plugins",
        "containerd",
        "crictl",
        "runc",
    ]
    assert variables["node_stack_kubelet_path"] == "/opt/k8s-doubles/bin/kubelet"
    assert variables["node_stack_kernel_modules"] is False and variables["node_stack_swap_off"] is False


def test_the_labs_init_deploys_no_addon_the_stand_in_cannot_run(tmp_path):
    """No CoreDNS or kube-proxy objects, so kubeadm 1.20's upgrade apply skips them instead of waiting for CoreDNS
    (a lab with a VM node gets kube-proxy: test_vm.py)."""
    variables = _inventory(tmp_path, plan.plan_nodes(1, 1))["all"]["vars"]
    skipped = variables["init_kubeadm_extra"]["skip_phases"]
    assert skipped == ["addon/coredns", "addon/kube-proxy"]
    assert {phase.removeprefix("addon/") for phase in skipped} <= set(mirror.IMAGES)
    assert "skip_phases" not in variables["join_kubeadm_extra"]
    assert variables["init_kubeadm_extra"]["ignore_preflight_errors"] == ["ImagePull"]


def test_the_lab_row_carries_the_stand_in_cni_chart_the_lab_packaged_and_its_sha256(tmp_path):
    paths = LabPaths(
        lab_dir=tmp_path,
        cache_dir=Path(os.environ.get("CK_LAB_CACHE") or "/var/cache/confidential-kubernetes-lab"),
        repo_root=Path(__file__).resolve().parents[3],
    )
    if not os.access(paths.kubernetes_bin / "helm-3.17.2", os.X_OK):
        pytest.skip("the lab's helm is not built (tests/lab/lab kubernetes)")
    lab_rows = {"1.20.2": mirror.render_row({artifact.name: "a" * 64 for artifact in mirror.ARTIFACTS})}
    rows = cni.with_chart(lab_rows, paths, tmp_path / "tree")
    row = rows["1.20.2"]
    chart = row["artifacts"]["cilium"]
    archive = tmp_path / "tree" / "charts" / "cilium-1.18.0-standin.tgz"
    assert chart == {
        "version": "1.18.0-standin",
        "url": f"{mirror.ROW_BASE_URL}/charts/cilium-1.18.0-standin.tgz",
        "sha256": hashlib.sha256(archive.read_bytes()).hexdigest(),
        # The stand-in deploys only the agent: the lab's tools image, which the VM nodes import.
        "images": {"cilium": vmruntime.TOOLS_IMAGE},
    }
    assert {**row["artifacts"], "cilium": None} == {**lab_rows["1.20.2"]["artifacts"], "cilium": None}
    # Packaged once: a second up keeps the archive and its sha256.
    assert cni.with_chart(lab_rows, paths, tmp_path / "tree") == rows
    assert _versions.row_problems("1.20.2", row, shipped=False) == []


def test_the_relabelled_builds_row_is_a_valid_row_of_its_own_version_and_images(tmp_path):
    """The upgrade's target in the lab is a relabelled 1.20.2 (v1.20.3-lab.1): its own row, URLs and image tags."""
    version = "1.20.3-lab.1"
    row = mirror.render_row({artifact.name: "b" * 64 for artifact in mirror.artifacts(version)}, version)
    assert row["artifacts"]["kubeadm"] == {
        "version": version,
        "amd64": {"url": f"{mirror.ROW_BASE_URL}/release/v{version}/bin/linux/amd64/kubeadm", "sha256": "b" * 64},
    }
    assert row["images"]["kube-apiserver"] == f"k8s.gcr.io/kube-apiserver:v{version}"
    row["artifacts"]["cilium"] = None
    assert _versions.row_problems(version, row, shipped=False) == []


def test_nodes_get_the_relabelled_control_plane_binaries_under_their_versions_directory(tmp_path):
    paths = LabPaths(tmp_path / "lab", tmp_path / "cache", tmp_path)
    node = plan.plan_nodes(1, 0)[0]
    command = nodes.nspawn_command(paths, node, base.Base(root=tmp_path / "root", image_id="i"))
    assert (
        f"--bind-ro={tmp_path}/cache/kubernetes/v1.20.3-lab.1/bin/kube-apiserver:"
        "/opt/kubernetes/versions/v1.20.3-lab.1/bin/kube-apiserver"
    ) in command


def test_inventory_ssh_trusts_only_the_lab_known_hosts(tmp_path):
    args = _inventory(tmp_path, plan.plan_nodes(1, 0))["all"]["vars"]["ansible_ssh_common_args"]
    assert f"UserKnownHostsFile={tmp_path}/ssh/known_hosts" in args
    assert "StrictHostKeyChecking=yes" in args
    assert "GlobalKnownHostsFile=/dev/null" in args
    assert "~/.ssh" not in args


def test_inventory_reuses_one_pipelined_connection_per_node(tmp_path):
    variables = _inventory(tmp_path, plan.plan_nodes(1, 0))["all"]["vars"]
    assert variables["ansible_pipelining"] is True
    assert "ControlMaster=auto" in variables["ansible_ssh_common_args"]
    assert "ControlPersist=60s" in variables["ansible_ssh_common_args"]


def test_inventory_without_workers_has_an_empty_workers_group(tmp_path):
    children = _inventory(tmp_path, plan.plan_nodes(1, 0))["all"]["children"]
    assert children["workers"] == {}


def test_inventory_marks_tampered_nodes(tmp_path):
    hosts = _inventory(tmp_path, plan.plan_nodes(1, 1, {"worker-0"}))["all"]["children"]["workers"]["hosts"]
    assert hosts["worker-0"]["lab_tampered"] is True


def test_interactive_ssh_drops_batch_mode(tmp_path):
    assert "BatchMode=yes" in ssh_options(tmp_path / "kh")
    assert "BatchMode=yes" not in ssh_options(tmp_path / "kh", batch=False)


# ---- host checks and base cache key ----------------------------------------------------


def test_missing_host_packages_are_named_once_each():
    present = {"ip", "ssh", "openssl", "debootstrap", "systemd-nspawn", "systemctl"}
    missing = host.missing_packages(which=lambda command: command if command in present else None)
    assert missing == ["swtpm", "swtpm-tools", "tpm2-tools", "openssh-client"]


def test_no_missing_packages_when_every_command_exists():
    assert host.missing_packages(which=lambda command: command) == []


def test_kernel_without_overlayfs_is_reported(tmp_path):
    filesystems = tmp_path / "filesystems"
    filesystems.write_text("nodev\tsysfs\nnodev\ttmpfs\n\text4\n")
    assert host.missing_kernel_features(filesystems) == ["overlayfs (no 'overlay' in /proc/filesystems)"]
    filesystems.write_text("nodev\toverlay\n")
    assert host.missing_kernel_features(filesystems) == []


def test_inotify_limit_is_raised_only_when_too_low(tmp_path):
    setting = tmp_path / "max_user_instances"
    setting.write_text("128\n")
    host.ensure_inotify_instances(30, setting, log=lambda message: None)
    assert int(setting.read_text()) == 512 + 16 * 30
    setting.write_text("100000\n")
    host.ensure_inotify_instances(30, setting, log=lambda message: None)
    assert setting.read_text() == "100000\n"


def test_base_cache_key_follows_requirements_and_build_script():
    key = base.cache_key("pyyaml>=6\n", "script")
    assert key == base.cache_key("pyyaml>=6\n", "script")
    assert key != base.cache_key("pyyaml>=7\n", "script")
    assert key != base.cache_key("pyyaml>=6\n", "script v2")


def test_kubernetes_binaries_come_from_the_cache(tmp_path):
    assert LabPaths(tmp_path, tmp_path, tmp_path).kubernetes_bin == tmp_path / "kubernetes/v1.20.2/bin"


def test_missing_kubernetes_binaries_are_named(tmp_path):
    paths = LabPaths(tmp_path, tmp_path, tmp_path)
    paths.kubernetes_bin.mkdir(parents=True)
    for name in ("kubeadm", "kubectl", "etcd"):
        (paths.kubernetes_bin / name).write_text("#!/bin/sh\n")
        (paths.kubernetes_bin / name).chmod(0o755)
    with pytest.raises(LabError) as error:
        lab_commands.check_kubernetes_bin(paths)
    assert str(error.value) == (
        f"Kubernetes binaries missing from {paths.kubernetes_bin}: etcdctl helm-3.17.2 kube-apiserver "
        "kube-controller-manager kube-scheduler kubelet v1.20.3-lab.1/kube-apiserver "
        "v1.20.3-lab.1/kube-controller-manager v1.20.3-lab.1/kube-scheduler (build them with tests/lab/lab kubernetes)"
    )


def test_hosts_file_names_localhost_and_the_node_itself():
    assert base.hosts_file("worker-3", "10.77.0.23").splitlines() == [
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        "10.77.0.23\tworker-3",
    ]
    assert "worker" not in base.hosts_file()


def test_cli_reports_bad_input_in_one_line(capsys):
    assert cli.main(["up", "--tamper", "worker-9"]) == 1
    err = capsys.readouterr().err
    assert err == "lab up: error: --tamper names no node of this lab: worker-9\n"


# ---- power commands (stop, start, reboot) -----------------------------------------------


def _recorded_lab(tmp_path) -> LabPaths:
    paths = LabPaths.from_environment()
    paths = dataclasses.replace(paths, lab_dir=tmp_path)
    for node in plan.plan_nodes(2, 2, {"worker-1"}):
        directory = paths.node_dir(node.name)
        directory.mkdir(parents=True)
        (directory / "node.json").write_text(json.dumps({**node.__dict__, "image_id": IMAGE_ID}))
    return paths


def test_power_commands_take_the_named_nodes_as_up_recorded_them(tmp_path):
    paths = _recorded_lab(tmp_path)
    chosen = lab_commands.recorded_nodes(paths, ["worker-1", "cp-1"])
    assert [(n.name, n.role, n.address, n.tampered) for n in chosen] == [
        ("cp-1", "control_plane", f"{plan.NETWORK_PREFIX}.11", False),
        ("worker-1", "worker", f"{plan.NETWORK_PREFIX}.21", True),
    ]
    assert [n.name for n in lab_commands.recorded_nodes(paths, [])] == ["cp-0", "cp-1", "worker-0", "worker-1"]


def test_power_commands_refuse_unknown_nodes_and_an_empty_lab(tmp_path, capsys):
    paths = _recorded_lab(tmp_path / "lab")
    with pytest.raises(LabError, match="not nodes of this lab: worker-7 .it has cp-0 cp-1 worker-0 worker-1."):
        lab_commands.recorded_nodes(paths, ["worker-7", "cp-0"])
    with pytest.raises(LabError, match="no lab nodes in .*run 'lab up' first"):
        lab_commands.recorded_nodes(dataclasses.replace(paths, lab_dir=tmp_path / "empty"), [])


def test_power_command_line_names_nodes_or_none():
    args = cli.parser().parse_args(["reboot", "cp-0", "worker-1"])
    assert (args.command, args.nodes) == ("reboot", ["cp-0", "worker-1"])
    assert cli.parser().parse_args(["stop"]).nodes == [] and cli.parser().parse_args(["start"]).command == "start"


# ---- a real lab -------------------------------------------------------------------------


def _leftovers(lab_dir: Path) -> list[str]:
    found = []
    if Path("/sys/class/net", plan.BRIDGE).exists():
        found.append(f"bridge {plan.BRIDGE}")
    found += [
        f"veth {name}"
        for name in os.listdir("/sys/class/net")
        if name.startswith("vb-" + plan.MACHINE_PREFIX) and plan.is_lab_node_name(name[3 + len(plan.MACHINE_PREFIX) :])
    ]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(lab_dir) in line or f"http.server --bind {plan.HOST_ADDRESS} " in line:
                found.append(f"process {entry.name}: {line[:80]}")
    found += [
        f"mount {line.split()[4]}"
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if str(lab_dir) in line.split()[4]
    ]
    return found


@pytest.mark.lab
def test_lab_up_ssh_tpm_and_down_leave_nothing_behind(tmp_path_factory):
    reason = lab_commands.cannot_boot(LabPaths.from_environment())
    if reason:
        pytest.skip(reason)
    # A short directory: the nodes' TPM socket paths under it must fit a socket address (107 bytes).
    lab_dir = tmp_path_factory.mktemp("up") / "lab"
    env = {**os.environ, "CK_LAB_DIR": str(lab_dir)}

    def lab(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        return subprocess.run([str(LAB), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)

    try:
        started = lab("up", "--workers", "1", "--control-planes", "1")
        assert started.returncode == 0, started.stderr
        assert started.stdout.strip() == str(lab_dir / "inventory.yml")
        inventory = yaml.safe_load((lab_dir / "inventory.yml").read_text())
        assert set(inventory["all"]["children"]["workers"]["hosts"]) == {"worker-0"}
        # The mirror serves the row's artefacts on the bridge address, and only there.
        mirror_url = inventory["all"]["vars"]["kubernetes_mirror_url"]
        assert mirror_url == f"http://{plan.HOST_ADDRESS}:{mirror.PORT}"
        kubeadm = inventory["all"]["vars"]["kubernetes_versions_extra"]["1.20.2"]["artifacts"]["kubeadm"]["amd64"]
        with urllib.request.urlopen(mirror_url + urllib.parse.urlsplit(kubeadm["url"]).path, timeout=30) as response:
            assert hashlib.sha256(response.read()).hexdigest() == kubeadm["sha256"]
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", mirror.PORT), timeout=5).close()

        hostname = lab("ssh", "worker-0", "hostname", timeout=60)
        assert hostname.returncode == 0, hostname.stderr
        assert hostname.stdout.strip() == "worker-0"

        socket_check = lab("ssh", "cp-0", "test", "-S", "/run/tpm/swtpm.sock", timeout=60)
        assert socket_check.returncode == 0, socket_check.stderr

        read_pcr = (
            "from tpm2_pytss import ESAPI, TCTILdr\n"
            "from tpm2_pytss.types import TPML_PCR_SELECTION\n"
            "with ESAPI(TCTILdr('swtpm', 'path=/run/tpm/swtpm.sock')) as esapi:\n"
            "    _, _, values = esapi.pcr_read(TPML_PCR_SELECTION.parse('sha256:8'))\n"
            "    print(bytes(values.digests[0]).hex())\n"
        )
        pcr = lab("ssh", "cp-0", "/opt/confidential-kubernetes/venv/bin/python", "-c", f'"{read_pcr}"', timeout=60)
        assert pcr.returncode == 0, pcr.stderr
        policy = yaml.safe_load((lab_dir / "measurement-policy.yml").read_text())
        assert policy["pcrs"]["8"]["allowed"] == [pcr.stdout.strip()]
    finally:
        stopped = lab("down", timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    assert _leftovers(lab_dir) == []
    assert not (lab_dir / "nodes").exists()
    shutil.rmtree(lab_dir, ignore_errors=True)


def test_the_plan_holds_this_workers_lab_index():
    """cklab's plan reads the lab index once, at import: it must be the one this pytest-xdist worker's `lab up` gets
    (the index is adjusted in tests/unit/conftest.py, before any test module imports cklab)."""
    assert plan.LAB_INDEX == int(os.environ.get("CK_LAB_INDEX", "0")) == plan.lab_index()
