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


def render_policy(expected: dict[int, str], events: list[BootEvent] = ()) -> str:
    """measurement-policy.yml for nodes whose PCRs hold these values, with these golden events enrolled."""
    lines = ["version: 1", "hash_algorithm: sha256", "ak_trust: ek-certificate", "pcrs:"]
    for pcr in sorted(expected):
        lines.append(f'  "{pcr}": {{allowed: ["{expected[pcr]}"], warn_only: false}}')
    if events:
        lines.append("event_log:")
        # Descriptions through the parser, so that they are what the verifier will compare them with.
        for event in eventlog().parse(event_log(list(events))).events:
            lines.append(
                f"  - {{pcr: {event.pcr}, type: {event.type_name}, "
                f"description: {json.dumps(event.description)}, "
                f'digest: "{event.digests["sha256"].hex()}"}}'
            )
    return "\n".join(lines) + "\n"


def golden_policy(image_id: str) -> str:
    events = boot_events(image_id, tampered=False)
    return render_policy(replay(events), events)
