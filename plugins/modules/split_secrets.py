#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: split_secrets
short_description: Split the cluster's root secrets into k-of-n break-glass shares, or remove the plain file (controller)
version_added: 0.2.0
description:
  - With O(state=split), splits the root secrets in O(secrets_file) (master key, master salt, measurement salt) with
    Shamir's secret sharing over GF(2^128) (pycryptodome's field and evaluation, each 16-byte block on its own
    polynomial) into O(count) shares of which any O(threshold) reconstruct them, and fewer reveal nothing. Writes
    C(share-<i>-of-<n>.txt) (0600, created exclusively, never over an existing share) into O(share_dir), then reads
    them back and checks that they reconstruct the secrets.
  - Each share file is one line C(ck-share-v1.<cluster ID>.<k>.<n>.<index>.<value>.<MAC>.<checksum>) with comments. The
    checksum names a damaged share and the cluster ID a share of another cluster before anything is combined; the MAC
    (keyed from the secrets) is checked once they are reconstructed, in memory.
  - With O(state=plain_removed) and O(confirm) set to the cluster ID, checks that O(share_files) reconstruct the very
    secrets of O(secrets_file), then replaces that file by a marker with no secret in it (so C(init.yml) never creates
    new secrets there, and every playbook that needs them says they were split). Blocks of the old file may remain on
    the disk until overwritten; see the custody page of the docs.
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
  - confidential.kubernetes._attributes.action
attributes:
  check_mode:
    support: full
    details:
      - Writes and removes nothing in check mode.
  diff_mode:
    support: none
  idempotent:
    support: none
    details:
      - Every split draws new polynomials; a second split into the same O(share_dir) is refused.
options:
  state:
    description: V(split) writes the share files; V(plain_removed) removes the plain secrets file once split.
    type: str
    choices: [split, plain_removed]
    default: split
  secrets_file:
    description: The cluster's root secrets file on the controller (0600, ansible-vault aware). A path, not a secret.
    type: path
    required: true
  split_from_share_files:
    description:
      - With O(state=split), re-split - k share files of the current split, reconstructed in memory, instead of
        O(secrets_file) (which may then be the marker of an earlier split). Nothing plain is written.
    type: list
    elements: path
    default: []
  split_from_shares:
    description: With O(state=split), share lines added to O(split_from_share_files) (as typed at the prompt).
    type: list
    elements: str
    default: []
  share_dir:
    description: With O(state=split), the directory (created 0700) the share files are written to.
    type: path
  threshold:
    description: k, how many shares reconstruct the secrets (2 or more).
    type: int
    default: 3
  count:
    description: n, how many shares are written (k to 255).
    type: int
    default: 5
  share_files:
    description: With O(state=plain_removed), k or more share files that must reconstruct the secrets first.
    type: list
    elements: path
    default: []
  confirm:
    description: With O(state=plain_removed), the cluster ID (64 hex characters); anything else is refused.
    type: str
    default: ""
seealso:
  - module: confidential.kubernetes.recover_secrets
  - module: confidential.kubernetes.etcd_snapshot_archive
"""

EXAMPLES = r"""
- name: Split the root secrets 3-of-5
  confidential.kubernetes.split_secrets:
    secrets_file: "{{ inventory_dir }}/secrets/cluster-secrets.json"
    share_dir: "{{ inventory_dir }}/shares"
    threshold: 3
    count: 5
  register: split
"""

RETURN = r"""
cluster_id:
  description: The cluster ID (hex) the shares carry.
  returned: success
  type: str
share_files:
  description: With O(state=split), the share files written (or, in check mode, that would be).
  returned: success and O(state=split)
  type: list
  elements: str
threshold:
  description: With O(state=split), k.
  returned: success and O(state=split)
  type: int
removed:
  description: With O(state=plain_removed), the secrets file replaced by the marker.
  returned: success and O(state=plain_removed)
  type: str
"""
