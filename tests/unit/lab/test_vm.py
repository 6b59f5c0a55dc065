"""Tests of the lab's VM nodes (cklab.vm, cklab.guest): the pure parts, fast, no VM booted.

What they pin: the address plan and names of VM workers, the accelerator choice, the QEMU and swtpm argument lists,
and the inventory's host variables for a VM. Booting a VM takes minutes under TCG here: that is the slow test in
test_vm_boot.py, not part of scripts/test.sh.
"""

from __future__ import annotations

from pathlib import Path

import dataclasses
import hashlib
import json
import struct

import pytest
import yaml

from cklab import LabError, __main__ as cli, lab as lab_commands, measure, plan, vm
from cklab.paths import LabPaths
from cklab.inventory import vm_variables, render_inventory

PVM_CPUINFO = "processor\t: 0\nflags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge sse sse2 hypervisor\n"
VMX_CPUINFO = "processor\t: 0\nflags\t\t: fpu vme de pse tsc msr pae vmx sse sse2\n"
SVM_CPUINFO = "processor\t: 0\nflags\t\t: fpu vme de pse tsc msr pae svm sse sse2\n"


# ---- address plan -----------------------------------------------------------------------


def test_vm_workers_come_after_the_nspawn_nodes_in_their_own_range():
    nodes = plan.plan_nodes(1, 2, vm_workers=2)
    assert [(n.name, n.role, n.address, n.kind) for n in nodes[-2:]] == [
        ("vm-0", "worker", f"{plan.NETWORK_PREFIX}.240", "vm"),
        ("vm-1", "worker", f"{plan.NETWORK_PREFIX}.241", "vm"),
    ]
    assert {n.kind for n in nodes[:-2]} == {"nspawn"}
    assert all(n.group == "workers" for n in nodes[-2:])


def test_adding_nspawn_workers_keeps_a_vms_address():
    before = plan.plan_nodes(1, 0, vm_workers=1)[-1]
    after = plan.plan_nodes(1, plan.MAX_WORKERS, vm_workers=1)[-1]
    assert before == after


@pytest.mark.parametrize("vm_workers", [-1, plan.MAX_VM_WORKERS + 1])
def test_vm_worker_counts_beyond_the_range_are_rejected(vm_workers):
    with pytest.raises(LabError, match=f"--vm-workers must be between 0 and {plan.MAX_VM_WORKERS}"):
        plan.plan_nodes(1, 0, vm_workers=vm_workers)


def test_a_vm_can_be_tampered_like_any_node():
    nodes = plan.plan_nodes(1, 0, {"vm-0"}, vm_workers=1)
    assert [(n.name, n.kind) for n in nodes if n.tampered] == [("vm-0", "vm")]


@pytest.mark.parametrize("name, is_node", [("vm-0", True), ("vm-14", True), ("vm-", False), ("vm-a", False)])
def test_vm_names_are_lab_node_names(name, is_node):
    assert plan.is_lab_node_name(name) is is_node


def test_tap_mac_and_network_unit_are_derived_from_the_node():
    node = plan.plan_nodes(1, 0, vm_workers=1)[-1]
    assert vm.tap_name(node.name) == f"ckv{plan.LAB_INDEX}-vm-0"
    assert len(vm.tap_name("vm-14")) <= 15
    assert vm.mac_address(node) == f"52:54:00:77:{plan.LAB_INDEX:02x}:f0"
    unit = vm.network_unit(node)
    assert f"MACAddress={vm.mac_address(node)}" in unit
    assert f"Address={node.address}/24" in unit
    assert f"Gateway={plan.HOST_ADDRESS}" in unit
    assert "DHCP" not in unit


def test_up_takes_the_number_of_vm_workers():
    assert cli.parser().parse_args(["up", "--vm-workers", "1"]).vm_workers == 1
    assert cli.parser().parse_args(["up"]).vm_workers == 0


def test_power_commands_keep_a_vms_kind_and_take_an_older_record_for_nspawn(tmp_path):
    paths = dataclasses.replace(LabPaths.from_environment(), lab_dir=tmp_path)
    for node in plan.plan_nodes(1, 0, vm_workers=1):
        record = dataclasses.asdict(node)
        if node.kind == plan.KIND_NSPAWN:
            del record["kind"]  # written before VM nodes existed
        paths.node_dir(node.name).mkdir(parents=True)
        (paths.node_dir(node.name) / "node.json").write_text(json.dumps(record))
    chosen = lab_commands.recorded_nodes(paths, [])
    assert [(n.name, n.kind) for n in chosen] == [("cp-0", "nspawn"), ("vm-0", "vm")]


