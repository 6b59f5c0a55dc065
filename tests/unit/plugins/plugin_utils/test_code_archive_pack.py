"""The collection's code as a deterministic archive: its bytes, and the same bytes as the GNU tar command it replaced."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from ansible_collections.confidential.kubernetes.plugins.plugin_utils import _code_archive

REPO = Path(__file__).resolve().parents[4]


def _gnu_tar() -> str | None:
    tar = shutil.which("tar")
    if tar is None:
        return None
    version = subprocess.run([tar, "--version"], capture_output=True, text=True, check=False).stdout
    return tar if "GNU tar" in version else None


@pytest.mark.skipif(_gnu_tar() is None, reason="needs GNU tar")
def test_the_archive_is_byte_for_byte_the_one_gnu_tar_packed(tmp_path):
    """The node role packed with this command before; a node that has its archive finds the new one current."""
    gnu = tmp_path / "gnu.tar"
    subprocess.run(
        [
            _gnu_tar(),
            "--create",
            "--sort=name",
            "--mtime=@0",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "--exclude=__pycache__",
            "--transform=s,^,ansible_collections/confidential/kubernetes/,",
            f"--file={gnu}",
            f"--directory={REPO}",
            "plugins/module_utils",
        ],
        check=True,
    )
    assert _code_archive.pack(str(REPO)) == gnu.read_bytes()


def _tree(root: Path) -> None:
    files = {
        "plugins/module_utils/b.py": (b"b = 1\n", 0o644),
        "plugins/module_utils/A.py": (b"A = 1\n", 0o644),
        "plugins/module_utils/_x/run.py": (b"#!/usr/bin/python3\n", 0o755),
        "plugins/module_utils/_x/__pycache__/run.cpython-311.pyc": (b"bytecode", 0o644),
        "plugins/module_utils/__pycache__/b.cpython-311.pyc": (b"bytecode", 0o644),
        "plugins/modules/other.py": (b"not packed\n", 0o644),
    }
    for name, (content, mode) in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content)
        (root / name).chmod(mode)
        os.utime(root / name, (1_700_000_000, 1_700_000_000))


def test_the_archive_holds_the_tree_in_name_order_without_times_owners_or_bytecode(tmp_path):
    _tree(tmp_path)
    data = _code_archive.pack(str(tmp_path))
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        members = archive.getmembers()
        prefix = "ansible_collections/confidential/kubernetes/plugins/module_utils"
        assert [m.name for m in members] == [
            prefix,
            f"{prefix}/A.py",
            f"{prefix}/_x",
            f"{prefix}/_x/run.py",
            f"{prefix}/b.py",
        ]
        assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, 0, "", "")}
        assert archive.getmember(f"{prefix}/_x/run.py").mode == 0o755
        assert archive.extractfile(f"{prefix}/b.py").read() == b"b = 1\n"


def test_the_same_code_packs_to_the_same_bytes_and_other_code_to_others(tmp_path):
    _tree(tmp_path)
    first = _code_archive.pack(str(tmp_path))
    os.utime(tmp_path / "plugins/module_utils/b.py", (1_800_000_000, 1_800_000_000))
    (tmp_path / "plugins/module_utils/_x/__pycache__/new.pyc").write_bytes(b"more bytecode")
    assert _code_archive.pack(str(tmp_path)) == first
    (tmp_path / "plugins/module_utils/b.py").write_bytes(b"b = 2\n")
    assert hashlib.sha256(_code_archive.pack(str(tmp_path))).digest() != hashlib.sha256(first).digest()
