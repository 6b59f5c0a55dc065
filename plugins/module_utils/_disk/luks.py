# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The LUKS2 state disk: format, re-key to the derived disk key, map, make a filesystem, mount."""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
import subprocess
from dataclasses import asdict, dataclass

from . import StateDiskError, find_binary
from .._files import write_private_file
from .._reset import NEEDS_RESET
from .keys import DISK_KEY_LENGTH, private_key_file, read_private_file, wipe_file
from .placement import CLUSTER_STATE_PATHS, place_cluster_state, unescape_mountinfo

STATES = ("formatted", "opened", "mounted")
DEFAULT_NAME = "state"
DEFAULT_MOUNT_PATH = "/var/lib/confidential-kubernetes/state"
DEFAULT_FILESYSTEM = "ext4"
# tmpfs on real hosts: the initial key is gone after a reboot, as it should be.
INITIAL_KEY_DIR = "/run/confidential-kubernetes"
DM_CONTROL = "/dev/mapper/control"
DM_SYSFS = "/sys/class/misc/device-mapper"
MOUNTINFO = "/proc/self/mountinfo"

CIPHER = "aes-xts-plain64"
KEY_SIZE_BITS = 512
SECTOR_SIZE = 4096
PBKDF = "argon2id"

# cryptsetup(8) RETURN CODES: 2 = no key available with this passphrase, 4 = wrong device (or inactive for status).
_CRYPTSETUP_NO_KEY = 2
_CRYPTSETUP_INACTIVE = 4
# blkid(8): 2 = no signature found.
_BLKID_NOTHING_FOUND = 2
_PACKAGES = {
    "cryptsetup": "cryptsetup-bin (Debian, Ubuntu) or cryptsetup (Fedora, RHEL)",
    "blkid": "util-linux",
    "mount": "util-linux",
    "mkfs.ext4": "e2fsprogs",
    "mkfs.xfs": "xfsprogs",
    "mkfs.btrfs": "btrfs-progs",
}
_MAPPER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,126}$")
_FILESYSTEM = re.compile(r"^[a-z0-9]{1,16}$")


def initial_key_path_for(name: str) -> str:
    return os.path.join(INITIAL_KEY_DIR, f"{name}-disk-initial.key")


@dataclass(frozen=True)
class CommandResult:
    rc: int
    stdout: str
    stderr: str

    def message(self) -> str:
        return (self.stderr.strip() or self.stdout.strip() or "no output").splitlines()[-1]


@dataclass(frozen=True)
class LuksHeader:
    """What a verify step checks of a state disk header; never any key material."""

    version: int
    uuid: str
    cipher: str | None
    key_size: int | None  # bits
    sector_size: int | None
    pbkdf: str | None  # of the lowest keyslot
    keyslots: int

    def to_dict(self) -> dict:
        return asdict(self)


def luks_header_summary(device: str) -> LuksHeader:
    """Cipher, key size, sector size, PBKDF and keyslot count of the LUKS header on ``device``."""
    return StateDisk(device).header_summary()


def parse_luks_dump_json(metadata: str, uuid: str) -> LuksHeader:
    """``cryptsetup luksDump --dump-json-metadata`` (cryptsetup >= 2.4, LUKS2 only)."""
    document = json.loads(metadata)
    keyslots = document.get("keyslots", {})
    segment = document.get("segments", {}).get("0", {})
    first = keyslots[min(keyslots, key=int)] if keyslots else {}
    key_size = first.get("key_size")
    return LuksHeader(
        version=2,
        uuid=uuid,
        cipher=segment.get("encryption"),
        key_size=key_size * 8 if key_size else None,
        sector_size=segment.get("sector_size"),
        pbkdf=first.get("kdf", {}).get("type"),
        keyslots=len(keyslots),
    )


