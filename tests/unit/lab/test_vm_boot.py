"""The slow test of the lab's VM node: boots a lab of cp-0 (nspawn) and vm-0 (QEMU), checks the guest, tears it down.

Not part of scripts/test.sh: under TCG (this machine's KVM is PVM) the VM needs minutes to answer SSH. It runs only
with CK_LAB_VM_TEST=1 (and root, and the lab's Kubernetes build; the guest image is built on first use):

    CK_LAB_VM_TEST=1 CK_LAB_INDEX=7 CK_LAB_DIR=/var/tmp/ckv7 python -m pytest -q tests/unit/lab/test_vm_boot.py

What it pins: the VM answers SSH on its lab address with the host key the lab recorded; it has /dev/tpmrm0 (its own
swtpm, EK certificate from the lab CA); the firmware's real event log replays, by the collection's parser, to the PCRs
the TPM reports; the collection's node code (TCTI auto) enrols the VM's PCRs and event log and makes evidence that the
collection's verifier accepts against the lab's EK CA, and refuses naming the LoadOptions event when the policy holds
another kernel command line; cgroup v1; dm-crypt maps its state disk; the cp-0 container reaches it over the bridge;
`lab down` leaves no QEMU, swtpm or tap.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import (
    controller,
    policy as policy_module,
    verifier,
)
from cklab import base, lab as lab_commands, measure, plan, tpm, vm
from cklab.paths import LabPaths

REPO = Path(__file__).resolve().parents[3]
LAB = REPO / "tests" / "lab" / "lab"
EVENT_LOG = "/sys/kernel/security/tpm0/binary_bios_measurements"
FIRMWARE_PCRS = tuple(range(10))

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(os.environ.get("CK_LAB_VM_TEST") != "1", reason="slow (minutes under TCG): CK_LAB_VM_TEST=1"),
]


def guest_run(paths: LabPaths, address: str, script: str, stdin: bytes = b"", timeout: float = 300) -> bytes:
    done = subprocess.run(
        # An emulated guest on a loaded machine can take more than the lab's 5 s to send its SSH banner.
        lab_commands.ssh_command(paths, address, "sh", "-euc", f"'{script}'", connect_timeout=60),
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


# What the collection's attestation code imports, from the nspawn base's node venv (bookworm's Python 3.11, as the VM's):
# the VM's image has no node venv yet (VM.md, next steps).
NODE_PACKAGES = (
    "_cffi_backend.cpython-311-x86_64-linux-gnu.so",
    "cffi",
    "pycparser",
    "cryptography",
    "packaging",
    "tpm2_pytss",
    "yaml",
    "_yaml",
    "typing_extensions.py",
)
NODE_CODE = "/opt/cklab-check"
ATTEST = """
import json, sys
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import issuer, node
measured = node.read_measurements("auto", list(range(10)), "sha256", "ek-certificate", [], None)
evidence = node.produce_evidence("auto", sys.argv[1], "x25519", True, None, None, True)["evidence"]
json.dump({"tcti": issuer.resolve_tcti("auto"), "policy": measured, "evidence": evidence}, sys.stdout)
"""


def _without_caches(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
    return None if "__pycache__" in member.name else member


def push_node_code(paths: LabPaths, address: str) -> None:
    """The collection's module_utils and the packages they import into NODE_CODE in the guest."""
    site = base.cached_base(paths).root / "opt/confidential-kubernetes/venv/lib/python3.11/site-packages"
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        for name in NODE_PACKAGES:
            tar.add(site / name, arcname=name, filter=_without_caches)
        module_utils = "ansible_collections/confidential/kubernetes/plugins/module_utils"
        tar.add(REPO / "plugins" / "module_utils", arcname=module_utils, filter=_without_caches)
    guest_run(paths, address, f"mkdir -p {NODE_CODE} && tar -xzf - -C {NODE_CODE}", stdin=archive.getvalue())


def collection_attests_the_vm(paths: LabPaths, address: str) -> None:
    nonce = secrets.token_hex(32)
    output = guest_run(paths, address, f"PYTHONPATH={NODE_CODE} python3 - {nonce}", stdin=ATTEST.encode())
    answer = json.loads(output)
    assert answer["tcti"] == "device:/dev/tpmrm0"
    golden = policy_module.parse_policy(json.dumps(answer["policy"]), "vm-0")
    ek_cas = verifier.load_ca_certificates(paths.ek_ca.read_bytes())
    controller.verify(answer["evidence"], nonce, golden, ek_cas, None)
    # The policy `lab up` enrolled (the VM's golden values, PCR 9 computed from the image, beside the nspawn nodes').
    enrolled = policy_module.parse_policy(paths.measurement_policy.read_text(), "lab")
    controller.verify(answer["evidence"], nonce, enrolled, ek_cas, None)
    # The policy of another kernel command line: refused, naming the event the EFI stub measured it in.
    other = json.loads(json.dumps(answer["policy"]))
    other["pcrs"]["9"]["allowed"] = ["00" * 32]
    for event in other["event_log"]:
        if event["description"] == "LOADED_IMAGE::LoadOptions":
            event["digest"] = "11" * 32
    with pytest.raises(
        verifier.VerificationError, match="PCR 9: EV_EVENT_TAG LOADED_IMAGE::LoadOptions digest changed"
    ):
        controller.verify(
            answer["evidence"], nonce, policy_module.parse_policy(json.dumps(other), "other"), ek_cas, None
        )


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
        push_node_code(paths, node.address)
        collection_attests_the_vm(paths, node.address)
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
