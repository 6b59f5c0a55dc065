"""The lab's measured boot: the events each node start extends into its TPM, and the golden policy.

A node "boots" a kernel (PCR 4), a kernel command line (PCR 8) and an image (PCR 9).
A tampered node boots the same kernel and image with another command line, so only
its PCR 8 differs from the policy.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

KERNEL_COMMAND_LINE = "BOOT_IMAGE=/boot/vmlinuz-cklab root=overlay:cklab ro console=ttyS0 quiet"
TAMPER_ARGUMENT = " lab.tamper=1"
MEASURED_PCRS = (4, 8, 9)
ZERO_PCR = bytes(32)


@dataclass(frozen=True)
class BootEvent:
    pcr: int
    digest: str
    description: str

    def as_json(self) -> dict[str, object]:
        return {"pcr": self.pcr, "digest": self.digest, "description": self.description}


def _sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def kernel_command_line(tampered: bool) -> str:
    return KERNEL_COMMAND_LINE + (TAMPER_ARGUMENT if tampered else "")


def boot_events(image_id: str, tampered: bool) -> list[BootEvent]:
    """The events of one node start, in extension order."""
    kernel = f"confidential-kubernetes-lab kernel {image_id}"
    command_line = kernel_command_line(tampered)
    return [
        BootEvent(4, _sha256_hex(kernel), f"kernel: {kernel}"),
        BootEvent(8, _sha256_hex(command_line), f"kernel command line: {command_line}"),
        BootEvent(9, _sha256_hex(image_id), f"image: {image_id}"),
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


def event_log_json(events: list[BootEvent]) -> str:
    return json.dumps([event.as_json() for event in events], indent=2) + "\n"


def render_policy(expected: dict[int, str]) -> str:
    """measurement-policy.yml for nodes whose PCRs hold these values."""
    lines = ["version: 1", "hash_algorithm: sha256", "ak_trust: ek-certificate", "pcrs:"]
    for pcr in sorted(expected):
        lines.append(f'  "{pcr}": {{allowed: ["{expected[pcr]}"], warn_only: false}}')
    return "\n".join(lines) + "\n"


def golden_policy(image_id: str) -> str:
    return render_policy(replay(boot_events(image_id, tampered=False)))