def parse_luks_dump_text(dump: str) -> LuksHeader:
    """``cryptsetup luksDump`` text, for cryptsetup without JSON dumps and for LUKS1 headers."""
    fields: dict[str, str] = {}
    section = ""
    slots: list[dict[str, str]] = []
    for line in dump.splitlines():
        if line and not line[0].isspace():
            section = line.split(":", 1)[0].strip()
            if section.startswith("Key Slot ") and line.rstrip().endswith("ENABLED"):
                slots.append({})
            elif ":" in line and section not in ("Keyslots", "Data segments", "Tokens", "Digests"):
                fields.setdefault(section, line.split(":", 1)[1].strip())
            continue
        key, _sep, value = line.strip().partition(":")
        if section == "Keyslots" and re.fullmatch(r"\d+", key):
            slots.append({})
        elif section == "Keyslots" and slots:
            slots[-1].setdefault(key, value.strip())
        elif section == "Data segments":
            fields.setdefault(f"segment {key}", value.strip())
    version = int(fields.get("Version", "0"))
    if version == 1:
        cipher = f"{fields.get('Cipher name', '')}-{fields.get('Cipher mode', '')}"
        key_bits = fields.get("MK bits")
        return LuksHeader(
            1, fields.get("UUID", "").lower(), cipher, int(key_bits) if key_bits else None, 512, "pbkdf2", len(slots)
        )
    key_size = slots[0].get("Key", "").split()[0] if slots and slots[0].get("Key") else None
    sector = fields.get("segment sector", "").split()
    return LuksHeader(
        version,
        fields.get("UUID", "").lower(),
        fields.get("segment cipher"),
        int(key_size) if key_size else None,
        int(sector[0]) if sector else None,
        slots[0].get("PBKDF") if slots else None,
        len(slots),
    )


