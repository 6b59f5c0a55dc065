"""Fixture event logs built by the tests, in the TCG crypto-agile format (the collection's eventlog.build), and in
the older SHA-1 format (``sha1_log``, built here: the collection only reads it).

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
EFI_IMAGE_SECURITY_DATABASE = bytes.fromhex("cbb219d73a3d9645a3bcdad00e67656f")  # db and dbx


def _digests(banks, payload: bytes) -> dict[str, bytes]:
    return {bank: hashlib.new(bank, payload).digest() for bank in banks}


def tagged(tag: int, text: str) -> bytes:
    """TCG_PCClientTaggedEvent: taggedEventID, taggedEventDataSize, data (the EFI stub's NUL-terminated name)."""
    data = text.encode() + b"\x00"
    return struct.pack("<II", tag, len(data)) + data


def variable(name: str, value: bytes, guid: bytes = EFI_GLOBAL_VARIABLE) -> bytes:
    """UEFI_VARIABLE_DATA: GUID, name length in characters, data length, UTF-16 name, data."""
    return guid + struct.pack("<QQ", len(name), len(value)) + name.encode("utf-16-le") + value


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


def sha1_log(command_line: str = COMMAND_LINE, spec_id: bool = True) -> bytes:
    """The same UEFI boot in the SHA-1 format (TCG PC Client spec, TCG_PCClientPCREvent): every record a TCG_PCR_EVENT -
    pcrIndex, eventType, SHA-1 digest, eventSize, data - led, as EDK II writes it, by a "Spec ID Event00"
    EV_NO_ACTION record (TCG_EfiSpecIdEventStruct: platform class, spec 1.2, uintnSize, no vendor information)."""
    records = []
    if spec_id:
        body = el.SHA1_SPEC_ID_SIGNATURE + struct.pack("<IBBBBB", 0, 2, 1, 2, 2, 0)
        records.append(struct.pack("<II20sI", 0, el.EV_NO_ACTION, bytes(20), len(body)) + body)
    for pcr, event_type, digests, data in firmware_events(command_line, banks=("sha1",), locality=None):
        records.append(struct.pack("<II20sI", pcr, event_type, digests["sha1"], len(data)) + data)
    return b"".join(records)


def _filler(seed: str, size: int) -> bytes:
    """Deterministic bytes standing in for a certificate, a hash list or a GPT: the same seed, the same bytes."""
    out = b""
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(f"{seed}:{counter}".encode()).digest()
        counter += 1
    return out[:size]


EFI_CERT_SHA256 = bytes.fromhex("2616c4c14c509240aca941f936934328")
EFI_CERT_X509 = bytes.fromhex("a159c0a5e494a74a87b5ab155c2bf072")


def _signature_list(owner: str, entries: int, entry_size: int, guid: bytes = EFI_CERT_X509) -> bytes:
    """An EFI_SIGNATURE_LIST: type GUID (EFI_CERT_X509 or EFI_CERT_SHA256), sizes, then entries of owner GUID + data."""
    body = b"".join(
        bytes.fromhex("bd9afa775903324dbd6028f4e78f784b") + _filler(f"{owner}:{i}", entry_size - 16)
        for i in range(entries)
    )
    return guid + struct.pack("<III", 28 + len(body), 0, entry_size) + body


def _utf16(text: str) -> bytes:
    return text.encode("utf-16-le") + b"\x00\x00"


def _load_option(description: str, path: str) -> bytes:
    """EFI_LOAD_OPTION: attributes (active), FilePathListLength, UTF-16 description, a media file-path node, end."""
    name = path.encode("utf-16-le") + b"\x00\x00"
    device_path = bytes((4, 4)) + struct.pack("<H", 4 + len(name)) + name + bytes((0x7F, 0xFF, 4, 0))
    text = description.encode("utf-16-le") + b"\x00\x00"
    return struct.pack("<IH", 1, len(device_path)) + text + device_path


def gce_like_events(command_line: str = COMMAND_LINE, banks=BANKS) -> list:
    """(pcr, type, digests, data) records with the event mix and size of a real GCE Shielded VM's firmware log
    (OVMF, shim, GRUB, Linux; SHA-1 and SHA-256): 105 events, about 38 KB. Secure Boot's PK, KEK, db and a dbx of
    about 14 KB in PCR 7, boot variables in PCR 1, the GPT and shim/GRUB/kernel images in PCR 4-5, GRUB's
    commands in PCR 8 and files in PCR 9, shim's MOK lists in PCR 14 (GRUB boots the kernel: no EFI stub tags)."""
    events = [
        (0, 0x8, _digests(banks, _utf16("GCE Virtual Firmware v2")), _utf16("GCE Virtual Firmware v2")),
        (0, 0x80000008, _digests(banks, b"PEI"), struct.pack("<QQ", 0xFFC00000, 0x84000)),
        (0, 0x80000008, _digests(banks, b"DXE"), struct.pack("<QQ", 0xFFC84000, 0x37C000)),
    ]
    secure = [("SecureBoot", b"\x01"), ("PK", _signature_list("pk", 1, 1000))]
    secure += [("KEK", _signature_list("kek", 2, 1500)), ("db", _signature_list("db", 3, 1600))]
    secure += [("dbx", _signature_list("dbx", 290, 48, EFI_CERT_SHA256))]
    for name, value in secure:
        data = variable(name, value, EFI_IMAGE_SECURITY_DATABASE if name in ("db", "dbx") else EFI_GLOBAL_VARIABLE)
        events.append((7, el.EV_EFI_VARIABLE_DRIVER_CONFIG, _digests(banks, data), data))
    events.append((7, el.EV_SEPARATOR, _digests(banks, b"\x00" * 4), b"\x00" * 4))
    boot = [("BootOrder", b"\x00\x00\x01\x00\x02\x00")] + [
        (f"Boot000{i}", _load_option(f"UEFI Google PersistentDisk {i}", f"\\EFI\\BOOT\\BOOTX64-{i}.EFI"))
        for i in range(6)
    ]
    for name, value in boot:
        events.append((1, el.EV_EFI_VARIABLE_BOOT, _digests(banks, value), variable(name, value)))
    events.append(
        (
            4,
            el.EV_EFI_ACTION,
            _digests(banks, b"Calling EFI Application from Boot Option"),
            b"Calling EFI Application from Boot Option",
        )
    )
    events += [(pcr, el.EV_SEPARATOR, _digests(banks, b"\x00" * 4), b"\x00" * 4) for pcr in (0, 1, 2, 3, 4, 5, 6)]
    gpt = b"EFI PART" + _filler("gpt", 84) + struct.pack("<Q", 3)
    for number, name in enumerate(("BIOS boot", "EFI System", "root")):
        entry = _filler(f"partition{number}", 56)  # type and unique GUIDs, first and last LBA, attributes
        gpt += entry + name.encode("utf-16-le").ljust(72, b"\x00")
    events.append((5, 0x80000006, _digests(banks, gpt), gpt))
    for path in ("\\EFI\\BOOT\\BOOTX64.EFI", "\\EFI\\debian\\grubx64.efi", "\\boot\\vmlinuz-6.1.0-28-cloud-amd64"):
        events.append((4, el.EV_EFI_BOOT_SERVICES_APPLICATION, _digests(banks, path.encode()), image_load(path)))
    authority = _signature_list("db", 1, 1600)[28:]  # the db entry (owner + certificate) that signed shim
    for name, value, guid in (
        ("db", authority, EFI_IMAGE_SECURITY_DATABASE),
        ("SbatLevel", b"sbat,1,2023012900\n", bytes.fromhex("50ab5d6046e00043abb63dd810dd8b23")),
    ):
        data = variable(name, value, guid)
        events.append((7, el.EV_EFI_VARIABLE_AUTHORITY, _digests(banks, data), data))
    for name in ("MokList", "MokListX", "MokListTrusted"):
        events.append((14, el.EV_IPL, _digests(banks, _filler(name, 76)), name.encode() + b"\x00"))
    commands = [
        f"grub_cmd: set root=(hd0,gpt{i % 3 + 1}) search --no-floppy --fs-uuid --set=root {i:04d}" for i in range(66)
    ]
    commands.append(f"kernel_cmdline: /boot/vmlinuz-6.1.0-28-cloud-amd64 {command_line}")
    # GRUB logs each string NUL-terminated and measures it without the NUL.
    events += [(8, el.EV_IPL, _digests(banks, text.encode()), text.encode() + b"\x00") for text in commands]
    for path in ("/boot/grub/grub.cfg", "/boot/vmlinuz-6.1.0-28-cloud-amd64", "/boot/initrd.img-6.1.0-28-cloud-amd64"):
        events.append((9, el.EV_IPL, _digests(banks, path.encode()), path.encode() + b"\x00"))
    events += [
        (5, el.EV_EFI_ACTION, _digests(banks, b"Exit Boot Services Invocation"), b"Exit Boot Services Invocation"),
        (
            5,
            el.EV_EFI_ACTION,
            _digests(banks, b"Exit Boot Services Returned with Success"),
            b"Exit Boot Services Returned with Success",
        ),
    ]
    return events


def gce_like_log(command_line: str = COMMAND_LINE, banks=BANKS) -> bytes:
    return el.build(banks, gce_like_events(command_line, banks))
