#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: etcd_restore
short_description: Authenticate an encrypted etcd snapshot on a control plane and restore it into a fresh data directory
version_added: 0.2.0
description:
  - Authenticates every chunk of O(src) with the cluster's snapshot key and refuses another cluster's snapshot, a
    truncated one, reordered or swapped chunks and altered bytes, each with its own message, before anything is
    written outside O(work_dir).
  - Then decrypts it into O(work_dir), checks it with C(etcdctl snapshot status) (and its revision against
    O(expected_revision)), and runs C(etcdctl snapshot restore) into O(data_dir), which must not exist, as member
    O(member_name) of the new cluster O(initial_cluster) with the new O(initial_cluster_token). The plaintext is deleted
    whatever happens.
  - It does not stop or start etcd; the restore role moves the static pods out and the new data directory in.
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
  - confidential.kubernetes._etcd
attributes:
  check_mode:
    support: full
    details:
      - In check mode the snapshot is only authenticated (no plaintext is written) and nothing is restored.
  diff_mode:
    support: none
  idempotent:
    support: none
    details:
      - O(data_dir) must not exist, so a second run fails rather than restoring over a restored member.
options:
  src:
    description: The encrypted snapshot on the node.
    type: path
    required: true
  member_name:
    description: This member's name (kubeadm's static pod C(--name), the node name).
    type: str
  peer_urls:
    description: This member's peer URLs (the static pod's C(--initial-advertise-peer-urls)).
    type: str
  initial_cluster:
    description: Every member of the restored cluster, C(name=peer URL,...); the same on every member.
    type: str
  initial_cluster_token:
    description: A new cluster token, the same on every member, so the restored members never talk to old ones.
    type: str
  data_dir:
    description: The fresh data directory to restore into.
    type: path
  expected_revision:
    description: The revision the snapshot's manifest records; a snapshot holding another one is refused.
    type: int
seealso:
  - module: confidential.kubernetes.etcd_snapshot
"""

EXAMPLES = r"""
- name: Restore the snapshot as member cp-0 of a three-member cluster
  confidential.kubernetes.etcd_restore:
    src: /run/confidential-kubernetes/etcd-restore/etcd.cksnap
    member_name: cp-0
    peer_urls: https://192.0.2.10:2380
    initial_cluster: cp-0=https://192.0.2.10:2380,cp-1=https://192.0.2.11:2380,cp-2=https://192.0.2.12:2380
    initial_cluster_token: restore-20261126T090000Z
    data_dir: /var/lib/etcd/restored
    expected_revision: 40213
"""

RETURN = r"""
cluster_id:
  description: The cluster ID the snapshot is bound to (hex).
  returned: success
  type: str
snapshot_size:
  description: The plaintext snapshot's size in bytes.
  returned: success
  type: int
revision:
  description: The etcd revision restored.
  returned: success, not in check mode
  type: int
data_dir:
  description: The restored data directory.
  returned: success, not in check mode
  type: str
"""

import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.confidential.kubernetes.plugins.module_utils._backup.etcd import (
    EtcdError,
    RestoreMember,
    restore_snapshot,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._backup.module import etcd_argument_spec, etcdctl
from ansible_collections.confidential.kubernetes.plugins.module_utils._backup.snapshot import SnapshotError
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.config import ConfigError, load_root_secrets

try:
    import cryptography  # noqa: F401 pylint: disable=unused-import
except ImportError:
    CRYPTOGRAPHY_ERROR: str | None = traceback.format_exc()
else:
    CRYPTOGRAPHY_ERROR = None

MEMBER_OPTIONS = ("member_name", "peer_urls", "initial_cluster", "initial_cluster_token", "data_dir")


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            etcd_argument_spec(),
            src=dict(type="path", required=True),
            member_name=dict(type="str"),
            peer_urls=dict(type="str"),
            initial_cluster=dict(type="str"),
            # A label shared by the restored members, not a secret.
            initial_cluster_token=dict(type="str", no_log=False),
            data_dir=dict(type="path"),
            expected_revision=dict(type="int"),
        ),
        supports_check_mode=True,
    )
    if CRYPTOGRAPHY_ERROR:
        module.fail_json(msg=missing_required_lib("cryptography"), exception=CRYPTOGRAPHY_ERROR)
    params = module.params
    missing = [name for name in MEMBER_OPTIONS if not params[name]]
    if missing and not module.check_mode:
        module.fail_json(msg=f"etcd restore needs {', '.join(missing)}")
    member = RestoreMember(
        params["member_name"] or "",
        params["peer_urls"] or "",
        params["initial_cluster"] or "",
        params["initial_cluster_token"] or "",
        params["data_dir"] or "",
    )
    try:
        secrets = load_root_secrets(params["secrets_file"])
        result = restore_snapshot(
            etcdctl(module),
            secrets,
            params["src"],
            params["work_dir"],
            member,
            params["expected_revision"],
            check_only=module.check_mode,
        )
    except (EtcdError, ConfigError, SnapshotError) as exc:
        module.fail_json(msg=str(exc), refused=type(exc).__name__)
    except OSError as exc:
        module.fail_json(msg=f"etcd restore of {params['src']}: {exc.strerror}: {exc.filename}")
    module.exit_json(changed=not module.check_mode, **result)


if __name__ == "__main__":
    main()
