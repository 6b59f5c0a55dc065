"""The lab's measured boot: the events each node start extends into its TPM, its event log, and the golden policy.

A node "boots" a kernel (PCR 4, an EFI application), a kernel command line (PCR 8, EV_IPL as GRUB logs it) and
an image (PCR 9, EV_IPL). A tampered node boots the same kernel and image with another command line, so only
its PCR 8 differs from the policy. The log is written in the TCG crypto-agile binary format by the collection's
own event log module (plugins/module_utils/_attestation/eventlog.py), which the verifier parses: one format and
one parser for the lab's made-up events and real firmware logs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import struct
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

KERNEL_COMMAND_LINE = "BOOT_IMAGE=/boot/vmlinuz-cklab root=overlay:cklab ro console=ttyS0 quiet"
TAMPER_ARGUMENT = " lab.tamper=1"
KERNEL_PATH = "\\EFI\\cklab\\vmlinuz-cklab"
MEASURED_PCRS = (4, 8, 9)
ZERO_PCR = bytes(32)
BANKS = ("sha256",)  # the lab's swtpm has the sha256 bank only (active_pcr_banks in swtpm_setup.conf)
EVENT_LOG_FILE = "binary_bios_measurements"
_EVENTLOG_SOURCE = Path(__file__).resolve().parents[3] / "plugins" / "module_utils" / "_attestation" / "eventlog.py"


_EVENTLOG_LOCK = threading.Lock()


def eventlog():
    """The collection's event log module, loaded from its file (the lab does not import the collection). Nodes start in
    threads: one loads it, the others wait, and none sees a half-loaded module."""
    with _EVENTLOG_LOCK:
        module = sys.modules.get("cklab_eventlog")
        if module is None:
            spec = importlib.util.spec_from_file_location("cklab_eventlog", _EVENTLOG_SOURCE)
            module = importlib.util.module_from_spec(spec)
            # Registered before it runs (its dataclasses look themselves up there); the lock keeps others out meanwhile.
            sys.modules["cklab_eventlog"] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules["cklab_eventlog"]
                raise
        return module


@dataclass(frozen=True)
class BootEvent:
    pcr: int
    digest: str
    description: str
    type: str = "EV_IPL"
    data: bytes = b""


def _sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def kernel_command_line(tampered: bool) -> str:
    return KERNEL_COMMAND_LINE + (TAMPER_ARGUMENT if tampered else "")


def _image_load_event(path: str) -> bytes:
    """UEFI_IMAGE_LOAD_EVENT (location, length, link-time address, device path length; all unknown here: 0) with a
    device path of one media file-path node naming the kernel, then the end node."""
    name = path.encode("utf-16-le") + b"\x00\x00"
    device_path = bytes((4, 4)) + struct.pack("<H", 4 + len(name)) + name + bytes((0x7F, 0xFF, 4, 0))
    return struct.pack("<QQQQ", 0, 0, 0, len(device_path)) + device_path


def boot_events(image_id: str, tampered: bool) -> list[BootEvent]:
    """The events of one node start, in extension order."""
    kernel = f"confidential-kubernetes-lab kernel {image_id}"
    command_line = kernel_command_line(tampered)
    return [
        BootEvent(
            4, _sha256_hex(kernel), KERNEL_PATH, "EV_EFI_BOOT_SERVICES_APPLICATION", _image_load_event(KERNEL_PATH)
        ),
        BootEvent(
            8,
            _sha256_hex(command_line),
            f"kernel_cmdline: {command_line}",
            "EV_IPL",
            f"kernel_cmdline: {command_line}".encode() + b"\x00",
        ),
        BootEvent(9, _sha256_hex(image_id), f"image: {image_id}", "EV_IPL", f"image: {image_id}".encode() + b"\x00"),
    ]


def extend(pcr_value: bytes, digest_hex: str) -> bytes:
    """TPM2_PCR_Extend for SHA-256: new = SHA256(old || digest)."""
    return hashlib.sha256(pcr_value + bytes.fromhex(digest_hex)).digest()


def replay(events: list[BootEvent]) -> dict[int, str]:
    """The PCR values (hex) a freshly started TPM holds after these events, for every PCR touched."""
    values: dict[int, bytes] = {}
    for event in events:
        values[event.pcr] = extend(values.get(event.pcr, ZERO_PCR), event.digest)
    return {pcr: value.hex() for pcr, value in sorted(values.items())}


def event_log(events: list[BootEvent]) -> bytes:
    """The node's TCG event log (crypto-agile binary, as /sys/kernel/security/tpm0/binary_bios_measurements)."""
    module = eventlog()
    return module.build(
        BANKS, [(e.pcr, module.EVENT_TYPE_IDS[e.type], {"sha256": bytes.fromhex(e.digest)}, e.data) for e in events]
    )


