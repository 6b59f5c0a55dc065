# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""This collection's code as a deterministic tar archive, packed in the controller's process.

The same tree gives the same bytes on every controller, so that a node compares one sha256 to know whether its copy
is current: members in name order, each directory before its content; modification time 0, owner and group 0 with
no names; no ``__pycache__``; every name under ``ansible_collections/confidential/kubernetes/``. For names up to 100
bytes these are the bytes of GNU tar ``--format=gnu --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner
--exclude=__pycache__`` with that prefix (what the role ran before).
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterator

COLLECTION_ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
# What the programs that run on a node without Ansible import, and where they find it on PYTHONPATH.
TREE = "plugins/module_utils"
PREFIX = "ansible_collections/confidential/kubernetes/"
SKIPPED = "__pycache__"


def pack(root: str = COLLECTION_ROOT, tree: str = TREE, prefix: str = PREFIX) -> bytes:
    """The archive of ``root``/``tree`` with each name under ``prefix``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for name in _names(root, tree):
            path = os.path.join(root, name)
            member = archive.gettarinfo(path, prefix + name)
            if member is None:  # a socket: tar leaves it out as well
                continue
            member.mtime, member.uid, member.gid, member.uname, member.gname = 0, 0, 0, "", ""
            if member.isreg():
                with open(path, "rb") as content:
                    archive.addfile(member, content)
            else:
                archive.addfile(member)
    return buffer.getvalue()


def _names(root: str, name: str) -> Iterator[str]:
    """``name`` and, for a directory, everything under it: depth first, each directory's entries in name order."""
    yield name
    path = os.path.join(root, name)
    if os.path.isdir(path) and not os.path.islink(path):
        for entry in sorted(os.listdir(path)):
            if entry != SKIPPED:
                yield from _names(root, f"{name}/{entry}")
