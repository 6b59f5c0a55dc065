#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: init_state
short_description: Tell whether the first control-plane node is initialised for this cluster, and keep its admin kubeconfig
version_added: 0.2.0
description:
  - Decides in one call whether the first control plane still needs the init hand-over. Its action plugin derives the
    cluster ID from the root secrets file on the controller (never from what the node says); on the node the module
    then checks what the init hand-over and C(kubeadm init) leave behind, against that cluster ID.
  - The node is initialised when its lock record names the cluster and PCR 15 carries the cluster's mark (so it was not
    rebooted since), C(kubeadm init) ran to the end for its cluster CA, and it keeps that cluster's root secrets (0600)
    for its join service. Otherwise RV(reason) says what is missing; the init role then runs the whole attested
    hand-over, which resumes or fails exactly as on a node this module never looked at.
  - An initialised node gets no secret at all. Whether it still runs what it was attested for is the business of the
    verify playbook (C(site.yml) ends with it).
  - With O(admin_kubeconfig), the admin kubeconfig of an initialised node is stored on the controller (mode 0600); it
    is fetched only when the controller's copy differs from the node's (compared by SHA-256), and never returned.
  - Changes nothing on the node.
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
  - confidential.kubernetes._attributes.action
  - confidential.kubernetes._attributes.TPM
attributes:
  check_mode:
    support: full
    details:
      - In check mode the admin kubeconfig is compared but not stored.
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  secrets_file:
    description:
      - The cluster's root secrets file on the controller (ansible-vault encrypted files are read too). When it does not
        exist yet (a first init), no node is initialised.
    type: path
    required: true
  admin_kubeconfig:
    description: Controller path where the admin kubeconfig of an initialised node is kept (mode 0600). Unset, it is left alone.
    type: path
  cluster_id:
    description:
      - The cluster ID (64 hex characters) the node must be initialised for. Set by the action plugin from O(secrets_file);
        whatever a task gives is replaced.
    type: str
  node_secrets_file:
    description: Where the node keeps the root secrets for its join service.
    type: path
    default: /etc/confidential-kubernetes/cluster-secrets.json
  lock_record:
    description: The node lock record.
    type: path
    default: /var/lib/confidential-kubernetes/nodelock.json
seealso:
  - module: confidential.kubernetes.init_ticket
  - module: confidential.kubernetes.kubeadm_init
  - module: confidential.kubernetes.cluster_identity
"""

EXAMPLES = r"""
- name: Find out whether the first control plane is initialised for this cluster
  confidential.kubernetes.init_state:
    secrets_file: "{{ inventory_dir }}/secrets/cluster-secrets.json"
    admin_kubeconfig: "{{ inventory_dir }}/secrets/admin.conf"
  register: init

- name: Hand over the init secrets only where they are needed
  ansible.builtin.include_tasks: handover.yml
  when: not init.initialised
"""

RETURN = r"""
initialised:
  description: Whether the node is initialised for the cluster of O(secrets_file).
  returned: success
  type: bool
reason:
  description: Why the node is not initialised; empty when it is.
  returned: success
  type: str
  sample: the node is not locked
cluster_id:
  description: The cluster ID (hex) of O(secrets_file); null before a first init.
  returned: success
  type: str
  sample: 128c164378fe8767f998fbdfe4b4d6463ec5ae1b664ea5999bc27417607ae9b6
node_lock:
  description: The node lock (locked, cluster_id, pcr15, pcr15_state), as M(confidential.kubernetes.nodelock) reports it.
  returned: success
  type: dict
admin_kubeconfig_exists:
  description: Whether the node has an admin kubeconfig (C(/etc/kubernetes/admin.conf)).
  returned: success
  type: bool
admin_kubeconfig_sha256:
  description: The SHA-256 (hex) of the admin kubeconfig of an initialised node; null otherwise.
  returned: success
  type: str
ca_cert_hash:
  description: kubeadm's pin of the cluster CA (C(sha256:<hex>)) of an initialised node; null otherwise.
  returned: success
  type: str
  sample: sha256:5c7a1b...
admin_kubeconfig_stored:
  description: Whether the admin kubeconfig was (or, in check mode, would be) written to O(admin_kubeconfig).
  returned: success
  type: bool
"""

import re

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import node
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.issuer import TpmError
from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import Kubeadm
from ansible_collections.confidential.kubernetes.plugins.module_utils._nodelock import NodeLock
from ansible_collections.confidential.kubernetes.plugins.module_utils._ticket.init import init_state


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            secrets_file=dict(type="path", required=True, no_log=False),
            admin_kubeconfig=dict(type="path"),
            cluster_id=dict(type="str"),
            node_secrets_file=dict(
                type="path", default="/etc/confidential-kubernetes/cluster-secrets.json", no_log=False
            ),
            lock_record=dict(type="path", default="/var/lib/confidential-kubernetes/nodelock.json"),
            tcti=dict(type="str", default="auto"),
        ),
        supports_check_mode=True,
    )
    if node.CRYPTOGRAPHY_IMPORT_ERROR:
        module.fail_json(msg=missing_required_lib("cryptography >= 47"), exception=str(node.CRYPTOGRAPHY_IMPORT_ERROR))
    params = module.params
    cluster_id = params["cluster_id"]
    if cluster_id is not None and not re.fullmatch(r"[0-9a-f]{64}", cluster_id):
        module.fail_json(msg="cluster_id must be 64 lower-case hex characters")
    try:
        state = init_state(
            cluster_id, NodeLock.for_tcti(params["tcti"], params["lock_record"]), Kubeadm(), params["node_secrets_file"]
        )
    except TpmError as exc:
        module.fail_json(msg=f"cannot read PCR 15 to tell whether the node is initialised: {exc}")
    module.exit_json(changed=False, cluster_id=cluster_id, **state.to_result())


if __name__ == "__main__":
    main()