# ---- accelerator ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cpuinfo, kvm_device, modules, override, expected",
    [
        pytest.param(PVM_CPUINFO, True, {"kvm", "kvm_pvm"}, None, "tcg", id="PVM host: tcg"),
        pytest.param(VMX_CPUINFO, True, {"kvm", "kvm_pvm"}, None, "tcg", id="kvm_pvm wins over vmx"),
        pytest.param(PVM_CPUINFO, True, {"kvm"}, None, "tcg", id="no vmx or svm: tcg"),
        pytest.param(VMX_CPUINFO, False, {"kvm"}, None, "tcg", id="no /dev/kvm: tcg"),
        pytest.param(VMX_CPUINFO, True, {"kvm", "kvm_intel"}, None, "kvm", id="Intel VT-x: kvm"),
        pytest.param(SVM_CPUINFO, True, {"kvm", "kvm_amd"}, None, "kvm", id="AMD-V: kvm"),
        pytest.param(PVM_CPUINFO, True, {"kvm_pvm"}, "kvm", "kvm", id="override kvm"),
        pytest.param(VMX_CPUINFO, True, {"kvm"}, "tcg", "tcg", id="override tcg"),
    ],
)
def test_accelerator_is_kvm_only_where_a_stock_kernel_boots(cpuinfo, kvm_device, modules, override, expected):
    chosen = vm.choose_accelerator(cpuinfo, kvm_device, frozenset(modules), override)
    assert chosen.name == expected
    assert chosen.reason


def test_an_unknown_accelerator_override_is_refused():
    with pytest.raises(LabError, match="CK_LAB_VM_ACCEL must be kvm or tcg"):
        vm.choose_accelerator(VMX_CPUINFO, True, frozenset(), "hvf")


# ---- QEMU -------------------------------------------------------------------------------


def vm_config(tmp_path: Path, **changes) -> vm.VmConfig:
    values = {
        "name": "vm-0",
        "accelerator": "tcg",
        "kernel": tmp_path / "vmlinuz",
        "initrd": tmp_path / "initrd.img",
        "root_disk": tmp_path / "root.qcow2",
        "state_disk": tmp_path / "state-disk.img",
        "seed_disk": tmp_path / "seed.img",
        "ovmf_vars": tmp_path / "OVMF_VARS.fd",
        "tpm_socket": tmp_path / "swtpm-ctrl.sock",
        "tap": "ckv7-vm-0",
        "mac": "52:54:00:77:07:f0",
        "console_log": tmp_path / "console.log",
        "monitor_socket": tmp_path / "monitor.sock",
        "pid_file": tmp_path / "qemu.pid",
    }
    return vm.VmConfig(**{**values, **changes})


def option_values(argv: list[str], option: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv) if word == option]


def test_qemu_command_boots_ovmf_with_the_nodes_variables_and_the_kernel_directly(tmp_path):
    argv = vm.qemu_command(vm_config(tmp_path))
    assert argv[0] == "qemu-system-x86_64"
    assert option_values(argv, "-accel") == ["tcg,thread=multi,tb-size=256"]
    assert option_values(argv, "-cpu") == ["max"]
    assert option_values(argv, "-machine") == ["q35"]
    assert option_values(argv, "-kernel") == [str(tmp_path / "vmlinuz")]
    assert option_values(argv, "-initrd") == [str(tmp_path / "initrd.img")]
    assert option_values(argv, "-append") == [vm.KERNEL_COMMAND_LINE]
    assert "systemd.unified_cgroup_hierarchy=0" in vm.KERNEL_COMMAND_LINE.split()
    drives = option_values(argv, "-drive")
    assert drives[:2] == [
        f"if=pflash,format=raw,unit=0,readonly=on,file={vm.OVMF_CODE}",
        f"if=pflash,format=raw,unit=1,file={tmp_path}/OVMF_VARS.fd",
    ]
    assert "-nodefaults" in argv and option_values(argv, "-display") == ["none"]
    assert option_values(argv, "-serial") == [f"file:{tmp_path}/console.log"]


