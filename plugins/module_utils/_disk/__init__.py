# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node's LUKS2 state disk (DESIGN sections 1 and 2), behind the state_disk module.

Owns: formatting the state disk, re-keying it to the disk key the cluster derives
for it, and mapping and mounting it where the host has device-mapper.

Protocol, in the order a node runs it:

1. ``uuid_only``: a device without a LUKS header is formatted (LUKS2,
   aes-xts-plain64, 512-bit key, 4096-byte sectors, argon2id, one keyslot) with
   a random initial passphrase, kept in a 0600 file under ``/run``. The LUKS UUID
   is returned; no cluster key exists yet, because the key is derived from it.
2. The controller or the join service derives ``HKDF(master key, salt,
   "key-" + uuid)`` once the node has proven its integrity.
3. With that key, the only keyslot is changed from the initial passphrase to the
   derived key, and the initial key file is wiped: it never opens the disk again.
4. ``opened``/``mounted`` map the disk as ``/dev/mapper/<name>``, make a
   filesystem on first use, and mount it.

All cryptsetup calls go through ``StateDisk._run_command`` (argument lists only);
keys reach cryptsetup on stdin or in 0600 files in a 0700 directory on tmpfs.
"""

from __future__ import annotations

import os
import shutil

# Where system tools live when PATH (a systemd unit's, a minimal environment's) lacks them.
SYSTEM_BIN_DIRS = ("/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin")


def find_binary(name: str) -> str | None:
    """The path of the tool ``name`` on PATH or in the system's bin directories; None when the host lacks it."""
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), *SYSTEM_BIN_DIRS]))


class StateDiskError(RuntimeError):
    """The state disk cannot be brought to the requested state; the message says what to do.

    ``result`` carries what is known about the disk at the time of the failure
    (for example that it was formatted and keyed before mapping failed).
    """

    def __init__(self, message: str, result: dict | None = None):
        super().__init__(message)
        self.result = result or {}
