#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: join_ticket
short_description: Get an attested join ticket from the join service and prepare the node for kubeadm join
version_added: 0.1.0
description:
  - The node side of the join service. Formats the LUKS2 state disk with a throw-away key if it
    is not LUKS yet (its UUID names the disk key), makes the kubelet's key and CSR, then tries the join endpoints in
    order with retries and backoff - get a nonce, send evidence bound to it, to a fresh ephemeral key that never
    leaves memory and to what the node asks for (name, role, disk UUID, kubelet key), activate the credential the
    service makes for the TPM's EK and AK and send the proof, open the sealed ticket.
  - Then derives the cluster ID, takes the node lock (PCR 15 mark), re-keys the state disk to the key in the ticket,
    writes the cluster CA, the kubelet client certificate and key (0600) and, for control planes, the PKI files with
    their modes, and leaves the bootstrap token in a 0600 file for M(confidential.kubernetes.kubeadm_join).
  - A member whose PCR 15 was reset by a reboot (C(/etc/kubernetes/kubelet.conf) exists, PCR 15 zero) asks for a rejoin
    ticket instead (C(IssueRejoinTicket)) - the disk key and the measurement secret only - marks PCR 15 again for the
    cluster and checks (or, with O(state_disk.state=opened) or V(mounted), opens) the state disk with its key.
  - Nothing secret is returned. A member whose PCR 15 carries the cluster's mark is left alone, and so is a node whose
    ticket was applied in this boot but whose C(kubeadm join) has not run yet.
  - The same code runs at boot without Ansible, see the C(boot_unit) entry point of the C(confidential.kubernetes.join) role.
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
      - In check mode no ticket is requested (a ticket mints a token); the task reports whether the node would join or rejoin.
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  endpoints:
    description: Join service endpoints (host:port), tried in order.
    type: list
    elements: str
    required: true
  cluster_ca:
    description:
      - PEM of the cluster CA, which issued the join services' TLS certificates.
      - Needed to join or rejoin; a member, a node waiting for C(kubeadm join), and check mode need none (the join role
        asks where a node stands that way before it reads the CA).
    type: str
    default: ""
  node_name:
    description:
      - The Kubernetes node name to ask for. The join service grants the name enrolled for this node's TPM (its EK) and
        refuses any other; the kubelet certificate is issued for C(system:node:<granted name>).
      - Empty asks for whatever name the service grants (the enrolled one, or for an autoscaled pool node the name the
        pool rule derives from its EK); the granted name is returned as RV(node_name).
    type: str
    default: ""
  control_plane:
    description: Join as a control plane (the ticket then carries the control-plane PKI).
    type: bool
    default: false
  attempts:
    description: How many rounds over all endpoints before giving up.
    type: int
    default: 8
  timeout:
    description: Seconds allowed for one request.
    type: float
    default: 30
  total_timeout:
    description: Seconds allowed for all rounds together, backoff included.
    type: float
    default: 300
  token_file:
    description: Where the bootstrap token is left for kubeadm_join (mode 0600, on tmpfs).
    type: path
    default: /run/confidential-kubernetes/join-token
  lock_record:
    description: The node lock record.
    type: path
    default: /var/lib/confidential-kubernetes/nodelock.json
  join_record:
    description: The non-secret record of the join (endpoint, CA pins, cluster ID) used on re-runs.
    type: path
    default: /etc/confidential-kubernetes/join.json
  secrets_file:
    description: Where a control plane keeps the cluster secrets for its own join service (mode 0600).
    type: path
    default: /etc/confidential-kubernetes/cluster-secrets.json
  encryption_config:
    description:
      - Where a control plane writes the API servers' C(EncryptionConfiguration) (Kubernetes Secrets encrypted at rest,
        0600, on the state disk once it is open), from the root secrets in its ticket, before C(kubeadm join) starts its
        API server. A file left by an earlier cluster on the node is replaced. Empty, none is written. Workers write
        none.
    type: path
    default: /etc/kubernetes/encryption-config.yaml
  encryption_keys:
    description:
      - The key generations of that file, as the cluster's other control planes have them (C(0) is C(key-etcdSecrets),
        C(n) is C(key-etcdSecrets-<n>)); the first encrypts. The join role reads them from the first control plane
        (M(confidential.kubernetes.secrets_encryption) with O(confidential.kubernetes.secrets_encryption#module:state=read)).
    type: list
    elements: int
    default: [0]
  kubelet_version:
    description:
      - The node's kubelet version (C(kubelet --version), as M(confidential.kubernetes.kubeadm_join) returns it with
        O(confidential.kubernetes.kubeadm_join#module:preflight=true)).
      - When set and the ticket names the cluster's Kubernetes version, the kubelet skew policy is checked after the
        ticket is opened and before the node lock. A kubelet of a newer minor than the API server, or more minors older
        than the policy allows (2, or 3 from API server 1.28 for kubelets from 1.25), fails and leaves the node unlocked.
    type: str
    default: ""
    version_added: 0.2.0
  event_log:
    description:
      - V(auto) sends the firmware's TCG event log (crypto-agile or SHA-1 format) with the evidence where the node has
        one it can use; a log that cannot be parsed, is over the parser's limits, or is in a bank the TPM has not
        allocated is left out with a warning, and the quoted PCRs are checked all the same.
      - V(none) sends no event log.
    type: str
    choices: [auto, none]
    default: auto
    version_added: 0.2.0
"""

EXAMPLES = r"""
- name: Read the cluster CA on a control plane
  ansible.builtin.slurp:
    src: /etc/kubernetes/pki/ca.crt
  delegate_to: "{{ groups['control_plane'][0] }}"
  run_once: true
  register: cluster_ca

- name: Get a join ticket
  confidential.kubernetes.join_ticket:
    endpoints: ["192.0.2.10:9290"]
    cluster_ca: "{{ cluster_ca.content | b64decode }}"
    node_name: "{{ inventory_hostname }}"
    state_disk:
      device: /dev/vdb
  register: join_ticket
"""

RETURN = r"""
node_name:
  description: The node name the join service granted (the kubelet certificate's and kubeadm join's).
  returned: when the node has a join record made by this version
  type: str
cluster_id:
  description: The cluster ID (hex).
  returned: success
  type: str
api_server_endpoint:
  description: Where kubeadm join discovers the cluster.
  returned: success
  type: str
ca_cert_hashes:
  description: The CA pins for kubeadm join.
  returned: success
  type: list
  elements: str
joined:
  description: Whether the node had already joined before this task.
  returned: success
  type: bool
node_state:
  description:
    - Where the node stood before the task. V(fresh) (it joined now), V(rebooted) (it rejoined now), V(member) (nothing
      to do), V(pending) (ticket applied, C(kubeadm join) still to run).
  returned: success
  type: str
state_disk:
  description: The state disk after the task.
  returned: when a ticket was applied
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import node
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.issuer import TpmError
from ansible_collections.confidential.kubernetes.plugins.module_utils._disk import StateDiskError
from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import TOKEN_FILE
from ansible_collections.confidential.kubernetes.plugins.module_utils._nodelock import DEFAULT_RECORD, NodeLockError
from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm.encryption import (
    CONFIG_PATH as ENCRYPTION_CONFIG,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._ticket import (
    SECRETS_FILE,
    STATE_DISK_OPTIONS,
    TicketError,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._ticket.join import (
    FRESH,
    JOIN_RECORD,
    MEMBER,
    PENDING,
    REBOOTED,
    JoinSettings,
    NodeJoin,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            endpoints=dict(type="list", elements="str", required=True),
            cluster_ca=dict(type="str", default=""),
            node_name=dict(type="str", default=""),
            control_plane=dict(type="bool", default=False),
            state_disk=dict(type="dict", options=STATE_DISK_OPTIONS),
            attempts=dict(type="int", default=8),
            timeout=dict(type="float", default=30),
            total_timeout=dict(type="float", default=300),
            token_file=dict(type="path", default=TOKEN_FILE, no_log=False),
            lock_record=dict(type="path", default=DEFAULT_RECORD),
            join_record=dict(type="path", default=JOIN_RECORD),
            secrets_file=dict(type="path", default=SECRETS_FILE, no_log=False),
            tcti=dict(type="str", default="auto"),
            kubelet_version=dict(type="str", default=""),
            event_log=dict(type="str", default="auto", choices=["auto", "none"]),
            encryption_config=dict(type="path", default=ENCRYPTION_CONFIG),
            encryption_keys=dict(type="list", elements="int", default=[0], no_log=False),
        ),
        supports_check_mode=True,
    )
    if node.CRYPTOGRAPHY_IMPORT_ERROR:
        module.fail_json(msg=missing_required_lib("cryptography >= 47"), exception=str(node.CRYPTOGRAPHY_IMPORT_ERROR))
    if not module.params["state_disk"]:
        module.fail_json(
            msg="state_disk is required: the join service derives the node's disk key from the disk's LUKS UUID"
        )
    joining = NodeJoin(JoinSettings.of(module.params))
    try:
        state = joining.state()
        if state in (MEMBER, PENDING):
            module.exit_json(changed=False, joined=state == MEMBER, node_state=state, **joining.record())
        if module.check_mode:
            module.exit_json(changed=True, joined=state == REBOOTED, node_state=state, **(joining.record() or {}))
        result = joining.rejoin() if state == REBOOTED else joining.join()
    except (TicketError, NodeLockError, TpmError, StateDiskError, OSError) as exc:
        module.fail_json(msg=str(exc))
    for warning in joining.warnings:
        module.warn(warning)
    module.exit_json(changed=True, joined=state != FRESH, node_state=state, **result)


if __name__ == "__main__":
    main()