def test_qemu_command_puts_root_state_and_seed_disks_on_virtio_in_that_order(tmp_path):
    argv = vm.qemu_command(vm_config(tmp_path))
    drives = [d for d in option_values(argv, "-drive") if not d.startswith("if=pflash")]
    assert drives == [
        f"file={tmp_path}/root.qcow2,format=qcow2,if=none,id=root",
        f"file={tmp_path}/state-disk.img,format=raw,if=none,id=state",
        f"file={tmp_path}/seed.img,format=raw,if=none,id=seed,readonly=on",
    ]
    devices = option_values(argv, "-device")
    disks = [d for d in devices if d.startswith("virtio-blk-pci")]
    assert disks == [
        "virtio-blk-pci,drive=root",
        "virtio-blk-pci,drive=state,serial=cklab-state",
        "virtio-blk-pci,drive=seed",
    ]
    assert vm.STATE_DISK_DEVICE == "/dev/disk/by-id/virtio-cklab-state"


def test_qemu_command_attaches_the_nodes_swtpm_and_tap(tmp_path):
    argv = vm.qemu_command(vm_config(tmp_path))
    assert option_values(argv, "-chardev") == [f"socket,id=chrtpm,path={tmp_path}/swtpm-ctrl.sock"]
    assert option_values(argv, "-tpmdev") == ["emulator,id=tpm0,chardev=chrtpm"]
    assert "tpm-tis,tpmdev=tpm0" in option_values(argv, "-device")
    assert option_values(argv, "-netdev") == ["tap,id=net0,ifname=ckv7-vm-0,script=no,downscript=no"]
    assert "virtio-net-pci,netdev=net0,mac=52:54:00:77:07:f0" in option_values(argv, "-device")


def test_qemu_command_with_kvm_uses_the_host_cpu(tmp_path):
    argv = vm.qemu_command(vm_config(tmp_path, accelerator="kvm"))
    assert option_values(argv, "-accel") == ["kvm"]
    assert option_values(argv, "-cpu") == ["host"]


@pytest.mark.parametrize(
    "changes",
    [{"root_disk": Path("relative.qcow2")}, {"seed_disk": Path("/var/tmp/a,b/seed.img")}, {"accelerator": "hax"}],
    ids=["relative path", "comma in a path", "unknown accelerator"],
)
def test_qemu_command_refuses_what_qemu_would_misread(tmp_path, changes):
    with pytest.raises(LabError):
        vm.qemu_command(vm_config(tmp_path, **changes))


def test_swtpm_is_controlled_by_qemu_over_its_control_socket_only(tmp_path):
    argv = vm.swtpm_command(tmp_path / "state", tmp_path / "ctrl.sock", tmp_path / "pid", tmp_path / "log")
    assert argv[:3] == ["swtpm", "socket", "--tpm2"]
    assert option_values(argv, "--ctrl") == [f"type=unixio,path={tmp_path}/ctrl.sock"]
    assert "--server" not in argv and "--flags" not in argv  # the firmware sends TPM2_Startup


# ---- inventory --------------------------------------------------------------------------


def test_inventory_gives_a_vm_the_device_tpm_its_event_log_and_its_block_state_disk(tmp_path):
    nodes = plan.plan_nodes(1, 1, vm_workers=1)
    text = render_inventory(nodes, tmp_path, tmp_path / "key", tmp_path / "known_hosts", {}, "http://mirror")
    inventory = yaml.safe_load(text)
    hosts = inventory["all"]["children"]["workers"]["hosts"]
    assert hosts["vm-0"] == {"ansible_host": f"{plan.NETWORK_PREFIX}.240", **vm_variables(tmp_path)}
    assert hosts["vm-0"]["kubernetes_images_dir"] == str(tmp_path / "images-site")
    assert hosts["vm-0"]["confidential_tpm_tcti"] == "auto"
    # The VM gets the row's runtime from the node role; the nspawn nodes' stand-in is theirs.
    assert hosts["vm-0"]["node_stack_container_runtime"] is True
    assert inventory["all"]["vars"]["node_stack_container_runtime"] is False
    assert hosts["vm-0"]["confidential_state_disk"]["device"] == vm.STATE_DISK_DEVICE
    assert hosts["vm-0"]["confidential_state_disk_allow_unmapped"] is False
    assert hosts["worker-0"] == {"ansible_host": f"{plan.NETWORK_PREFIX}.20"}
    # A lab with a VM gets kube-proxy (a real kubelet runs it there) and the VM imports its image; still no CoreDNS.
    assert inventory["all"]["vars"]["init_kubeadm_extra"]["skip_phases"] == ["addon/coredns"]
    assert "kube-proxy" in hosts["vm-0"]["node_kubernetes_images"]


