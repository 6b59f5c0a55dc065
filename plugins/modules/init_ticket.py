#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: init_ticket
short_description: Open the sealed init secrets on the first control-plane node, lock the node and keep the secrets
version_added: 0.1.0
description:
  - The node side of the init hand-over. Opens the secrets that M(confidential.kubernetes.seal_init_secrets) sealed
    to the ephemeral key of this node's evidence (HPKE, flow V(init)), deletes that key, derives the cluster ID, takes
    the node lock (PCR 15 mark, see M(confidential.kubernetes.nodelock)), re-keys the LUKS2 state disk to its derived
    key (C(key-) + the disk's lower-case LUKS UUID, see M(confidential.kubernetes.state_disk)) and keeps the secrets in
    a 0600 file for the join service of this control plane.
  - Past this point the node belongs to the cluster until it is reset and rebooted (the point of no return).
  - Nothing secret is returned or logged.
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
  - confidential.kubernetes._attributes.TPM
  - confidential.kubernetes._state_disk
attributes:
  check_mode:
    support: full
    details:
      - In check mode the ephemeral key is kept, so that the sealed secrets can still be opened for real.
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  sealed:
    description: The sealed init secrets (base64), as returned by M(confidential.kubernetes.seal_init_secrets).
    type: str
    required: true
  nonce:
    description: The nonce the evidence was bound to (64 hex characters); part of the HPKE context.
    type: str
    required: true
  verifier_id:
    description: The identity of the verifier that sealed the secrets; part of the HPKE context.
    type: str
    default: confidential.kubernetes/controller
  ephemeral_key_path:
    description: The ephemeral private key kept by M(confidential.kubernetes.tpm_evidence). Deleted when used.
    type: path
    default: /run/confidential-kubernetes/init-ephemeral.key
  secrets_file:
    description: Where the node keeps the cluster secrets for its join service (mode 0600).
    type: path
    default: /etc/confidential-kubernetes/cluster-secrets.json
  lock_record:
    description: The node lock record.
    type: path
    default: /var/lib/confidential-kubernetes/nodelock.json
  encryption_config:
    description:
      - Where the API servers' C(EncryptionConfiguration) is written (0600, after the state disk is open, so on it),
        with the first Secrets key derived from the root secrets (C(key-etcdSecrets), provider C(aescbc)), for
        C(kubeadm_init)'s O(confidential.kubernetes.kubeadm_init#module:encryption_provider_config). A file left by an
        earlier cluster on the node is replaced. Empty, none is written.
    type: path
    default: /etc/kubernetes/encryption-config.yaml
"""

EXAMPLES = r"""
- name: Open the sealed init secrets and lock the node
  confidential.kubernetes.init_ticket:
    sealed: "{{ init_sealed.sealed }}"
    nonce: "{{ init_nonce.nonce }}"
"""

RETURN = r"""
cluster_id:
  description: The cluster ID (hex) derived from the opened secrets.
  returned: success
  type: str
node_lock:
  description: The lock state after the task (locked, cluster_id, pcr15, pcr15_state).
  returned: success
  type: dict
cluster_config:
  description: The non-secret cluster configuration that travelled with the secrets.
  returned: success
  type: dict
state_disk:
  description: The state disk after the task (uuid, keyslots, keyed, mapped, mapping_available, mount_path).
  returned: when O(state_disk) is given
  type: dict
secrets_encryption:
  description: The Secrets encryption configuration's C(path) and whether it was C(written) now.
  returned: when O(encryption_config) is set
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import node
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto import derive
from ansible_collections.confidential.kubernetes.plugins.module_utils._disk import StateDiskError
from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm.encryption import (
    CONFIG_PATH,
    EncryptionConfigError,
    write_config,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.issuer import TpmError
from ansible_collections.confidential.kubernetes.plugins.module_utils._nodelock import NodeLock, NodeLockError
from ansible_collections.confidential.kubernetes.plugins.module_utils._reset import NEEDS_RESET
from ansible_collections.confidential.kubernetes.plugins.module_utils._ticket import (
    STATE_DISK_OPTIONS,
    TicketError,
    disk_uuid,
    keep_root_secrets,
    key_state_disk,
    open_sealed,
    root_secrets,
    take_ephemeral_key,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            sealed=dict(type="str", required=True),
            nonce=dict(type="str", required=True),
            verifier_id=dict(type="str", default="confidential.kubernetes/controller"),
            ephemeral_key_path=dict(
                type="path", default="/run/confidential-kubernetes/init-ephemeral.key", no_log=False
            ),
            secrets_file=dict(type="path", default="/etc/confidential-kubernetes/cluster-secrets.json", no_log=False),
            lock_record=dict(type="path", default="/var/lib/confidential-kubernetes/nodelock.json"),
            tcti=dict(type="str", default="auto"),
            state_disk=dict(type="dict", options=STATE_DISK_OPTIONS),
            encryption_config=dict(type="path", default=CONFIG_PATH),
        ),
        supports_check_mode=True,
    )
    if node.CRYPTOGRAPHY_IMPORT_ERROR:
        module.fail_json(msg=missing_required_lib("cryptography >= 47"), exception=str(node.CRYPTOGRAPHY_IMPORT_ERROR))
    params = module.params
    try:
        key = take_ephemeral_key(params["ephemeral_key_path"], module.check_mode)
        payload = open_sealed(key, params["sealed"], "init", params["nonce"], params["verifier_id"])
        secrets = root_secrets(payload, "sealed init secrets")
        cluster_id = secrets.cluster_id()
        locked, lock_state = NodeLock.for_tcti(params["tcti"], params["lock_record"]).take(
            cluster_id, module.check_mode
        )
        disk = {}
        if params["state_disk"]:
            uuid, formatted = disk_uuid(params["state_disk"], module.check_mode)
            if uuid is None:  # check mode on a blank disk: formatting would come first
                disk = {"changed": formatted}
            else:
                disk = key_state_disk(
                    params["state_disk"],
                    derive.state_disk_key(secrets.master_key, secrets.master_salt, uuid),
                    module.check_mode,
                )
                disk["changed"] = disk["changed"] or formatted
        kept = keep_root_secrets(params["secrets_file"], secrets, module.check_mode)
        encryption = {}
        if params["encryption_config"]:
            encryption = {
                "path": params["encryption_config"],
                "written": write_config(params["encryption_config"], secrets, [0], module.check_mode),
            }
    except StateDiskError as exc:
        module.fail_json(
            msg=f"{exc} (the node is locked for cluster {cluster_id.hex()}; before another try, {NEEDS_RESET})",
            needs_reset=True,
        )
    except (TicketError, NodeLockError, TpmError, EncryptionConfigError, OSError) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(
        changed=locked or kept or disk.get("changed", False) or encryption.get("written", False),
        cluster_id=cluster_id.hex(),
        node_lock=lock_state.to_result(),
        cluster_config=payload.get("cluster_config", {}),
        **({"state_disk": disk} if disk else {}),
        **({"secrets_encryption": encryption} if encryption else {}),
    )


if __name__ == "__main__":
    main()
