#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: state_disk
short_description: Format a node's LUKS2 state disk, re-key it to its derived disk key, map and mount it
version_added: 0.1.0
description:
  - Manages the node's state disk with the C(cryptsetup) command line tool. Keys reach C(cryptsetup) on standard input
    or in 0600 files in a 0700 directory on tmpfs (C(/dev/shm) or C(/run)), which are overwritten with zeros and removed
    afterwards; never on the command line.
  - A device without a LUKS header is formatted as LUKS2 (C(aes-xts-plain64), 512-bit key, 4096-byte sectors, C(argon2id))
    with exactly one keyslot, keyed with a random initial passphrase. A device that has a LUKS header is never reformatted,
    and a device that holds another signature (a filesystem, a partition table) is not formatted either.
  - The initial passphrase is a throw-away key. The disk key is derived from the disk's LUKS UUID (C(key-) + lower-case UUID,
    HKDF with the cluster's master secret), so the disk must exist before its key can; and the node receives that key only
    after it has proven its integrity. Until then the initial passphrase is kept in O(initial_key_path) under C(/run) (tmpfs,
    gone after a reboot) so that the re-key step can use it. The state disk holds no data before it is re-keyed.
  - Given the derived key, the module changes the only keyslot from the initial passphrase to that key (C(cryptsetup luksChangeKey)),
    so that there is still exactly one keyslot, and wipes the initial key file. A disk that opens with neither key is refused.
  - O(state=opened) and O(state=mounted) need device-mapper. On a host without it (such as a container that cannot create mappings) the module formats
    and re-keys the disk, then fails with a message that says so; O(state=formatted) needs no mapping.
  - The key is only known after attestation, so the mapping and mount are not written to C(/etc/crypttab) or C(/etc/fstab).
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
attributes:
  check_mode:
    support: full
    details:
      - In check mode nothing is formatted, re-keyed, mapped, made or mounted; the returned values describe the disk as it is.
      - In check mode a device without a LUKS header has no UUID yet, so O(uuid_only) returns none.
  diff_mode:
    support: N/A
    details:
      - A LUKS header has no useful textual difference to show.
  idempotent:
    support: full
requirements:
  - cryptsetup >= 2.1 (LUKS2) on the node (Debian package C(cryptsetup-bin))
  - blkid and mount (util-linux), and C(mkfs.<filesystem>) for O(state=mounted)
options:
  device:
    description:
      - The state disk, a block device (a regular file works for O(state=formatted)).
    type: path
    required: true
  state:
    description:
      - V(formatted) means a LUKS2 header exists and is keyed with the derived disk key.
      - V(opened) also maps the disk as C(/dev/mapper/<name>).
      - V(mounted) also makes a filesystem on first use, mounts it at O(mount_path), and keeps the node's cluster state on
        it - C(/etc/kubernetes), C(/var/lib/etcd), C(/var/lib/kubelet) and C(/var/lib/containerd), each at
        C(<mount_path>/<directory>), bind-mounted onto its usual place. On first use a directory's existing content is
        copied to the disk first; containerd and the kubelet are stopped while a directory moves and started again.
    type: str
    choices: [formatted, opened, mounted]
    default: formatted
  name:
    description: The device-mapper name of the opened disk, C(/dev/mapper/<name>).
    type: str
    default: state
  mount_path:
    description: Where O(state=mounted) mounts the filesystem; created with mode 0700 when missing.
    type: path
    default: /var/lib/confidential-kubernetes/state
  filesystem:
    description:
      - The filesystem that O(state=mounted) makes on a blank disk (with C(mkfs.<filesystem>)) and mounts.
      - An existing filesystem of another type is never replaced.
    type: str
    default: ext4
  disk_key:
    description:
      - The raw 32-byte disk key, base64-encoded, as derived for this disk's UUID.
      - Required, or O(disk_key_file), unless O(uuid_only=true).
    type: str
  disk_key_file:
    description:
      - A file on the node that holds exactly the raw 32 bytes of the disk key, with mode 0600. Alternative to O(disk_key).
    type: path
  uuid_only:
    description:
      - Only return the LUKS UUID, formatting the device first if it has no LUKS header. Needs no key.
      - This is how the key derivation gets the UUID before the key exists. Use with O(state=formatted).
    type: bool
    default: false
  allow_format:
    description:
      - Format a device that has no LUKS header. With V(false) such a device is an error.
      - A device that has a LUKS header is never reformatted, whatever this says.
    type: bool
    default: true
  initial_key_path:
    description:
      - Where the random initial passphrase is kept (mode 0600) between formatting and re-keying. It is wiped once the disk is re-keyed.
      - Defaults to C(/run/confidential-kubernetes/<name>-disk-initial.key). Keep it on tmpfs.
    type: path
  pbkdf_memory:
    description:
      - Argon2id memory cost in KiB for new keyslots (C(--pbkdf-memory)). Defaults to what cryptsetup benchmarks on the node.
      - Lower it only for small test nodes; it is the cost of guessing the key offline.
    type: int
  pbkdf_iterations:
    description:
      - Argon2id iterations for new keyslots (C(--pbkdf-force-iterations)), skipping cryptsetup's benchmark. Defaults to the benchmark.
      - Without O(pbkdf_memory), cryptsetup then uses its largest memory cost (1 GiB).
    type: int