# ---- measured boot: the VM's golden values ----------------------------------------------


def _tagged(tag: int, text: str) -> bytes:
    return struct.pack("<II", tag, len(text) + 1) + text.encode() + b"\x00"


def _vm_log(command_line: str, initrd_sha256: str) -> bytes:
    """A VM's log as OVMF and the EFI stub write it, reduced to PCRs 4 and 9 (the kernel image, the stub's tags)."""
    module = measure.eventlog()
    tag = module.EVENT_TYPE_IDS["EV_EVENT_TAG"]
    app = module.EVENT_TYPE_IDS["EV_EFI_BOOT_SERVICES_APPLICATION"]
    options = hashlib.sha256(measure.load_options(command_line)).digest()
    return module.build(
        ("sha256",),
        [
            (4, app, {"sha256": b"\x44" * 32}, b""),
            (9, tag, {"sha256": options}, _tagged(0x8F3B22ED, measure.LOAD_OPTIONS_EVENT)),
            (9, tag, {"sha256": bytes.fromhex(initrd_sha256)}, _tagged(0x8F3B22EC, measure.INITRD_EVENT)),
        ],
    )


def test_vm_golden_pcr_9_is_computed_from_the_command_line_and_the_initrd_not_read_from_the_node():
    initrd = "ab" * 32
    good = measure.vm_golden(_vm_log(vm.KERNEL_COMMAND_LINE, initrd), vm.KERNEL_COMMAND_LINE, initrd)
    assert good.pcrs == measure.replay_log(_vm_log(vm.KERNEL_COMMAND_LINE, initrd))
    # A tampered VM's log gives the same golden values: only its PCR 4 events are taken from it.
    tampered = _vm_log(vm.KERNEL_COMMAND_LINE + vm.TAMPER_ARGUMENT, initrd)
    assert measure.vm_golden(tampered, vm.KERNEL_COMMAND_LINE, initrd) == good
    assert measure.replay_log(tampered)[9] != good.pcrs[9]
    assert [(e.pcr, e.description) for e in good.events if e.pcr == 9] == [
        (9, "LOADED_IMAGE::LoadOptions"),
        (9, "Linux initrd"),
    ]


def test_vm_golden_refuses_a_log_without_the_stubs_events():
    module = measure.eventlog()
    raw = module.build(("sha256",), [(4, module.EVENT_TYPE_IDS["EV_SEPARATOR"], {"sha256": b"\x00" * 32}, b"\x00" * 4)])
    with pytest.raises(ValueError, match="lacks the EFI stub's PCR 9 events"):
        measure.vm_golden(raw, vm.KERNEL_COMMAND_LINE, "ab" * 32)


def test_the_policy_allows_the_vms_values_beside_the_nspawn_nodes_and_enrols_its_events():
    initrd = "ab" * 32
    golden = measure.vm_golden(_vm_log(vm.KERNEL_COMMAND_LINE, initrd), vm.KERNEL_COMMAND_LINE, initrd)
    image_id = "0f" * 32
    nspawn_only = yaml.safe_load(measure.golden_policy(image_id))
    both = yaml.safe_load(measure.golden_policy(image_id, golden))
    for pcr in ("4", "8", "9"):
        assert both["pcrs"][pcr]["allowed"] == nspawn_only["pcrs"][pcr]["allowed"] + [
            golden.pcrs.get(int(pcr), "00" * 32)
        ]
    assert both["event_log"][: len(nspawn_only["event_log"])] == nspawn_only["event_log"]
    assert {"pcr": 9, "type": "EV_EVENT_TAG", "description": "Linux initrd", "digest": initrd} in both["event_log"]
