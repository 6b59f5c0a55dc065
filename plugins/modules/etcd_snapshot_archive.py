#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: etcd_snapshot_archive
short_description: The controller's encrypted etcd snapshots - store one with its manifest, or choose and check one
version_added: 0.2.0
description:
  - Snapshots live beside the inventory in O(backup_dir) as C(etcd-<UTC time>/etcd.cksnap) (mode 0600) with
    C(manifest.json) (cluster ID, time, etcd revision, member, size, SHA-256 of the ciphertext). The time, revision,
    member and cluster ID are authenticated in the snapshot's header (format 2); C(manifest.json) is their readable
    copy and must agree with it. A directory is a snapshot only when its header authenticates with this cluster's key
    and its name is the authenticated time (format in C(plugins/module_utils/_backup/README.md)).
  - With O(state=stored), checks that the file O(fetched) is the one the node wrote (size and SHA-256 from
    O(manifest)) and that O(manifest) is what its authenticated header says, files it as
    C(<name>/etcd.cksnap) under the name its header authenticates, writes C(manifest.json), and removes all but the
    newest O(keep) authenticated snapshots of this cluster; nothing else is removed. A refused file stays where it
    was fetched.
  - With O(state=verified), chooses the snapshot O(snapshot) (V(latest) is the newest authenticated one, or a name
    C(etcd-<time>) or a directory path) and checks it against the cluster's root secrets without writing any
    plaintext - that it belongs to this cluster, every authenticated chunk (a truncated file, reordered or swapped
    chunks or a flipped byte are each refused with their own message), its name and manifest against the header, its
    size and SHA-256 - and refuses one older than the newest authenticated snapshot, or one of format 1, unless
    O(allow_older).
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
  - confidential.kubernetes._root_secrets
  - confidential.kubernetes._attributes.action
attributes:
  check_mode:
    support: full
    details:
      - O(state=verified) changes nothing; O(state=stored) writes and prunes nothing in check mode.
  diff_mode:
    support: none
  idempotent:
    support: partial
    details:
      - O(state=verified) never changes anything; O(state=stored) rewrites the manifest of a new snapshot.
options:
  state:
    description: V(stored) files a fetched snapshot; V(verified) chooses and checks one for a restore.
    type: str
    choices: [stored, verified]
    default: verified
  backup_dir:
    description: The controller's snapshot directory, C(backups/) beside the inventory in the playbooks.
    type: path
    required: true
  snapshot:
    description: With O(state=verified), V(latest), a snapshot name C(etcd-<YYYYmmddTHHMMSSZ>) or a snapshot
      directory's path.
    type: str
    default: latest
  fetched:
    description: With O(state=stored), the encrypted snapshot as fetched from the node to the controller.
    type: path
  manifest:
    description:
      - With O(state=stored), what the node reported (M(confidential.kubernetes.etcd_snapshot)'s result plus
        C(time) and C(member)).
    type: dict
  keep:
    description: With O(state=stored), how many snapshots to keep (the newest).
    type: int
    default: 7
  allow_older:
    description:
      - With O(state=verified), accept a snapshot older than the newest authenticated one in O(backup_dir), or one
        of format 1 (its time is not authenticated).
    type: bool
    default: false
seealso:
  - module: confidential.kubernetes.etcd_snapshot
  - module: confidential.kubernetes.etcd_restore
"""

EXAMPLES = r"""
- name: Choose and check the newest snapshot
  confidential.kubernetes.etcd_snapshot_archive:
    backup_dir: "{{ inventory_dir }}/backups"
    snapshot: latest
    secrets_file: "{{ inventory_dir }}/secrets/cluster-secrets.json"
  register: chosen
"""

RETURN = r"""
snapshot:
  description:
    - With O(state=verified), the checked snapshot's manifest plus C(path), C(directory), C(authenticated) (false for
      format 1), C(older) (why it is older, when O(allow_older) let it through), C(newest) and C(unauthenticated) (the
      directories named like snapshots that do not authenticate, each with why).
  returned: state=verified, success
  type: dict
manifest:
  description: With O(state=stored), the manifest written.
  returned: state=stored, not in check mode
  type: dict
path:
  description: With O(state=stored), the stored encrypted snapshot.
  returned: state=stored, not in check mode
  type: str
pruned:
  description: With O(state=stored), the snapshot directories removed (older than the newest O(keep)).
  returned: state=stored, not in check mode
  type: list
  elements: str
kept:
  description: With O(state=stored), the snapshot directories kept, oldest first.
  returned: state=stored, not in check mode
  type: list
  elements: str
format1:
  description: With O(state=stored), format-1 snapshots left alone (their time is not authenticated).
  returned: state=stored, not in check mode
  type: list
  elements: str
unauthenticated:
  description: With O(state=stored), directories named like snapshots that do not authenticate (left alone), each with why.
  returned: state=stored, not in check mode
  type: dict
refused:
  description: When a snapshot is refused, the kind of fault (C(WrongClusterError), C(TruncatedError), ...).
  returned: failure
  type: str
"""
