#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: nodelock
short_description: Take or report the one-way node lock (PCR 15 mark) for a cluster
version_added: 0.1.0
description:
  - The node lock is a one-way state machine, V(unlocked) to V(locked) for one cluster, with no way back short of a
    reboot. Taking it atomically creates a lock record (C(O_EXCL) and C(fsync)) and marks the TPM with
    C(TPM2_PCR_Event(15, cluster_id)), so that PCR 15 becomes C(SHA-256(0^32 || SHA-256(cluster_id))) and the node's
    evidence proves which cluster it belongs to.
  - Every taker holds an exclusive lock on a side file first; when init and join race on one node exactly one wins
    and PCR 15 is extended exactly once.
  - Taking the lock again for the same cluster changes nothing. A node locked for another cluster is refused.
  - After a reboot PCR 15 is zero again while the lock record stays; taking the lock for the same cluster marks the
    TPM again.
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
  - confidential.kubernetes._attributes.TPM
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  state:
    description:
      - V(locked) takes the lock for O(cluster_id). V(query) only reports the lock state.
    type: str
    choices: [locked, query]
    default: locked
  cluster_id:
    description: The cluster ID (64 hex characters), derived from the measurement secret. Required for O(state=locked).
    type: str
  record_path:
    description: The lock record.
    type: path
    default: /var/lib/confidential-kubernetes/nodelock.json
"""

EXAMPLES = r"""
- name: Lock the node for this cluster
  confidential.kubernetes.nodelock:
    cluster_id: "{{ init_cluster_id }}"

- name: Report the lock
  confidential.kubernetes.nodelock:
    state: query
  register: node_lock
"""

RETURN = r"""
locked:
  description: Whether a lock record exists.
  returned: always
  type: bool
  sample: true
cluster_id:
  description: The cluster the node is locked for; null when it is not locked.
  returned: always
  type: str
  sample: 128c164378fe8767f998fbdfe4b4d6463ec5ae1b664ea5999bc27417607ae9b6
pcr15:
  description: The current value of PCR 15 (hex).
  returned: always
  type: str
  sample: 23400370357e846478cce7cc0c76cdfe4da077cc57b36dee0f665ede2c8b3f2f
pcr15_state:
  description: V(unlocked) (zero), V(marked) (the mark of the locked cluster) or V(foreign) (anything else).
  returned: always
  type: str
  sample: marked
"""

import re

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import node
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.issuer import TpmError
from ansible_collections.confidential.kubernetes.plugins.module_utils._nodelock import NodeLock, NodeLockError


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", default="locked", choices=["locked", "query"]),
            cluster_id=dict(type="str"),
            tcti=dict(type="str", default="auto"),
            record_path=dict(type="path", default="/var/lib/confidential-kubernetes/nodelock.json"),
        ),
        required_if=[("state", "locked", ("cluster_id",))],
        supports_check_mode=True,
    )
    if node.CRYPTOGRAPHY_IMPORT_ERROR:
        module.fail_json(msg=missing_required_lib("cryptography >= 47"), exception=str(node.CRYPTOGRAPHY_IMPORT_ERROR))
    params = module.params
    lock = NodeLock.for_tcti(params["tcti"], params["record_path"])
    try:
        if params["state"] == "query":
            module.exit_json(changed=False, **lock.state().to_result())
        if not re.fullmatch(r"[0-9a-f]{64}", params["cluster_id"]):
            module.fail_json(msg="cluster_id must be 64 lower-case hex characters")
        changed, state = lock.take(bytes.fromhex(params["cluster_id"]), module.check_mode)
    except (NodeLockError, TpmError, OSError) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=changed, **state.to_result())


if __name__ == "__main__":
    main()
