"""module_utils._files: atomic replace, exclusive create and bounded reads, each named after what it pins."""

from __future__ import annotations

import os
import stat

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils import _files
from ansible_collections.confidential.kubernetes.plugins.module_utils._files import (
    backup_copy,
    FileTooLargeError,
    create_file_exclusively,
    read_bounded,
    read_bounded_from,
    write_file_atomically,
    write_private_file,
)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _full_disk(monkeypatch, calls: list):
    """os.fsync fails as a full disk does; ``calls`` records what was synced (file or directory)."""

    def failing_fsync(fd):
        calls.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_files.os, "fsync", failing_fsync)


def test_atomic_replace_writes_content_and_mode(tmp_path):
    path = tmp_path / "new" / "config.yaml"
    write_file_atomically(str(path), b"v: 1\n", 0o644)
    assert path.read_bytes() == b"v: 1\n"
    assert _mode(path) == 0o644
    assert _mode(path.parent) == 0o700
    write_file_atomically(str(path), b"v: 2\n", 0o640)
    assert path.read_bytes() == b"v: 2\n" and _mode(path) == 0o640
    assert os.listdir(path.parent) == ["config.yaml"]


def test_atomic_replace_leaves_the_old_content_when_the_write_fails_midway(tmp_path, monkeypatch):
    path = tmp_path / "config.yaml"
    path.write_bytes(b"old\n")
    synced = []
    _full_disk(monkeypatch, synced)
    with pytest.raises(OSError, match="No space left"):
        write_file_atomically(str(path), b"new\n", 0o600)
    monkeypatch.undo()
    assert synced == [False]
    assert path.read_bytes() == b"old\n"
    assert os.listdir(tmp_path) == ["config.yaml"]


def test_atomic_replace_and_exclusive_create_sync_the_directory(tmp_path, monkeypatch):
    synced = []
    real = os.fsync

    def recording_fsync(fd):
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real(fd)

    monkeypatch.setattr(_files.os, "fsync", recording_fsync)
    write_file_atomically(str(tmp_path / "a"), b"a", 0o600)
    create_file_exclusively(str(tmp_path / "b"), b"b")
    assert synced == [False, True, False, True]


def test_private_file_and_exclusive_create_are_0600_by_default_whatever_the_umask(tmp_path):
    previous = os.umask(0)
    try:
        write_private_file(str(tmp_path / "key"), b"k")
        create_file_exclusively(str(tmp_path / "secrets.json"), b"{}")
    finally:
        os.umask(previous)
    assert _mode(tmp_path / "key") == 0o600
    assert _mode(tmp_path / "secrets.json") == 0o600


def test_exclusive_create_refuses_an_existing_file_and_keeps_it(tmp_path):
    path = tmp_path / "secrets.json"
    path.write_bytes(b"first\n")
    with pytest.raises(FileExistsError):
        create_file_exclusively(str(path), b"second\n")
    assert path.read_bytes() == b"first\n"
    assert os.listdir(tmp_path) == ["secrets.json"]


def test_exclusive_create_leaves_no_file_when_the_write_fails_midway(tmp_path, monkeypatch):
    path = tmp_path / "state" / "nodelock.json"
    _full_disk(monkeypatch, [])
    with pytest.raises(OSError, match="No space left"):
        create_file_exclusively(str(path), b"record")
    monkeypatch.undo()
    assert os.listdir(path.parent) == []
    create_file_exclusively(str(path), b"record", 0o640)
    assert path.read_bytes() == b"record" and _mode(path) == 0o640


@pytest.mark.parametrize("size", [0, 1, 16])
def test_bounded_read_returns_up_to_the_limit(tmp_path, size):
    path = tmp_path / "policy.json"
    path.write_bytes(b"x" * size)
    assert read_bounded(str(path), 16) == b"x" * size


def test_bounded_read_refuses_one_byte_more_naming_the_file(tmp_path):
    path = tmp_path / "policy.json"
    path.write_bytes(b"x" * 17)
    with pytest.raises(FileTooLargeError, match=f"^{path} is larger than 16 bytes$") as refused:
        read_bounded(str(path), 16)
    assert (refused.value.path, refused.value.limit) == (str(path), 16)


def test_bounded_read_from_an_open_file_reads_the_rest_only(tmp_path):
    path = tmp_path / "key"
    path.write_bytes(b"head" + b"y" * 8)
    with open(path, "rb") as handle:
        handle.read(4)
        assert read_bounded_from(handle, str(path), 8) == b"y" * 8
    with open(path, "rb") as handle:
        with pytest.raises(FileTooLargeError, match="is larger than 11 bytes"):
            read_bounded_from(handle, str(path), 11)


def test_bounded_read_passes_os_errors_on(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_bounded(str(tmp_path / "absent"), 16)


def test_a_backup_is_a_copy_beside_the_file_with_its_mode_and_never_replaces_one(tmp_path, monkeypatch):
    path = tmp_path / "measurement-policy.yml"
    path.write_bytes(b"pcrs: {}\n")
    path.chmod(0o640)
    backup = backup_copy(str(path))
    assert backup.startswith(f"{path}.{os.getpid()}.") and backup.endswith("~")
    assert open(backup, "rb").read() == b"pcrs: {}\n"
    assert stat.S_IMODE(os.stat(backup).st_mode) == 0o640
    # No process: Ansible's backup forks lsattr and chattr and fails the task when one of them does.
    monkeypatch.setattr(os, "fork", lambda: pytest.fail("backup_copy started a process"))
    monkeypatch.setattr(_files.time, "strftime", lambda fmt: "same-second")
    first = backup_copy(str(path))
    path.write_bytes(b"changed\n")
    with pytest.raises(FileExistsError):
        backup_copy(str(path))
    assert open(first, "rb").read() == b"pcrs: {}\n"
