"""The state disk on real cryptsetup, on sparse files (this kernel has no device-mapper)."""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import shutil
import stat
import subprocess
import time

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.derive import state_disk_key
from ansible_collections.confidential.kubernetes.plugins.module_utils._disk import StateDiskError
from ansible_collections.confidential.kubernetes.plugins.module_utils._disk import luks
from ansible_collections.confidential.kubernetes.plugins.module_utils._disk.luks import (
    CommandResult,
    StateDisk,
    luks_header_summary,
    parse_luks_dump_text,
)

MASTER_KEY = bytes(range(0x00, 0x20))
MASTER_SALT = bytes(range(0x20, 0x40))
# Cheap keyslots for tests; one test below runs cryptsetup's defaults end to end.
FAST_PBKDF = {"pbkdf_memory": 32768, "pbkdf_iterations": 4}
FAST_ARGS = ["--pbkdf", "argon2id", "--pbkdf-memory", "32768", "--pbkdf-force-iterations", "4"]
DISK_SIZE = 32 * 1024 * 1024

pytestmark = pytest.mark.skipif(
    not shutil.which("cryptsetup", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin"),
    reason="cryptsetup (cryptsetup-bin) is not installed",
)


def cryptsetup(*args: str, data: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["cryptsetup", *args], input=data, capture_output=True, check=False)


def key_opens(device: str, key: bytes) -> bool:
    """Independent of the code under test: cryptsetup itself says whether ``key`` opens the header."""
    rc = cryptsetup("open", "--test-passphrase", "--key-file=-", device, data=key).returncode
    assert rc in (0, 2), f"cryptsetup open --test-passphrase failed with exit code {rc}"
    return rc == 0


def digest(path: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def derived_key(uuid: str) -> bytes:
    return state_disk_key(MASTER_KEY, MASTER_SALT, uuid)


@pytest.fixture
def device(tmp_path) -> str:
    path = tmp_path / "state-disk.img"
    with open(path, "wb") as handle:
        handle.truncate(DISK_SIZE)
    return str(path)


@pytest.fixture
def initial_key_path(tmp_path) -> str:
    return str(tmp_path / "run" / "state-disk-initial.key")


@pytest.fixture
def disk(device, initial_key_path) -> StateDisk:
    # The cluster state's placement on the disk has its own tests (test_state_placement.py).
    return StateDisk(device, initial_key_path=initial_key_path, cluster_state_paths=(), **FAST_PBKDF)


def formatted(disk: StateDisk) -> tuple[str, bytes]:
    """Format ``disk`` (uuid_only), returning its UUID and the initial key it was formatted with."""
    result = disk.ensure("formatted", uuid_only=True)
    with open(disk.initial_key_path, "rb") as handle:
        return result["uuid"], handle.read()


def check_mode_twin(disk: StateDisk) -> StateDisk:
    return StateDisk(
        disk.device, initial_key_path=disk.initial_key_path, check_mode=True, cluster_state_paths=(), **FAST_PBKDF
    )


def test_format_writes_the_luks2_header_the_design_asks_for(disk, device, initial_key_path):
    result = disk.ensure("formatted", uuid_only=True)

    assert result["changed"] is True
    header = luks_header_summary(device)
    assert (header.version, header.cipher, header.key_size, header.sector_size, header.pbkdf, header.keyslots) == (
        2,
        "aes-xts-plain64",
        512,
        4096,
        "argon2id",
        1,
    )
    luks_uuid = cryptsetup("luksUUID", device).stdout.decode().strip()
    assert result["uuid"] == luks_uuid.lower() == result["uuid"].lower() == header.uuid
    assert result["keyslots"] == 1 and result["keyed"] is None
    assert stat.S_IMODE(os.stat(initial_key_path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(initial_key_path)).st_mode) == 0o700
    with open(initial_key_path, "rb") as handle:
        initial_key = handle.read()
    assert len(initial_key) == 32 and key_opens(device, initial_key)


def test_uuid_only_on_a_formatted_disk_changes_nothing(disk, device):
    uuid, _initial_key = formatted(disk)
    before = digest(device)
    assert disk.ensure("formatted", uuid_only=True) == {
        "changed": False,
        "uuid": uuid,
        "keyslots": 1,
        "keyed": None,
        "mapped": False,
        "mapping_available": disk.mapping_available,
        "mount_path": None,
    }
    assert digest(device) == before


def test_rekey_leaves_one_keyslot_that_only_the_derived_key_opens(disk, device, initial_key_path):
    uuid, initial_key = formatted(disk)
    key = derived_key(uuid)

    result = disk.ensure("formatted", key)

    assert result["changed"] is True and result["keyed"] is True and result["keyslots"] == 1
    assert key_opens(device, key)
    assert not key_opens(device, initial_key)
    assert luks_header_summary(device).keyslots == 1
    assert luks_header_summary(device).uuid == uuid
    assert not os.path.exists(initial_key_path), "the throw-away initial key must be wiped once it opens nothing"


def test_rerun_after_rekey_changes_nothing(disk, device):
    uuid, _initial_key = formatted(disk)
    key = derived_key(uuid)
    disk.ensure("formatted", key)
    before = digest(device)

    result = disk.ensure("formatted", key)

    assert result["changed"] is False and result["keyed"] is True and result["keyslots"] == 1
    assert digest(device) == before


def test_check_mode_on_a_blank_device_predicts_the_format_and_writes_nothing(disk, device, initial_key_path):
    before = digest(device)
    result = check_mode_twin(disk).ensure("formatted", uuid_only=True)
    assert result["changed"] is True and result["uuid"] is None
    assert digest(device) == before
    assert not os.path.exists(initial_key_path)
    assert not cryptsetup("isLuks", device).returncode == 0


def test_check_mode_predicts_the_rekey_and_leaves_the_header_untouched(disk, device, initial_key_path):
    uuid, initial_key = formatted(disk)
    key = derived_key(uuid)
    before = digest(device)

    result = check_mode_twin(disk).ensure("formatted", key)

    assert result["changed"] is True and result["keyed"] is False
    assert digest(device) == before
    assert key_opens(device, initial_key) and not key_opens(device, key)
    assert os.path.exists(initial_key_path)
    disk.ensure("formatted", key)
    assert check_mode_twin(disk).ensure("formatted", key)["changed"] is False


def test_disk_keyed_with_an_unknown_key_is_refused_and_left_alone(device, initial_key_path):
    cryptsetup(
        "luksFormat",
        "--batch-mode",
        "--type",
        "luks2",
        *FAST_ARGS,
        "--key-file=-",
        device,
        data=secrets.token_bytes(32),
    )
    uuid = cryptsetup("luksUUID", device).stdout.decode().strip()
    before = digest(device)
    disk = StateDisk(device, initial_key_path=initial_key_path, **FAST_PBKDF)

    with pytest.raises(
        StateDiskError, match=f"opens neither with the given disk key nor with an initial key .*{initial_key_path}"
    ) as error:
        disk.ensure("formatted", derived_key(uuid))

    assert (
        uuid in str(error.value) and "Nothing was changed" in str(error.value) and "needs a reset" in str(error.value)
    )
    assert digest(device) == before


def test_initial_key_of_another_disk_is_refused(disk, device, initial_key_path):
    uuid, _initial_key = formatted(disk)
    with open(initial_key_path, "wb") as handle:
        handle.write(secrets.token_bytes(32))
    before = digest(device)
    with pytest.raises(StateDiskError, match=f"nor with the initial key in {initial_key_path}"):
        disk.ensure("formatted", derived_key(uuid))
    assert digest(device) == before


def test_interrupted_rekey_leftover_keyslot_is_removed(disk, device, initial_key_path):
    uuid, initial_key = formatted(disk)
    key = derived_key(uuid)
    # As if luksChangeKey had added the new keyslot and stopped before removing the old one.
    with open(os.path.join(os.path.dirname(initial_key_path), "new.key"), "wb") as handle:
        handle.write(key)
    cryptsetup("luksAddKey", "--batch-mode", *FAST_ARGS, "--key-file=-", device, handle.name, data=initial_key)
    os.unlink(handle.name)
    assert luks_header_summary(device).keyslots == 2

    result = disk.ensure("formatted", key)

    assert result["changed"] is True and result["keyslots"] == 1
    assert key_opens(device, key) and not key_opens(device, initial_key)
    assert not os.path.exists(initial_key_path)


@pytest.mark.parametrize(
    "case,reason",
    [
        ("missing", "device {device} does not exist"),
        ("directory", "device {device} is a directory, not a block device or a file"),
        ("character device", "device {device} is neither a block device nor a regular file"),
    ],
)
def test_unusable_device_is_named_in_a_clear_error(tmp_path, initial_key_path, case, reason):
    device = {"missing": str(tmp_path / "absent.img"), "directory": str(tmp_path), "character device": "/dev/null"}[
        case
    ]
    with pytest.raises(StateDiskError, match=reason.format(device=device)):
        StateDisk(device, initial_key_path=initial_key_path).ensure("formatted", uuid_only=True)
    assert not os.path.exists(initial_key_path)


def test_device_with_a_filesystem_is_not_formatted(disk, device, initial_key_path):
    mkfs = shutil.which("mkfs.ext4", path="/usr/sbin:/sbin:" + os.environ.get("PATH", ""))
    if not mkfs:
        pytest.skip("mkfs.ext4 (e2fsprogs) is not installed")
    subprocess.run([mkfs, "-q", "-F", device], check=True, capture_output=True)
    before = digest(device)
    with pytest.raises(
        StateDiskError, match=f"{device} has no LUKS header but holds a ext4 signature: refusing to format it"
    ):
        disk.ensure("formatted", uuid_only=True)
    assert digest(device) == before and not os.path.exists(initial_key_path)


def test_allow_format_false_refuses_a_blank_device(disk, device):
    before = digest(device)
    with pytest.raises(StateDiskError, match="has no LUKS header and allow_format is false"):
        disk.ensure("formatted", uuid_only=True, allow_format=False)
    assert digest(device) == before


def test_a_key_for_a_disk_that_has_no_uuid_yet_is_refused(disk, device):
    before = digest(device)
    with pytest.raises(StateDiskError, match="run with uuid_only=true first"):
        disk.ensure("formatted", secrets.token_bytes(32))
    assert digest(device) == before


def test_luks1_header_is_refused_not_reformatted(disk, device):
    cryptsetup(
        "luksFormat",
        "--batch-mode",
        "--type",
        "luks1",
        "--pbkdf-force-iterations",
        "1000",
        "--key-file=-",
        device,
        data=secrets.token_bytes(32),
    )
    before = digest(device)
    with pytest.raises(
        StateDiskError, match="has a LUKS1 header; the state disk must be LUKS2 and is never reformatted"
    ):
        disk.ensure("formatted", uuid_only=True)
    assert digest(device) == before


@pytest.mark.parametrize(
    "kwargs,reason",
    [
        ({"state": "opened", "uuid_only": True}, "use it with state=formatted"),
        ({"state": "formatted"}, "needs the disk key"),
        ({"state": "absent", "uuid_only": True}, "state must be one of"),
    ],
)
def test_inconsistent_requests_are_refused(disk, kwargs, reason):
    with pytest.raises(StateDiskError, match=reason):
        disk.ensure(**kwargs)


def test_opened_on_this_host_says_plainly_that_device_mapper_is_missing(disk, device):
    if disk.mapping_available:
        pytest.skip("this host has device-mapper")
    uuid, _initial_key = formatted(disk)
    key = derived_key(uuid)

    with pytest.raises(
        StateDiskError,
        match=r"^device-mapper is not available on this host \(no [^)]*/dev/mapper/control[^)]*\): "
        "the state disk is formatted and keyed but cannot be mapped",
    ) as error:
        disk.ensure("opened", key)

    assert error.value.result["changed"] is True and error.value.result["keyed"] is True
    assert error.value.result["mapping_available"] is False
    assert key_opens(device, key) and luks_header_summary(device).keyslots == 1


def test_missing_control_node_is_reported_as_such(disk, tmp_path, monkeypatch):
    monkeypatch.setattr(luks, "DM_SYSFS", str(tmp_path / "no-sysfs"))
    disk.dm_control = str(tmp_path / "mapper" / "control")
    uuid, _initial_key = formatted(disk)
    with pytest.raises(
        StateDiskError, match=rf"on this host \(no {disk.dm_control}\): the state disk is formatted and keyed"
    ):
        disk.ensure("mounted", derived_key(uuid))


class ArgvRecorder:
    """Wraps the runner seam: every argument list, and checks every key file cryptsetup is handed."""

    def __init__(self, disk: StateDisk):
        self._run = disk._run_command
        self.argvs: list[list[str]] = []
        self.key_files: list[str] = []
        disk._run_command = self

    def __call__(self, argv: list[str], data: bytes | None = None) -> CommandResult:
        self.argvs.append(list(argv))
        for arg in argv:
            if os.path.basename(os.path.dirname(arg)).startswith("ck-disk-key-"):
                assert stat.S_IMODE(os.stat(arg).st_mode) == 0o600
                assert stat.S_IMODE(os.stat(os.path.dirname(arg)).st_mode) == 0o700
                self.key_files.append(arg)
        return self._run(argv, data)

    def assert_never_in_argv(self, secret: bytes) -> None:
        forms = [
            secret.hex(),
            secret.hex().upper(),
            base64.b64encode(secret).decode(),
            base64.urlsafe_b64encode(secret).decode(),
        ]
        for argv in self.argvs:
            for arg in argv:
                assert secret not in os.fsencode(arg)
                assert not any(form in arg for form in forms), (
                    f"a key appears on a {os.path.basename(argv[0])} command line"
                )


def test_no_key_ever_appears_in_an_argv_and_key_files_are_wiped(disk, device):
    recorder = ArgvRecorder(disk)
    uuid, initial_key = formatted(disk)
    key = derived_key(uuid)
    disk.ensure("formatted", key)
    disk.ensure("formatted", key)
    with pytest.raises(StateDiskError):
        disk.ensure("opened", key)

    recorder.assert_never_in_argv(key)
    recorder.assert_never_in_argv(initial_key)
    commands = {argv[1] for argv in recorder.argvs if os.path.basename(argv[0]) == "cryptsetup"}
    assert {"luksFormat", "luksChangeKey", "open"} <= commands
    assert len(recorder.key_files) == 2, "luksFormat and luksChangeKey read their keys from files"
    assert not any(os.path.exists(path) for path in recorder.key_files)


def test_default_pbkdf_parameters_end_to_end(device, initial_key_path):
    """cryptsetup's own argon2id costs (benchmarked), as the module uses them on a node."""
    disk = StateDisk(device, initial_key_path=initial_key_path)
    started = time.monotonic()
    uuid = disk.ensure("formatted", uuid_only=True)["uuid"]
    with open(initial_key_path, "rb") as handle:
        initial_key = handle.read()
    result = disk.ensure("formatted", derived_key(uuid))
    elapsed = time.monotonic() - started

    assert result["changed"] is True and result["keyed"] is True and result["keyslots"] == 1
    header = luks_header_summary(device)
    assert (header.pbkdf, header.keyslots, header.sector_size) == ("argon2id", 1, 4096)
    assert key_opens(device, derived_key(uuid)) and not key_opens(device, initial_key)
    print(f"default-parameter format + re-key: {elapsed:.1f} s")


def test_text_dump_parser_agrees_with_the_json_dump(disk, device):
    formatted(disk)
    text = cryptsetup("luksDump", device).stdout.decode()
    assert parse_luks_dump_text(text) == luks_header_summary(device)


def test_text_dump_parser_reads_luks1(device):
    cryptsetup(
        "luksFormat",
        "--batch-mode",
        "--type",
        "luks1",
        "--pbkdf-force-iterations",
        "1000",
        "--key-file=-",
        device,
        data=secrets.token_bytes(32),
    )
    header = parse_luks_dump_text(cryptsetup("luksDump", device).stdout.decode())
    assert (header.version, header.cipher, header.keyslots) == (1, "aes-xts-plain64", 1)


class FakeDeviceMapperHost:
    """Test double of a host with device-mapper: answers cryptsetup open/status, blkid, mkfs and mount as such a host would.

    Everything else (and the key check behind ``open``) goes to the real cryptsetup.
    """

    def __init__(self, disk: StateDisk, tmp_path):
        self._run = disk._run_command
        self.calls: list[tuple[list[str], bytes | None]] = []
        self.mapped_device: str | None = None
        self.filesystem: str | None = None
        self.mkfs_error: str | None = None
        disk._run_command = self
        disk.dm_control = str(tmp_path / "control")
        open(disk.dm_control, "w").close()
        disk.mountinfo = str(tmp_path / "mountinfo")
        with open(disk.mountinfo, "w") as handle:
            handle.write("1 0 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n")
        self.disk = disk

    def tools(self) -> list[str]:
        return [
            os.path.basename(argv[0]) + (f" {argv[1]}" if os.path.basename(argv[0]) == "cryptsetup" else "")
            for argv, _data in self.calls
        ]

    def __call__(self, argv: list[str], data: bytes | None = None) -> CommandResult:
        self.calls.append((list(argv), data))
        tool, args = os.path.basename(argv[0]), argv[1:]
        if tool == "cryptsetup" and args[0] == "status":
            if self.mapped_device is None:
                return CommandResult(4, "", f"/dev/mapper/{args[1]} is inactive.\n")
            return CommandResult(
                0,
                f"/dev/mapper/{args[1]} is active.\n  type:    LUKS2\n  cipher:  aes-xts-plain64\n"
                f"  device:  /dev/loop7\n  loop:    {self.mapped_device}\n",
                "",
            )
        if tool == "cryptsetup" and args[0] == "open" and "--test-passphrase" not in args:
            device = args[-2]
            check = self._run([argv[0], "open", "--test-passphrase", "--type", "luks2", "--key-file=-", device], data)
            if check.rc == 0:
                self.mapped_device = device
            return check
        if tool == "blkid" and args[-1].startswith("/dev/mapper/"):
            return (
                CommandResult(0, f"DEVNAME={args[-1]}\nTYPE={self.filesystem}\n", "")
                if self.filesystem
                else CommandResult(2, "", "")
            )
        if tool.startswith("mkfs."):
            if self.mkfs_error:
                return CommandResult(1, "", self.mkfs_error)
            self.filesystem = tool[len("mkfs.") :]
            return CommandResult(0, "", "")
        if tool == "mount":
            source, target = args[-2], args[-1]
            with open(self.disk.mountinfo, "a") as handle:
                escaped = os.path.realpath(target).replace("\\", "\\134").replace(" ", "\\040")
                handle.write(f"99 1 253:0 / {escaped} rw,relatime - {args[1]} {source} rw\n")
            return CommandResult(0, "", "")
        return self._run(argv, data)


def test_mounted_on_a_device_mapper_host_opens_makes_a_filesystem_and_mounts(disk, device, tmp_path):
    uuid, _initial_key = formatted(disk)
    key = derived_key(uuid)
    disk.mount_path = str(tmp_path / "state mount")
    host = FakeDeviceMapperHost(disk, tmp_path)

    result = disk.ensure("mounted", key)

    assert result == {
        "changed": True,
        "uuid": uuid,
        "keyslots": 1,
        "keyed": True,
        "mapped": True,
        "mapping_available": True,
        "mount_path": disk.mount_path,
    }
    assert host.mapped_device == device and host.filesystem == "ext4"
    open_call = next((argv, data) for argv, data in host.calls if argv[1] == "open" and "--test-passphrase" not in argv)
    assert open_call == ([open_call[0][0], "open", "--type", "luks2", "--key-file=-", device, "state"], key)
    assert ["mount", "-t", "ext4", "/dev/mapper/state", disk.mount_path] == [
        os.path.basename(host.calls[-1][0][0]),
        *host.calls[-1][0][1:],
    ]
    assert stat.S_IMODE(os.stat(disk.mount_path).st_mode) == 0o700

    del host.calls[:]
    again = disk.ensure("mounted", key)
    assert again["changed"] is False and again["mapped"] is True and again["mount_path"] == disk.mount_path
    assert not any(tool.startswith(("mkfs", "mount", "cryptsetup luksChangeKey")) for tool in host.tools())


def test_mounted_in_check_mode_on_a_device_mapper_host_maps_nothing(disk, tmp_path):
    uuid, _initial_key = formatted(disk)
    disk.ensure("formatted", derived_key(uuid))
    twin = check_mode_twin(disk)
    host = FakeDeviceMapperHost(twin, tmp_path)
    result = twin.ensure("mounted", derived_key(uuid))
    assert result["changed"] is True and result["mapped"] is False and host.mapped_device is None
    assert not any(tool.startswith(("mkfs", "mount")) for tool in host.tools())


def test_existing_filesystem_of_another_type_is_not_replaced(disk, tmp_path):
    uuid, _initial_key = formatted(disk)
    disk.mount_path = str(tmp_path / "state")
    host = FakeDeviceMapperHost(disk, tmp_path)
    host.filesystem = "xfs"
    with pytest.raises(StateDiskError, match="holds a xfs filesystem, not ext4: it is never reformatted"):
        disk.ensure("mounted", derived_key(uuid))
    assert host.filesystem == "xfs"


def test_mapper_name_taken_by_another_device_is_refused(disk, tmp_path):
    uuid, _initial_key = formatted(disk)
    host = FakeDeviceMapperHost(disk, tmp_path)
    host.mapped_device = str(tmp_path / "other.img")
    with pytest.raises(StateDiskError, match=r"/dev/mapper/state is already active for .*other\.img, not for"):
        disk.ensure("opened", derived_key(uuid))
    assert disk.ensure("formatted", derived_key(uuid))["mapped"] is False


def test_mount_path_taken_by_another_filesystem_is_refused(disk, tmp_path):
    uuid, _initial_key = formatted(disk)
    disk.mount_path = str(tmp_path / "state")
    host = FakeDeviceMapperHost(disk, tmp_path)
    with open(disk.mountinfo, "a") as handle:
        handle.write(f"50 1 8:2 / {disk.mount_path} rw - ext4 /dev/sdb1 rw\n")
    with pytest.raises(StateDiskError, match=f"mount_path {disk.mount_path} already has /dev/sdb1 mounted on it"):
        disk.ensure("mounted", derived_key(uuid))
    assert host.filesystem is None


def test_a_failure_after_the_rekey_still_reports_the_change(disk, device, tmp_path):
    uuid, _initial_key = formatted(disk)
    disk.mount_path = str(tmp_path / "state")
    host = FakeDeviceMapperHost(disk, tmp_path)
    host.mkfs_error = "mke2fs: Device size reported to be zero.\n"
    with pytest.raises(
        StateDiskError, match="mkfs.ext4 /dev/mapper/state failed: mke2fs: Device size reported to be zero"
    ) as error:
        disk.ensure("mounted", derived_key(uuid))
    assert (
        error.value.result["changed"] is True
        and error.value.result["keyed"] is True
        and error.value.result["mapped"] is True
    )
    assert key_opens(device, derived_key(uuid))


@pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root")
def test_mounted_binds_the_cluster_state_from_the_disk_once(disk, tmp_path):
    uuid, _initial_key = formatted(disk)
    disk.mount_path = str(tmp_path / "state")
    FakeDeviceMapperHost(disk, tmp_path)
    etc = str(tmp_path / "root" / "etc" / "kubernetes")
    disk.cluster_state_paths = (etc,)
    try:
        assert disk.ensure("mounted", derived_key(uuid))["changed"] is True
        assert os.path.samefile(etc, os.path.join(disk.mount_path, etc.lstrip("/")))
        disk.ensure("formatted", derived_key(uuid))
        assert disk.ensure("mounted", derived_key(uuid))["changed"] is False
    finally:
        subprocess.run(["umount", etc], check=False)