notes:
  - The module runs on the node, as root.
seealso:
  - name: cryptsetup(8)
    description: The LUKS command line tool.
    link: https://man7.org/linux/man-pages/man8/cryptsetup.8.html
"""

EXAMPLES = r"""
- name: Format the state disk and learn its UUID (no key exists yet)
  confidential.kubernetes.state_disk:
    device: /dev/vdb
    uuid_only: true
  register: state_disk

# join_ticket and init_ticket re-key the disk themselves with the key derived for its UUID; by hand, the key is
# the raw 32 bytes in a 0600 file on the node.
- name: Re-key it to a key held in a file on the node, then map and mount it
  confidential.kubernetes.state_disk:
    device: /dev/vdb
    state: mounted
    disk_key_file: /run/confidential-kubernetes/state-disk.key

- name: A host without device-mapper, key in a file
  confidential.kubernetes.state_disk:
    device: /var/lib/confidential-kubernetes/state-disk.img
    state: formatted
    disk_key_file: /run/confidential-kubernetes/state-disk.key
"""

RETURN = r"""
uuid:
  description: The LUKS UUID, lower case (the input of the disk key derivation).
  returned: always; null in check mode when the device has no LUKS header yet
  type: str
  sample: 6f3b8b0e-1c2d-4e5f-8a9b-0c1d2e3f4a5b
keyslots:
  description: The number of active keyslots (1 once formatted).
  returned: always
  type: int
  sample: 1
keyed:
  description: Whether the given disk key opens the disk; null with O(uuid_only).
  returned: always
  type: bool
mapped:
  description: Whether the disk is mapped as C(/dev/mapper/<name>).
  returned: always
  type: bool
mapping_available:
  description: Whether this host has device-mapper.
  returned: always
  type: bool
mount_path:
  description: Where the filesystem is mounted; null when it is not mounted.
  returned: always
  type: str
  sample: /var/lib/confidential-kubernetes/state
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.confidential.kubernetes.plugins.module_utils._disk import StateDiskError
from ansible_collections.confidential.kubernetes.plugins.module_utils._disk.keys import (
    decode_disk_key,
    read_disk_key_file,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._disk.luks import (
    DEFAULT_FILESYSTEM,
    DEFAULT_MOUNT_PATH,
    DEFAULT_NAME,
    STATES,
    StateDisk,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            device=dict(type="path", required=True),
            state=dict(type="str", default="formatted", choices=list(STATES)),
            name=dict(type="str", default=DEFAULT_NAME),
            mount_path=dict(type="path", default=DEFAULT_MOUNT_PATH),
            filesystem=dict(type="str", default=DEFAULT_FILESYSTEM),
            disk_key=dict(type="str", no_log=True),
            # A path, not the key.
            disk_key_file=dict(type="path", no_log=False),
            uuid_only=dict(type="bool", default=False),
            allow_format=dict(type="bool", default=True),
            initial_key_path=dict(type="path", no_log=False),
            pbkdf_memory=dict(type="int"),
            pbkdf_iterations=dict(type="int"),
        ),
        mutually_exclusive=[("disk_key", "disk_key_file"), ("uuid_only", "disk_key"), ("uuid_only", "disk_key_file")],
        supports_check_mode=True,
    )
    params = module.params
    try:
        disk_key = None
        if params["disk_key"] is not None:
            disk_key = decode_disk_key(params["disk_key"])
        elif params["disk_key_file"] is not None:
            disk_key = read_disk_key_file(params["disk_key_file"])
        disk = StateDisk(
            params["device"],
            name=params["name"],
            mount_path=params["mount_path"],
            filesystem=params["filesystem"],
            initial_key_path=params["initial_key_path"],
            pbkdf_memory=params["pbkdf_memory"],
            pbkdf_iterations=params["pbkdf_iterations"],
            check_mode=module.check_mode,
        )
        result = disk.ensure(params["state"], disk_key, params["uuid_only"], params["allow_format"])
    except StateDiskError as exc:
        module.fail_json(msg=str(exc), **exc.result)
    except OSError as exc:
        module.fail_json(msg=f"state disk {params['device']}: {exc}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
