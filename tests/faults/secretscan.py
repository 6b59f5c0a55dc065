# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Search files and streams for the cluster's secrets; report where, never what.

Used by tests/faults/run on the controller (the lab dir, the nodes' overlay upper
dirs, Ansible output, journals, console logs) and on the nodes for their tmpfs
mounts: copied to /run/ck-fault/ and run there with the needles (hex) as JSON on
stdin, so no secret ever appears on a command line.

A secret is searched in every encoding a leak would take: raw bytes, hex (lower and
upper), base64 (standard and URL-safe, with and without padding, at each of the three
alignments it can have inside a longer base64 text). PEM private keys are searched by
the lines of their base64 body and by the base64 of the whole PEM.

Rule (documented in tests/faults/README.md): a file that holds a secret must be a
regular file of mode 0600 or 0400 (no group or other bits); anything else is a hit.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import sys

MAX_FILE = 64 * 1024 * 1024


def encodings(value: bytes) -> list[bytes]:
    """Every form of ``value`` worth searching for (each at least 16 bytes long)."""
    forms = {value, value.hex().encode(), value.hex().upper().encode()}
    for shift in range(3):
        part = value[shift:]
        for encoded in (base64.b64encode(part), base64.urlsafe_b64encode(part)):
            # The last 4 characters depend on what follows the secret in a longer text.
            core = encoded.rstrip(b"=")[:-4] if shift or len(part) % 3 else encoded
            if len(core) >= 16:
                forms.add(core)
    return sorted(forms)


def pem_needles(pem: bytes) -> list[bytes]:
    """The body lines of a PEM private key (each is unique to the key) and the base64 of the whole PEM."""
    lines = [line.strip() for line in pem.splitlines() if line.strip() and not line.startswith(b"-----")]
    needles = {line for line in lines[1:] if len(line) >= 40}
    if not needles and lines:
        needles.add(lines[0])
    for shift in range(3):
        encoded = base64.b64encode(pem[shift:]).rstrip(b"=")[4:-4]
        if len(encoded) >= 16:
            needles.add(encoded)
    return sorted(needles)


class Scanner:
    def __init__(self, secrets: dict[str, list[bytes]]):
        self.secrets = secrets
        self.files = 0
        self.streams = 0
        self.bytes = 0
        self.hits: list[dict] = []
        self.protected: list[dict] = []

    def search(self, data: bytes) -> list[str]:
        return sorted(name for name, needles in self.secrets.items() if any(needle in data for needle in needles))

    def stream(self, label: str, data: bytes) -> None:
        self.streams += 1
        self.bytes += len(data)
        for name in self.search(data):
            self.hits.append({"where": label, "secret": name})

    def tree(self, root: str, shown_as: str, skip: tuple[str, ...] = ()) -> None:
        """Walk ``root``; a file is shown (and matched against ``skip``) as ``shown_as`` + its path below ``root``."""
        root = root.rstrip("/") or "/"
        for directory, dirnames, filenames in os.walk(root):
            shown_dir = (shown_as.rstrip("/") + directory[len(root) :]) or "/"
            dirnames[:] = [d for d in dirnames if not _skipped(os.path.join(shown_dir, d), skip)]
            for filename in filenames:
                shown = os.path.join(shown_dir, filename)
                if not _skipped(shown, skip):
                    self.file(os.path.join(directory, filename), shown)

    def file(self, path: str, shown: str) -> None:
        try:
            info = os.lstat(path)
        except OSError:
            return
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_FILE:
            return
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except OSError:
            return
        self.files += 1
        self.bytes += len(data)
        found = self.search(data)
        mode = stat.S_IMODE(info.st_mode)
        for name in found:
            entry = {"where": shown, "secret": name, "mode": f"{mode:04o}"}
            (self.protected if mode & 0o077 == 0 else self.hits).append(entry)

    def report(self) -> dict:
        return {
            "files": self.files,
            "streams": self.streams,
            "bytes": self.bytes,
            "hits": self.hits,
            "protected": self.protected,
        }


def _skipped(shown: str, skip: tuple[str, ...]) -> bool:
    return any(shown == prefix or shown.startswith(prefix.rstrip("/") + "/") for prefix in skip)


def needles_from_hex(document: dict) -> dict[str, list[bytes]]:
    return {name: [bytes.fromhex(needle) for needle in needles] for name, needles in document.items()}


def needles_to_hex(secrets: dict[str, list[bytes]]) -> dict:
    return {name: [needle.hex() for needle in needles] for name, needles in secrets.items()}


def main() -> int:
    """On a node: stdin {"secrets": {name: [hex needle]}, "roots": [...], "skip": [...]}; stdout the report (JSON)."""
    request = json.load(sys.stdin)
    scanner = Scanner(needles_from_hex(request["secrets"]))
    skip = tuple(request.get("skip", ()))
    for root in request["roots"]:
        if os.path.isdir(root):
            scanner.tree(root, root, skip)
    sys.stdout.write(json.dumps(scanner.report()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
