#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: etcd_snapshot
short_description: Take an etcd snapshot on a control plane and encrypt it there, before it leaves the node
version_added: 0.2.0
description:
  - With O(state=saved), checks that the member is healthy, runs C(etcdctl snapshot save) into O(work_dir), checks the
    file with C(etcdctl snapshot status) (its revision), and encrypts it to O(dest) with the cluster's snapshot key
    (AES-256-GCM in authenticated chunks, format in C(plugins/module_utils/_backup/README.md)). The plaintext is
    deleted whatever happens; only O(dest) (mode 0600, created new) remains.
  - With O(state=healthy), only checks that the member serves (a quorum read through it) and reports its member list.
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
  - confidential.kubernetes._etcd
attributes:
  check_mode:
    support: full
    details:
      - In check mode O(state=saved) checks the member's health and takes no snapshot.
  diff_mode:
    support: none
  idempotent:
    support: none
    details:
      - Every run with O(state=saved) takes a new snapshot.
options:
  state:
    description: V(saved) takes an encrypted snapshot; V(healthy) only checks the member.
    type: str
    choices: [saved, healthy]
    default: saved
  dest:
    description: The encrypted snapshot to write on the node; it must not exist. Required with O(state=saved).
    type: path
  chunk_size:
    description: Plaintext bytes per authenticated chunk.
    type: int
    default: 1048576
  name:
    description:
      - The snapshot's name C(etcd-<YYYYmmddTHHMMSSZ>) (its UTC time), authenticated in the file's header with the
        revision and O(member). Default the current time.
    type: str
  member:
    description: This member's name, authenticated in the header (default the host name; the backup role passes the
      inventory name).
    type: str
seealso:
  - module: confidential.kubernetes.etcd_restore
"""

EXAMPLES = r"""
- name: Encrypted snapshot of etcd
  confidential.kubernetes.etcd_snapshot:
    dest: /run/confidential-kubernetes/etcd-20261126T090000Z.cksnap
  register: snapshot
"""

RETURN = r"""
manifest:
  description:
    - The snapshot's manifest, as C(manifest.json) holds it (C(name), C(time), C(revision), C(member), C(cluster_id),
      C(size), C(sha256), C(snapshot_size), C(total_keys), C(etcd_hash), C(format), C(version)); every field but the
      file's size and SHA-256 is authenticated in its header.
  returned: state=saved, not in check mode
  type: dict
cluster_id:
  description: The cluster ID the snapshot is bound to (hex).
  returned: state=saved, not in check mode
  type: str
revision:
  description: The etcd revision the snapshot holds.
  returned: state=saved, not in check mode
  type: int
total_keys:
  description: The keys in the snapshot.
  returned: state=saved, not in check mode
  type: int
snapshot_size:
  description: The plaintext snapshot's size in bytes.
  returned: state=saved, not in check mode
  type: int
size:
  description: The encrypted file's size in bytes.
  returned: state=saved, not in check mode
  type: int
sha256:
  description: The SHA-256 of the encrypted file (hex).
  returned: state=saved, not in check mode
  type: str
save_seconds:
  description: Seconds C(etcdctl snapshot save) took.
  returned: state=saved, not in check mode
  type: float
encrypt_seconds:
  description: Seconds the status check and the encryption took.
  returned: state=saved, not in check mode
  type: float
members:
  description: The etcd members (name, peer and client URLs) as this member sees them.
  returned: success
  type: list
  elements: dict
"""

import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.confidential.kubernetes.plugins.module_utils._backup.etcd import (
    EtcdError,
    Etcdctl,
    take_snapshot,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._backup.manifest import ManifestError
from ansible_collections.confidential.kubernetes.plugins.module_utils._backup.module import etcd_argument_spec, etcdctl
from ansible_collections.confidential.kubernetes.plugins.module_utils._backup.snapshot import SnapshotError
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.config import ConfigError, load_root_secrets

try:
    import cryptography  # noqa: F401 pylint: disable=unused-import
except ImportError:
    CRYPTOGRAPHY_ERROR: str | None = traceback.format_exc()
else:
    CRYPTOGRAPHY_ERROR = None


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            etcd_argument_spec(),
            state=dict(type="str", default="saved", choices=["saved", "healthy"]),
            dest=dict(type="path"),
            chunk_size=dict(type="int", default=1 << 20),
            name=dict(type="str"),
            member=dict(type="str"),
        ),
        required_if=[("state", "saved", ("dest",))],
        supports_check_mode=True,
    )
    if CRYPTOGRAPHY_ERROR:
        module.fail_json(msg=missing_required_lib("cryptography"), exception=CRYPTOGRAPHY_ERROR)
    params = module.params
    client: Etcdctl = etcdctl(module)
    try:
        client.health()
        members = client.members()
        if params["state"] == "healthy" or module.check_mode:
            module.exit_json(changed=params["state"] == "saved", members=members)
        secrets = load_root_secrets(params["secrets_file"])
        result = take_snapshot(
            client,
            secrets,
            params["work_dir"],
            params["dest"],
            params["chunk_size"],
            params["name"],
            params["member"],
        )
    except (EtcdError, ConfigError, SnapshotError, ManifestError) as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:
        module.fail_json(msg=f"etcd snapshot to {params['dest']}: {exc.strerror}: {exc.filename}")
    module.exit_json(changed=True, members=members, **result)


if __name__ == "__main__":
    main()
