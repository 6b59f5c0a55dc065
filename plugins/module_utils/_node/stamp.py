# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The stamp of an installed node stack: each file's sha256 in sha256sum's format, so that ``sha256sum --check`` reads
it, and before it a ``#stat`` line (a comment to sha256sum) with the file's mode and fingerprint when it was hashed.

A file whose fingerprint is still the recorded one is taken as verified without reading it (see ``_files.Fingerprint``
for what that trusts); any other file is hashed, and so is every file of a stamp without ``#stat`` lines (written by
an older version). A file must have its recorded mode as well.

Two more comment lines record what has no content to hash: ``#dir`` a directory and its mode, ``#absent`` a path that
must not exist (a file an install removes). The stamp of a directory and its files verifies only while the directory
still has that mode, and only while no ``#absent`` path exists.
"""

from __future__ import annotations

import os
import re
import stat

from . import NodeStateError
from .._files import FileDigest, Fingerprint, file_digest, wait_until_settled

# One line of a stamp, in sha256sum's format (text or binary marker).
STAMP_LINE = re.compile(r"^([0-9a-f]{64}) [ *](.+)$")
# What a stamp records of the file named: its mode (octal) and fingerprint (inode, size, mtime_ns, ctime_ns).
STAT_LINE = re.compile(r"^#stat ([0-7]{4}) ([0-9]+ [0-9]+ [0-9]+ [0-9]+) (.+)$")
# A directory the stamp records (its mode, octal), and a path that must not exist.
DIR_LINE = re.compile(r"^#dir ([0-7]{4}) (.+)$")
ABSENT_LINE = re.compile(r"^#absent (.+)$")
HEADER = (
    "# The sha256 of each installed file, as sha256sum --check reads it. A #stat line before a file has its mode and\n"
    "# fingerprint (inode size mtime_ns ctime_ns) when it was hashed; while both hold, the file is not read again.\n"
)


class UnreadableFile(NodeStateError):
    """A file to stamp cannot be read (in check mode, an install that has not run yet)."""


def verifies(path: str) -> bool:
    """Whether every file a stamp lists has the sha256 (and, where recorded, the mode) it records; stops at the first miss."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return False
    recorded: dict[str, tuple[int, Fingerprint | None]] = {}
    entries = []
    directories: list[tuple[int, str]] = []
    absent: list[str] = []
    for line in lines:
        stat_line, dir_line, absent_line = STAT_LINE.match(line), DIR_LINE.match(line), ABSENT_LINE.match(line)
        if stat_line:
            recorded[stat_line.group(3)] = (int(stat_line.group(1), 8), Fingerprint.parse(stat_line.group(2)))
        elif dir_line:
            directories.append((int(dir_line.group(1), 8), dir_line.group(2)))
        elif absent_line:
            absent.append(absent_line.group(1))
        elif not line.startswith("#"):
            entry = STAMP_LINE.match(line)
            if entry is None:
                return False
            entries.append((entry.group(1), entry.group(2)))
    return (
        bool(entries)
        and all(_directory_verifies(mode, name) for mode, name in directories)
        and not any(os.path.lexists(name) for name in absent)
        and all(_file_verifies(sha256, name, recorded.get(name)) for sha256, name in entries)
    )


def _directory_verifies(mode: int, path: str) -> bool:
    try:
        found = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(found.st_mode) and stat.S_IMODE(found.st_mode) == mode


def _file_verifies(sha256: str, path: str, recorded: tuple[int, Fingerprint | None] | None) -> bool:
    try:
        found = file_digest(path, FileDigest(sha256, *recorded) if recorded else None)
    except OSError:
        return False
    return found.sha256 == sha256 and (recorded is None or found.mode == recorded[0])


def text(paths: list[str], settle: bool = True, absent: tuple[str, ...] = ()) -> str:
    """The stamp of ``paths`` (a directory among them is recorded with its mode) and of the ``absent`` paths, which
    must not exist. With ``settle``, first waits until every file's fingerprint can be trusted (at most a second), so
    that a stamp written right after an install fingerprints every file; a file that is still too new, or that changes
    while it is read, gets no ``#stat`` line."""
    directories = [path for path in paths if os.path.isdir(path) and not os.path.islink(path)]
    files = [path for path in paths if path not in directories]
    if not files:
        raise NodeStateError("a stamp of no files never verifies; name the installed files")
    unfit = [path for path in [*paths, *absent] if "\n" in path or "\\" in path]
    if unfit:
        raise NodeStateError(
            f"cannot stamp {unfit[0]!r}: sha256sum's format holds no newline or backslash in a file name"
        )
    present = [path for path in absent if os.path.lexists(path)]
    if present:
        raise UnreadableFile(f"cannot stamp {present[0]} as absent: it exists")
    if settle:
        wait_until_settled(files)
    lines = [HEADER]
    lines += [f"#dir {stat.S_IMODE(os.lstat(path).st_mode):04o} {path}\n" for path in directories]
    lines += [f"#absent {path}\n" for path in absent]
    for path in files:
        try:
            digest = file_digest(path)
        except OSError as exc:
            raise UnreadableFile(f"cannot stamp {path}: {exc.strerror or exc}") from None
        if digest.fingerprint is not None:
            lines.append(f"#stat {digest.mode:04o} {digest.fingerprint} {path}\n")
        lines.append(f"{digest.sha256}  {path}\n")
    return "".join(lines)
