"""The slow test of the lab's VM node: boots a lab of cp-0 (nspawn) and vm-0 (QEMU), checks the guest, tears it down.

Not part of scripts/test.sh: under TCG (this machine's KVM is PVM) the VM needs minutes to answer SSH. It runs only
with CK_LAB_VM_TEST=1 (and root, and the lab's Kubernetes build; the guest image is built on first use):

    CK_LAB_VM_TEST=1 CK_LAB_INDEX=7 CK_LAB_DIR=/var/tmp/ckv7 python -m pytest -q tests/unit/lab/test_vm_boot.py

What it pins: the VM answers SSH on its lab address with the host key the lab recorded; it has /dev/tpmrm0 (its own
swtpm, EK certificate from the lab CA); the firmware's real event log replays, by the collection's parser, to the PCRs
the TPM reports; cgroup v1; dm-crypt maps its state disk; the cp-0 container reaches it over the bridge; `lab down`
leaves no QEMU, swtpm or tap.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from cklab import lab as lab_commands, measure, plan, tpm, vm
from cklab.paths import LabPaths

LAB = Path(__file__).resolve().parents[2] / "lab" / "lab"
EVENT_LOG = "/sys/kernel/security/tpm0/binary_bios_measurements"
FIRMWARE_PCRS = tuple(range(10))

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(os.environ.get("CK_LAB_VM_TEST") != "1", reason="slow (minutes under TCG): CK_LAB_VM_TEST=1"),
]


def guest_run(paths: LabPaths, address: str, script: str, stdin: bytes = b"", timeout: float = 300) -> bytes:
    done = subprocess.run(
        lab_commands.ssh_command(paths, address, "sh", "-euc", f"'{script}'"),
        input=stdin,
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout


def firmware_log_matches_tpm(paths: LabPaths, address: str) -> dict[int, str]:
    """The guest's event log replayed by the collection's parser; asserts each replayed PCR equals the TPM's."""
    raw = guest_run(paths, address, f"cat {EVENT_LOG}")
    replayed = measure.replay_log(raw)
    selection = ",".join(str(pcr) for pcr in FIRMWARE_PCRS)
    quoted = tpm.parse_pcrread(guest_run(paths, address, f"tpm2_pcrread sha256:{selection}").decode())
    assert set(replayed) <= set(FIRMWARE_PCRS) and {4, 9} <= set(replayed)
    assert {pcr: quoted[pcr] for pcr in replayed} == replayed
    return replayed


STATE_DISK_CHECK = f"""
printf lab-secret | cryptsetup luksFormat --batch-mode --pbkdf pbkdf2 --pbkdf-force-iterations 1000 \
    {vm.STATE_DISK_DEVICE} -
printf lab-secret | cryptsetup open --key-file - {vm.STATE_DISK_DEVICE} cklab-check
mkfs.ext4 -q /dev/mapper/cklab-check
mkdir -p /mnt/cklab-check
mount /dev/mapper/cklab-check /mnt/cklab-check
echo mapped > /mnt/cklab-check/proof
cat /mnt/cklab-check/proof
umount /mnt/cklab-check
cryptsetup close cklab-check
cryptsetup erase --batch-mode {vm.STATE_DISK_DEVICE}
wipefs --all --quiet {vm.STATE_DISK_DEVICE}
"""


def test_a_vm_worker_boots_beside_an_nspawn_control_plane_and_is_a_real_node(tmp_path_factory):
    paths = LabPaths.from_environment()
    reason = lab_commands.cannot_boot(paths)
    if reason:
        pytest.skip(reason)

    def lab(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
        return subprocess.run([str(LAB), *args], capture_output=True, text=True, timeout=timeout, check=False)

    node = plan.plan_nodes(1, 0, vm_workers=1)[-1]
    try:
        started = lab("up", "--control-planes", "1", "--workers", "0", "--vm-workers", "1")
        assert started.returncode == 0, started.stderr
        inventory = yaml.safe_load(paths.inventory.read_text())
        assert inventory["all"]["children"]["workers"]["hosts"]["vm-0"]["confidential_tpm_tcti"] == "auto"
        assert guest_run(paths, node.address, "hostname").decode().strip() == "vm-0"
        assert guest_run(paths, node.address, "test -c /dev/tpmrm0 && stat -fc %T /sys/fs/cgroup").strip() == b"tmpfs"
        firmware_log_matches_tpm(paths, node.address)
        assert guest_run(paths, node.address, STATE_DISK_CHECK).decode().splitlines() == ["mapped"]
        reach = lab(
            "ssh", "cp-0", "python3", "-c", f'"import socket; socket.create_connection((\\"{node.address}\\", 22), 10)"'
        )
        assert reach.returncode == 0, reach.stderr
    finally:
        stopped = lab("down", timeout=300)
    assert stopped.returncode == 0, stopped.stderr
    assert not Path("/sys/class/net", vm.tap_name(node.name)).exists()
    assert lab_commands.lab_processes(paths) == ([], [])
