from __future__ import annotations

import base64
import os
import secrets
import stat

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._disk import StateDiskError
from ansible_collections.confidential.kubernetes.plugins.module_utils._disk import keys
from ansible_collections.confidential.kubernetes.plugins.module_utils._files import write_private_file


def _write(path, data: bytes, mode: int = 0o600) -> str:
    path.write_bytes(data)
    path.chmod(mode)
    return str(path)


def test_disk_key_decodes_from_base64():
    key = secrets.token_bytes(32)
    assert keys.decode_disk_key(base64.b64encode(key).decode()) == key


@pytest.mark.parametrize(
    "value,reason",
    [
        ("not base64!", "is not valid base64"),
        (base64.b64encode(bytes(31)).decode(), "decodes to 31 bytes"),
        (base64.b64encode(bytes(32).hex().encode()).decode(), "decodes to 64 bytes"),
    ],
    ids=["not base64", "31 bytes", "hex text instead of raw bytes"],
)
def test_malformed_disk_key_is_refused_without_echoing_it(value, reason):
    with pytest.raises(StateDiskError, match=reason) as error:
        keys.decode_disk_key(value)
    assert value not in str(error.value)


def test_disk_key_file_holds_the_raw_key(tmp_path):
    key = secrets.token_bytes(32)
    assert keys.read_disk_key_file(_write(tmp_path / "disk.key", key)) == key


@pytest.mark.parametrize(
    "case,reason",
    [
        ("missing", "cannot read disk_key_file .*: No such file or directory"),
        ("directory", "is not a regular file"),
        ("symlink", "cannot read disk_key_file"),
        ("group readable", r"has mode 0640; .*chmod 0600"),
        ("world readable", r"has mode 0644; .*chmod 0600"),
        ("31 bytes", "holds 31 bytes; it must hold exactly the raw 32-byte disk key"),
        ("hex text", r"holds 33\+ bytes; .*not hex"),
    ],
)
def test_bad_disk_key_file_is_named_in_a_clear_error(tmp_path, case, reason):
    key = secrets.token_bytes(32)
    path = tmp_path / "disk.key"
    if case == "directory":
        path.mkdir()
    elif case == "symlink":
        path.symlink_to(_write(tmp_path / "target.key", key))
    elif case == "group readable":
        _write(path, key, 0o640)
    elif case == "world readable":
        _write(path, key, 0o644)
    elif case == "31 bytes":
        _write(path, key[:31])
    elif case == "hex text":
        _write(path, key.hex().encode())
    with pytest.raises(StateDiskError, match=reason) as error:
        keys.read_disk_key_file(str(path))
    assert str(path) in str(error.value)
    assert key.hex() not in str(error.value)


def test_private_key_file_is_0600_in_a_0700_tmpfs_directory_and_zeroed_before_removal():
    secret = secrets.token_bytes(32)
    with keys.private_key_file(secret) as path:
        directory = os.path.dirname(path)
        assert directory.startswith(keys.PRIVATE_TMP_DIRS)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
        with open(path, "rb") as handle:
            assert handle.read() == secret
        # A second name for the same inode shows what the removal left behind.
        peek = os.path.join(os.path.dirname(directory), f"ck-test-peek-{secrets.token_hex(8)}")
        os.link(path, peek)
    try:
        assert not os.path.exists(path) and not os.path.exists(directory)
        with open(peek, "rb") as handle:
            assert handle.read() == bytes(32)
    finally:
        os.unlink(peek)


def test_private_key_file_is_removed_when_the_command_fails():
    with pytest.raises(RuntimeError):
        with keys.private_key_file(b"k" * 32) as path:
            raise RuntimeError("cryptsetup failed")
    assert not os.path.exists(os.path.dirname(path))


def test_no_tmpfs_for_a_key_file_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(keys, "PRIVATE_TMP_DIRS", (str(tmp_path / "absent"),))
    with pytest.raises(StateDiskError, match="must live on tmpfs"):
        with keys.private_key_file(bytes(32)):
            pass


def test_write_private_file_is_0600_and_wipe_file_zeroes_it(tmp_path):
    path = str(tmp_path / "run" / "initial.key")
    write_private_file(path, b"\xff" * 32)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    os.link(path, tmp_path / "peek")
    assert keys.wipe_file(path) is True
    assert not os.path.exists(path)
    assert (tmp_path / "peek").read_bytes() == bytes(32)
    assert keys.wipe_file(path) is False