class StateDisk:
    """One state disk. ``_run_command`` is the only way out to cryptsetup, blkid, mkfs and mount."""

    def __init__(
        self,
        device: str,
        name: str = DEFAULT_NAME,
        mount_path: str = DEFAULT_MOUNT_PATH,
        filesystem: str = DEFAULT_FILESYSTEM,
        initial_key_path: str | None = None,
        pbkdf_memory: int | None = None,
        pbkdf_iterations: int | None = None,
        check_mode: bool = False,
        dm_control: str = DM_CONTROL,
        mountinfo: str = MOUNTINFO,
        cluster_state_paths: tuple[str, ...] = CLUSTER_STATE_PATHS,
    ):
        if not _MAPPER_NAME.match(name):
            raise StateDiskError(
                f"name {name!r} is not a usable device-mapper name (letters, digits, '.', '_', '-'; at most 127)"
            )
        if not _FILESYSTEM.match(filesystem):
            raise StateDiskError(f"filesystem {filesystem!r} is not a filesystem type such as ext4 or xfs")
        self.device = device
        self.name = name
        self.mapper_path = os.path.join("/dev/mapper", name)
        self.mount_path = mount_path
        self.filesystem = filesystem
        self.initial_key_path = initial_key_path or initial_key_path_for(name)
        self.pbkdf_memory = pbkdf_memory
        self.pbkdf_iterations = pbkdf_iterations
        self.check_mode = check_mode
        self.dm_control = dm_control
        self.mountinfo = mountinfo
        # Bound from the mounted disk (placement.py): the node's cluster state lives on the disk.
        self.cluster_state_paths = cluster_state_paths

    # The runner seam: an argument list, secrets only in ``data`` (stdin).
    def _run_command(self, argv: list[str], data: bytes | None = None) -> CommandResult:
        env = dict(os.environ, LC_ALL="C", LANG="C")
        try:
            if data is None:
                completed = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, env=env, check=False)
            else:
                completed = subprocess.run(argv, input=data, capture_output=True, env=env, check=False)
        except OSError as exc:
            raise StateDiskError(f"cannot run {argv[0]}: {exc.strerror}") from None
        return CommandResult(
            completed.returncode, completed.stdout.decode(errors="replace"), completed.stderr.decode(errors="replace")
        )

    @staticmethod
    def _binary(name: str) -> str:
        found = find_binary(name)
        if not found:
            raise StateDiskError(
                f"{name} was not found on this host: install {_PACKAGES.get(name, 'the package that provides it')}"
            )
        return found

    def _cryptsetup(self, args: list[str], data: bytes | None = None) -> CommandResult:
        return self._run_command([self._binary("cryptsetup"), *args], data)

    def _pbkdf_args(self) -> list[str]:
        args = ["--pbkdf", PBKDF]
        if self.pbkdf_memory:
            args += ["--pbkdf-memory", str(self.pbkdf_memory)]
        if self.pbkdf_iterations:
            args += ["--pbkdf-force-iterations", str(self.pbkdf_iterations)]
        return args

    def mapping_unavailable_reason(self) -> str | None:
        """Why this host cannot map the disk, None when it can."""
        try:
            fd = os.open(self.dm_control, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            # The kernel has device-mapper; libdevmapper creates the missing node itself.
            return None if os.path.exists(DM_SYSFS) else f"no {self.dm_control}"
        except OSError as exc:
            # libdevmapper creates the node even where the kernel has no device-mapper: opening it tells.
            return f"no usable {self.dm_control}: {exc.strerror}"
        os.close(fd)
        return None

    @property
    def mapping_available(self) -> bool:
        return self.mapping_unavailable_reason() is None

    def check_device(self) -> None:
        try:
            info = os.stat(self.device)
        except FileNotFoundError:
            raise StateDiskError(f"device {self.device} does not exist") from None
        except OSError as exc:
            raise StateDiskError(f"cannot inspect device {self.device}: {exc.strerror}") from None
        if stat.S_ISDIR(info.st_mode):
            raise StateDiskError(f"device {self.device} is a directory, not a block device or a file")
        if not (stat.S_ISBLK(info.st_mode) or stat.S_ISREG(info.st_mode)):
            raise StateDiskError(f"device {self.device} is neither a block device nor a regular file")

    def is_luks(self) -> bool:
        result = self._cryptsetup(["isLuks", self.device])
        if result.rc not in (0, 1):
            raise StateDiskError(f"cryptsetup isLuks {self.device} failed: {result.message()}")
        return result.rc == 0

    def luks_uuid(self) -> str:
        result = self._cryptsetup(["luksUUID", self.device])
        if result.rc != 0:
            raise StateDiskError(f"cryptsetup luksUUID {self.device} failed: {result.message()}")
        return result.stdout.strip().lower()

    def header_summary(self) -> LuksHeader:
        uuid = self.luks_uuid()
        result = self._cryptsetup(["luksDump", "--dump-json-metadata", self.device])
        if result.rc == 0:
            return parse_luks_dump_json(result.stdout, uuid)
        # LUKS1 headers and cryptsetup < 2.4 have no JSON dump.
        result = self._cryptsetup(["luksDump", self.device])
        if result.rc != 0:
            raise StateDiskError(f"cryptsetup luksDump {self.device} failed: {result.message()}")
        return parse_luks_dump_text(result.stdout)

    def _signature(self, device: str) -> str | None:
        """The filesystem, partition table or other signature blkid finds on ``device``, None on a blank one."""
        result = self._run_command([self._binary("blkid"), "--probe", "--output", "export", device])
        if result.rc == _BLKID_NOTHING_FOUND:
            return None
        if result.rc != 0:
            raise StateDiskError(f"blkid --probe {device} failed: {result.message()}")
        values = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
        return values.get("TYPE") or values.get("PTTYPE") or "unknown"

    def opens(self, key: bytes) -> bool:
        """Whether ``key`` opens a keyslot (no mapping: works without device-mapper)."""
        result = self._cryptsetup(["open", "--test-passphrase", "--type", "luks2", "--key-file=-", self.device], key)
        if result.rc == _CRYPTSETUP_NO_KEY:
            return False
        if result.rc != 0:
            raise StateDiskError(f"cryptsetup open --test-passphrase {self.device} failed: {result.message()}")
        return True

    def format(self) -> None:
        """LUKS2 with one keyslot, keyed with a random initial passphrase kept at ``initial_key_path``."""
        initial_key = secrets.token_bytes(DISK_KEY_LENGTH)
        write_private_file(self.initial_key_path, initial_key)
        try:
            with private_key_file(initial_key) as key_file:
                result = self._cryptsetup(
                    [
                        "luksFormat",
                        "--batch-mode",
                        "--type",
                        "luks2",
                        "--cipher",
                        CIPHER,
                        "--key-size",
                        str(KEY_SIZE_BITS),
                        "--sector-size",
                        str(SECTOR_SIZE),
                        *self._pbkdf_args(),
                        "--key-file",
                        key_file,
                        self.device,
                    ]
                )
            if result.rc != 0:
                raise StateDiskError(f"cryptsetup luksFormat {self.device} failed: {result.message()}")
        except BaseException:
            wipe_file(self.initial_key_path)
            raise

    def _change_key(self, old_key: bytes, new_key: bytes) -> bool:
        """Replace the keyslot that ``old_key`` opens with one for ``new_key`` (the slot count stays the same).

        False when ``old_key`` opens no keyslot.
        """
        with private_key_file(new_key) as new_key_file:
            result = self._cryptsetup(
                ["luksChangeKey", "--batch-mode", *self._pbkdf_args(), "--key-file=-", self.device, new_key_file],
                old_key,
            )
        if result.rc == _CRYPTSETUP_NO_KEY:
            return False
        if result.rc != 0:
            raise StateDiskError(f"cryptsetup luksChangeKey {self.device} failed: {result.message()}")
        return True

    def _remove_key(self, key: bytes) -> None:
        result = self._cryptsetup(["luksRemoveKey", "--batch-mode", "--key-file=-", self.device], key)
        if result.rc != 0:
            raise StateDiskError(f"cryptsetup luksRemoveKey {self.device} failed: {result.message()}")

    def _initial_key(self) -> bytes | None:
        key = read_private_file(self.initial_key_path)
        return key if key is not None and len(key) == DISK_KEY_LENGTH else None

    def _ensure_keyed(self, disk_key: bytes, uuid: str) -> tuple[bool, bool]:
        """Make the derived key the only way in. Returns (changed, keyed now)."""
        if self.opens(disk_key):
            if not os.path.exists(self.initial_key_path):
                return False, True
            # Left over from an interrupted re-key: its keyslot must not survive.
            if not self.check_mode:
                initial_key = self._initial_key()
                if initial_key is not None and initial_key != disk_key and self.opens(initial_key):
                    self._remove_key(initial_key)
                wipe_file(self.initial_key_path)
            return True, True
        initial_key = self._initial_key()
        if initial_key is not None:
            if self.check_mode:
                if self.opens(initial_key):
                    return True, False
            # luksChangeKey says itself when the initial key opens nothing: one argon2id run less.
            elif self._change_key(initial_key, disk_key):
                wipe_file(self.initial_key_path)
                return True, True
        if os.path.exists(self.initial_key_path):
            where = f"the initial key in {self.initial_key_path}"
        else:
            where = f"an initial key (there is none at {self.initial_key_path})"
        raise StateDiskError(
            f"the LUKS header on {self.device} (UUID {uuid}) opens neither with the given disk key nor with {where}: "
            "it was keyed for another cluster, or its initial key was lost (for example by a reboot before re-keying). "
            f"Nothing was changed; {NEEDS_RESET} (the reset erases the disk's LUKS header), and run again."
        )

    def _mapping_owner(self) -> set[str] | None:
        """The devices behind /dev/mapper/<name>, None when that mapping is not active."""
        result = self._cryptsetup(["status", self.name])
        if result.rc == _CRYPTSETUP_INACTIVE:
            return None
        if result.rc != 0:
            raise StateDiskError(f"cryptsetup status {self.name} failed: {result.message()}")
        owners = set()
        for line in result.stdout.splitlines():
            key, _sep, value = line.strip().partition(":")
            if key in ("device", "loop") and value.strip():
                owners.add(os.path.realpath(value.strip()))
        return owners

    def is_mapped(self, strict: bool = True) -> bool:
        """Whether /dev/mapper/<name> is this device; with ``strict``, an error when the name maps another device."""
        if not self.mapping_available:
            return False
        owners = self._mapping_owner()
        if owners is None:
            return False
        if os.path.realpath(self.device) not in owners:
            if not strict:
                return False
            raise StateDiskError(
                f"{self.mapper_path} is already active for {', '.join(sorted(owners))}, not for {self.device}: "
                f"choose another name, or close it (cryptsetup close {self.name})"
            )
        return True

    def _open_mapping(self, disk_key: bytes) -> None:
        result = self._cryptsetup(["open", "--type", "luks2", "--key-file=-", self.device, self.name], disk_key)
        if result.rc != 0:
            raise StateDiskError(f"cryptsetup open {self.device} as {self.mapper_path} failed: {result.message()}")

    def mount_source(self) -> str | None:
        """What is mounted on ``mount_path`` (the topmost mount), None when nothing is."""
        target = os.path.realpath(self.mount_path)
        source = None
        with open(self.mountinfo, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                fields = line.split()
                if "-" not in fields[6:]:
                    continue
                separator = fields.index("-", 6)
                if unescape_mountinfo(fields[4]) == target and len(fields) > separator + 2:
                    source = unescape_mountinfo(fields[separator + 2])
        return source

    def _make_filesystem(self) -> None:
        result = self._run_command([self._binary(f"mkfs.{self.filesystem}"), self.mapper_path])
        if result.rc != 0:
            raise StateDiskError(f"mkfs.{self.filesystem} {self.mapper_path} failed: {result.message()}")

    def _mount(self) -> None:
        os.makedirs(self.mount_path, mode=0o700, exist_ok=True)
        result = self._run_command([self._binary("mount"), "-t", self.filesystem, self.mapper_path, self.mount_path])
        if result.rc != 0:
            raise StateDiskError(f"mount {self.mapper_path} on {self.mount_path} failed: {result.message()}")

    def _ensure_formatted(self, allow_format: bool, disk_key: bytes | None) -> bool:
        """Format the device if it has no LUKS header. Returns whether it did (or would)."""
        if self.is_luks():
            return False
        if not allow_format:
            raise StateDiskError(
                f"device {self.device} has no LUKS header and allow_format is false: nothing was changed"
            )
        if disk_key is not None:
            raise StateDiskError(
                f"device {self.device} has no LUKS header yet, so no disk key can have been derived for it: "
                "run with uuid_only=true first, derive the key from the UUID it returns, then pass that key"
            )
        signature = self._signature(self.device)
        if signature:
            raise StateDiskError(
                f"device {self.device} has no LUKS header but holds a {signature} signature: refusing to format it. "
                f"If it really is the state disk, wipe it first (wipefs --all {self.device})"
            )
        if not self.check_mode:
            self.format()
        return True

    def ensure(
        self, state: str, disk_key: bytes | None = None, uuid_only: bool = False, allow_format: bool = True
    ) -> dict:
        """Bring the disk to ``state``; returns the module result."""
        if state not in STATES:
            raise StateDiskError(f"state must be one of {', '.join(STATES)}, got {state!r}")
        if uuid_only and (state != "formatted" or disk_key is not None):
            raise StateDiskError(
                "uuid_only only formats the device and returns its LUKS UUID: use it with state=formatted and no disk key"
            )
        if not uuid_only and disk_key is None:
            raise StateDiskError(
                f"state={state} needs the disk key (disk_key or disk_key_file); use uuid_only=true to get the UUID first"
            )
        self.check_device()
        result = {
            "changed": False,
            "uuid": None,
            "keyslots": 0,
            "keyed": None,
            "mapped": False,
            "mapping_available": self.mapping_available,
            "mount_path": None,
        }
        try:
            return self._ensure(state, disk_key, uuid_only, allow_format, result)
        except StateDiskError as exc:
            # A failure after a change must still report it (for example a mount after the re-key).
            if not exc.result:
                exc.result = dict(result)
            raise

    def _ensure(self, state: str, disk_key: bytes | None, uuid_only: bool, allow_format: bool, result: dict) -> dict:
        result["changed"] = self._ensure_formatted(allow_format, disk_key)
        if result["changed"] and self.check_mode:
            return result
        header = self.header_summary()
        if header.version != 2:
            raise StateDiskError(
                f"device {self.device} has a LUKS{header.version} header; the state disk must be LUKS2 and is never "
                f"reformatted: convert it (cryptsetup convert --type luks2 {self.device}) or wipe it"
            )
        result.update(uuid=header.uuid, keyslots=header.keyslots)
        if uuid_only:
            return result
        rekeyed, result["keyed"] = self._ensure_keyed(disk_key, header.uuid)
        if rekeyed:
            result["changed"] = True
            if not self.check_mode:
                result["keyslots"] = self.header_summary().keyslots
        if state == "formatted":
            result["mapped"] = self.is_mapped(strict=False)
            return result
        unavailable = self.mapping_unavailable_reason()
        if unavailable:
            status = "is formatted and keyed" if result["keyed"] else "can be formatted and keyed"
            raise StateDiskError(
                f"device-mapper is not available on this host ({unavailable}): the state disk {status} "
                "but cannot be mapped. Use state=formatted on hosts without device-mapper.",
                result,
            )
        return self._ensure_mapped(state, disk_key, result)

    def _ensure_mapped(self, state: str, disk_key: bytes, result: dict) -> dict:
        if not self.is_mapped():
            result["changed"] = True
            if self.check_mode:
                return result
            self._open_mapping(disk_key)
        result["mapped"] = True
        if state == "opened":
            return result
        source = self.mount_source()
        if source is not None and os.path.realpath(source) == os.path.realpath(self.mapper_path):
            result["mount_path"] = self.mount_path
            return self._place_cluster_state(result)
        if source is not None:
            raise StateDiskError(
                f"mount_path {self.mount_path} already has {source} mounted on it: "
                f"unmount it or choose another mount_path",
                result,
            )
        result["changed"] = True
        if self.check_mode:
            return result
        found = self._signature(self.mapper_path)
        if found is None:
            self._make_filesystem()
        elif found != self.filesystem:
            raise StateDiskError(
                f"{self.mapper_path} holds a {found} filesystem, not {self.filesystem}: "
                "it is never reformatted; set filesystem to match",
                result,
            )
        self._mount()
        result["mount_path"] = self.mount_path
        return self._place_cluster_state(result)

    def _place_cluster_state(self, result: dict) -> dict:
        if place_cluster_state(self.mount_path, self.cluster_state_paths, check_mode=self.check_mode):
            result["changed"] = True
        return result
