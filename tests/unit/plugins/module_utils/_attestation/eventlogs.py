"""Fixture event logs built by the tests, in the TCG crypto-agile format (the collection's eventlog.build).

``firmware_log`` is shaped like the OVMF + Linux EFI stub log of a real VM (REAL-NODE.md): StartupLocality, the
S-CRTM version in UTF-16, firmware blobs, Secure Boot variables, separators on PCR 0-7, the kernel as an EFI
application in PCR 4 and the EFI stub's two tagged events (LoadOptions, initrd) in PCR 9; in SHA-1 and SHA-256.
"""

from __future__ import annotations

import hashlib
import struct

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import eventlog as el

BANKS = ("sha1", "sha256")
COMMAND_LINE = "console=ttyS0 root=/dev/vda1 ro systemd.unified_cgroup_hierarchy=0"
KERNEL_IMAGE = b"vmlinuz: a kernel image"
INITRD = b"initrd: an initramfs"
EFI_GLOBAL_VARIABLE = bytes.fromhex("61dfe48bca93d211aa0d00e098032b8c")


def _digests(banks, payload: bytes) -> dict[str, bytes]:
    return {bank: hashlib.new(bank, payload).digest() for bank in banks}


def tagged(tag: int, text: str) -> bytes:
    """TCG_PCClientTaggedEvent: taggedEventID, taggedEventDataSize, data (the EFI stub's NUL-terminated name)."""
    data = text.encode() + b"\x00"
    return struct.pack("<II", tag, len(data)) + data


def variable(name: str, value: bytes) -> bytes:
    """UEFI_VARIABLE_DATA: GUID, name length in characters, data length, UTF-16 name, data."""
    return EFI_GLOBAL_VARIABLE + struct.pack("<QQ", len(name), len(value)) + name.encode("utf-16-le") + value


def image_load(path: str) -> bytes:
    """UEFI_IMAGE_LOAD_EVENT with a device path of one media file-path node and the end node."""
    name = path.encode("utf-16-le") + b"\x00\x00"
    device_path = bytes((4, 4)) + struct.pack("<H", 4 + len(name)) + name + bytes((0x7F, 0xFF, 4, 0))
    return struct.pack("<QQQQ", 0x7E000000, 0x800000, 0, len(device_path)) + device_path


def firmware_events(
    command_line: str = COMMAND_LINE, banks=BANKS, kernel: bytes = KERNEL_IMAGE, locality: int | None = 3
) -> list:
    """(pcr, type, digests, data) records of a UEFI boot of Linux through the EFI stub; the firmware starts the TPM
    from ``locality`` (a StartupLocality event), or from locality 0 as swtpm does when None."""
    zero = {bank: bytes(hashlib.new(bank).digest_size) for bank in banks}
    separator = b"\x00\x00\x00\x00"
    events = (
        [] if locality is None else [(0, el.EV_NO_ACTION, zero, el.STARTUP_LOCALITY_SIGNATURE + bytes((locality,)))]
    )
    events += [
        (0, 0x8, _digests(banks, "EDK II".encode("utf-16-le") + b"\0\0"), "EDK II".encode("utf-16-le") + b"\0\0"),
        (0, 0x80000008, _digests(banks, b"PEI firmware volume"), struct.pack("<QQ", 0x820000, 0xE0000)),
        (
            7,
            el.EV_EFI_VARIABLE_DRIVER_CONFIG,
            _digests(banks, variable("SecureBoot", b"\x00")),
            variable("SecureBoot", b"\x00"),
        ),
        (1, el.EV_EFI_VARIABLE_BOOT, _digests(banks, b"\x00\x00"), variable("BootOrder", b"\x00\x00")),
        (
            4,
            el.EV_EFI_ACTION,
            _digests(banks, b"Calling EFI Application from Boot Option"),
            b"Calling EFI Application from Boot Option",
        ),
    ]
    events += [(pcr, el.EV_SEPARATOR, _digests(banks, separator), separator) for pcr in range(8)]
    events += [
        (4, el.EV_EFI_BOOT_SERVICES_APPLICATION, _digests(banks, kernel), image_load("\\EFI\\debian\\vmlinuz")),
        (
            9,
            el.EV_EVENT_TAG,
            _digests(banks, command_line.encode("utf-16-le") + b"\0\0"),
            tagged(0x8F3B22ED, "LOADED_IMAGE::LoadOptions"),
        ),
        (9, el.EV_EVENT_TAG, _digests(banks, INITRD), tagged(0x8F3B22EC, "Linux initrd")),
        (5, el.EV_EFI_ACTION, _digests(banks, b"Exit Boot Services Invocation"), b"Exit Boot Services Invocation"),
    ]
    return events


def firmware_log(
    command_line: str = COMMAND_LINE, banks=BANKS, kernel: bytes = KERNEL_IMAGE, locality: int | None = 3
) -> bytes:
    return el.build(banks, firmware_events(command_line, banks, kernel, locality))


def ipl_log(strings: dict[int, list[str]], banks=("sha256",)) -> bytes:
    """A log of EV_IPL string events (GRUB style), each measured as its text."""
    events = [
        (pcr, el.EV_IPL, _digests(banks, text.encode()), text.encode() + b"\x00")
        for pcr, texts in sorted(strings.items())
        for text in texts
    ]
    return el.build(banks, events)


def extend_into(tpm, log: bytes) -> None:
    """Extend a log's measured events into a TPM (an issuer.Tpm) as firmware would: the digest of every bank."""
    from tpm2_pytss import TPML_DIGEST_VALUES, TPMT_HA, TPMU_HA, ESYS_TR  # noqa: PLC0415  (only where a TPM runs)

    parsed = el.parse(log)
    for event in parsed.events:
        if not event.measured:
            continue
        values = []
        for bank, digest in event.digests.items():
            alg = el.ALGORITHM_IDS[bank]
            values.append(TPMT_HA(hashAlg=alg, digest=TPMU_HA(**{bank: digest})))
        tpm.esapi.pcr_extend(getattr(ESYS_TR, f"PCR{event.pcr}"), TPML_DIGEST_VALUES(values))
