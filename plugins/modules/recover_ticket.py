#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: recover_ticket
short_description: On a control plane that waits for keys, report where it stands, or open the recover hand-over
version_added: 0.2.0
description:
  - The node side of C(recover.yml). Without O(sealed), reports whether the node waits for the recover hand-over,
    that is a member whose PCR 15 a reboot reset (lock record and join record on the root disk) and whose boot-time join
    (C(confidential-join.service)) reports C(waiting-for-keys) because no join service answers. Nothing is changed.
  - With O(sealed), opens the hand-over M(confidential.kubernetes.recover_secrets) sealed to the ephemeral key of this
    node's evidence (HPKE, flow V(recover)), deletes that key, checks that it is for the cluster of the node's join
    record and for its own state disk, takes the node lock again (PCR 15 mark) and opens the state disk with the key
    (as its O(state_disk.state) asks). The boot-time join then finds the node a member, and the kubelet and the join
    service start. A node that became a member meanwhile (it rejoined through a join service) is left alone.
  - Nothing secret is returned or logged.
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
  - confidential.kubernetes._attributes.TPM
  - confidential.kubernetes._state_disk
attributes:
  check_mode:
    support: partial
    details:
      - Without O(sealed) the module changes nothing anyway; with it, check mode reports a change and opens nothing.
  diff_mode:
    support: none
  idempotent:
    support: full
    details:
      - A node the hand-over made a member again reports no waiting; C(recover.yml) hands it nothing more.
options:
  sealed:
    description:
      - The sealed recover hand-over (base64) from M(confidential.kubernetes.recover_secrets); omit to report only.
    type: str
  nonce:
    description:
      - The nonce the evidence was bound to (64 hex characters); part of the HPKE context. Required with O(sealed).
    type: str
  verifier_id:
    description: The identity of the verifier that sealed the hand-over; part of the HPKE context.
    type: str
    default: confidential.kubernetes/controller
  ephemeral_key_path:
    description: The ephemeral private key kept by M(confidential.kubernetes.tpm_evidence). Deleted when used.
    type: path
    default: /run/confidential-kubernetes/recover-ephemeral.key
  lock_record:
    description: The node lock record.
    type: path
    default: /var/lib/confidential-kubernetes/nodelock.json
  join_record:
    description: The join record (cluster ID, API endpoint, CA pins) the node keeps on its root disk.
    type: path
    default: /etc/confidential-kubernetes/join.json
  status_file:
    description: Where the boot-time join reports its state.
    type: path
    default: /run/confidential-kubernetes/boot-status.json
"""

EXAMPLES = r"""
- name: Ask the control plane whether it waits for keys
  confidential.kubernetes.recover_ticket:
    state_disk: {device: /dev/vdb, state: mounted}
  register: standing

- name: Open the recover hand-over
  confidential.kubernetes.recover_ticket:
    state_disk: {device: /dev/vdb, state: mounted}
    sealed: "{{ sealed.sealed }}"
    nonce: "{{ nonce.nonce }}"
  when: standing.waiting
"""

RETURN = r"""
node_state:
  description: Where the node stands (member, rebooted, pending, fresh), before any hand-over.
  returned: success
  type: str
boot_state:
  description: What the boot-time join last reported (member, joining, waiting-for-keys, or none).
  returned: success
  type: str
waiting:
  description: Whether the node waits for the recover hand-over.
  returned: success
  type: bool
reason:
  description: Why the node does not wait; empty when it does.
  returned: success
  type: str
disk_uuid:
  description: The LUKS UUID of the state disk of a rebooted node (empty otherwise).
  returned: success
  type: str
cluster_id:
  description: The cluster ID (hex) of the node's join record.
  returned: success
  type: str
node_lock:
  description: With O(sealed), the lock state after the hand-over (locked, cluster_id, pcr15, pcr15_state).
  returned: when sealed is given
  type: dict
state_disk:
  description: With O(sealed), the state disk result (uuid, keyed, mapped, mount_path, changed).
  returned: when sealed is given
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import node
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.issuer import TpmError
from ansible_collections.confidential.kubernetes.plugins.module_utils._disk import StateDiskError
from ansible_collections.confidential.kubernetes.plugins.module_utils._nodelock import NodeLock, NodeLockError
from ansible_collections.confidential.kubernetes.plugins.module_utils._ticket import STATE_DISK_OPTIONS, TicketError
from ansible_collections.confidential.kubernetes.plugins.module_utils._ticket.join import MEMBER, JoinSettings, NodeJoin
from ansible_collections.confidential.kubernetes.plugins.module_utils._ticket.recover import recover, standing


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            sealed=dict(type="str", no_log=False),
            nonce=dict(type="str"),
            verifier_id=dict(type="str", default="confidential.kubernetes/controller"),
            ephemeral_key_path=dict(
                type="path", default="/run/confidential-kubernetes/recover-ephemeral.key", no_log=False
            ),
            lock_record=dict(type="path", default="/var/lib/confidential-kubernetes/nodelock.json"),
            join_record=dict(type="path", default="/etc/confidential-kubernetes/join.json"),
            status_file=dict(type="path", default="/run/confidential-kubernetes/boot-status.json"),
            tcti=dict(type="str", default="auto"),
            state_disk=dict(type="dict", options=STATE_DISK_OPTIONS),
        ),
        required_by={"sealed": ["nonce"]},
        supports_check_mode=True,
    )
    if node.CRYPTOGRAPHY_IMPORT_ERROR:
        module.fail_json(msg=missing_required_lib("cryptography >= 47"), exception=str(node.CRYPTOGRAPHY_IMPORT_ERROR))
    params = module.params
    if not params["state_disk"]:
        module.fail_json(msg="state_disk is required: a member's state disk decides where it stands")
    settings = JoinSettings(
        endpoints=[],
        cluster_ca="",
        node_name="",
        state_disk=params["state_disk"],
        tcti=params["tcti"],
        lock_record=params["lock_record"],
        join_record=params["join_record"],
    )
    joining = NodeJoin(settings, NodeLock.for_tcti(params["tcti"], params["lock_record"]))
    try:
        found = standing(joining, params["status_file"])
        result = dict(found.to_result(), changed=False)
        if params["sealed"] is not None and found.node_state != MEMBER:
            if not found.waiting:
                module.fail_json(
                    msg=f"the node does not wait for the recover hand-over: {found.reason}; nothing was opened",
                    **result,
                )
            if module.check_mode:
                result["changed"] = True
            else:
                opened = recover(
                    joining, params["sealed"], params["nonce"], params["verifier_id"], params["ephemeral_key_path"]
                )
                result.update(opened)
    except (TicketError, NodeLockError, TpmError, StateDiskError, OSError) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