def replay_log(raw: bytes) -> dict[int, str]:
    """The SHA-256 PCR values (hex) a log replays to, by the collection's parser (what the verifier computes)."""
    return {pcr: value.hex() for pcr, value in sorted(eventlog().parse(raw).replay()["sha256"].items())}


def render_policy(
    expected: dict[int, str | list[str]], events: list[BootEvent] = (), parsed: tuple[GoldenEvent, ...] = ()
) -> str:
    """measurement-policy.yml for nodes whose PCRs hold these values (one, or any of a list), with these golden events
    enrolled: the lab's made-up boot events and events already parsed from a real log."""
    lines = ["version: 1", "hash_algorithm: sha256", "ak_trust: ek-certificate", "pcrs:"]
    for pcr in sorted(expected):
        values = [expected[pcr]] if isinstance(expected[pcr], str) else expected[pcr]
        allowed = ", ".join(f'"{value}"' for value in values)
        lines.append(f'  "{pcr}": {{allowed: [{allowed}], warn_only: false}}')
    golden = [
        # Descriptions through the parser, so that they are what the verifier will compare them with.
        GoldenEvent(event.pcr, event.type_name, event.description, event.digests["sha256"].hex())
        for event in (eventlog().parse(event_log(list(events))).events if events else ())
    ] + list(parsed)
    if golden:
        lines.append("event_log:")
        for event in golden:
            lines.append(
                f"  - {{pcr: {event.pcr}, type: {event.type}, "
                f"description: {json.dumps(event.description)}, "
                f'digest: "{event.digest}"}}'
            )
    return "\n".join(lines) + "\n"


def golden_policy(image_id: str, vm: VmGolden | None = None) -> str:
    """The nspawn nodes' policy; with `vm`, the VM nodes' PCR values allowed beside theirs and their events enrolled."""
    events = boot_events(image_id, tampered=False)
    expected = {pcr: [value] for pcr, value in replay(events).items()}
    if vm is None:
        return render_policy(expected, events)
    for pcr in expected:
        expected[pcr].append(vm.pcrs.get(pcr, ZERO_PCR.hex()))
    return render_policy(expected, events, vm.events)


# ---- VM nodes: real firmware, a real kernel's EFI stub ----------------------------------------------------------

# The Linux EFI stub measures into PCR 9 two EV_EVENT_TAG events, each described by its tagged data: the command line as
# the firmware passed it (OVMF appends " initrd=initrd" for QEMU's direct kernel boot), UTF-16LE with its NUL; then
# the initrd file as loaded.
LOAD_OPTIONS_EVENT = "LOADED_IMAGE::LoadOptions"
INITRD_EVENT = "Linux initrd"
OVMF_INITRD_OPTION = " initrd=initrd"


@dataclass(frozen=True)
class GoldenEvent:
    pcr: int
    type: str
    description: str
    digest: str


@dataclass(frozen=True)
class VmGolden:
    """What an untampered VM on this guest image measures: PCR values (hex) and the events behind them."""

    pcrs: dict[int, str]
    events: tuple[GoldenEvent, ...]


def load_options(command_line: str) -> bytes:
    """The UTF-16LE LoadOptions the EFI stub measures for this -append."""
    return (command_line + OVMF_INITRD_OPTION).encode("utf-16-le") + b"\x00\x00"


def vm_golden(raw_log: bytes, command_line: str, initrd_sha256: str) -> VmGolden:
    """A VM's golden measurements: PCRs 0-8 as its firmware's log replays them (the firmware and the kernel image are
    the same for every VM of a guest image), PCR 9 computed from the untampered command line and the manifest's initrd
    digest, never taken from the node. The log may be a tampered VM's: only its PCR 9 events are replaced."""
    log = eventlog().parse(raw_log)
    golden: list[GoldenEvent] = []
    computed = {
        LOAD_OPTIONS_EVENT: hashlib.sha256(load_options(command_line)).hexdigest(),
        INITRD_EVENT: initrd_sha256,
    }
    for event in log.events:
        if not event.measured or "sha256" not in event.digests or event.pcr not in MEASURED_PCRS:
            continue
        if event.pcr != 9:
            golden.append(GoldenEvent(event.pcr, event.type_name, event.description, event.digests["sha256"].hex()))
            continue
        if event.type_name != "EV_EVENT_TAG" or event.description not in computed:
            raise ValueError(f"the VM's event log has an unexpected PCR 9 event: {event.type_name} {event.description}")
        golden.append(GoldenEvent(9, event.type_name, event.description, computed.pop(event.description)))
    if computed:
        raise ValueError(f"the VM's event log lacks the EFI stub's PCR 9 events {sorted(computed)}")
    values: dict[int, bytes] = {}
    for event in golden:
        values[event.pcr] = extend(values.get(event.pcr, ZERO_PCR), event.digest)
    return VmGolden({pcr: value.hex() for pcr, value in sorted(values.items())}, tuple(golden))
