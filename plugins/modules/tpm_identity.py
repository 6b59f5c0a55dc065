#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: tpm_identity
short_description: Read a node's TPM identity (its endorsement key) for enrolment with the join service
version_added: 0.2.0
description:
  - Reads the TPM's RSA-2048 endorsement key (EK) and, where the TPM has one, its EK certificate. The join service knows
    a node by this key and grants name, role and disk to the enrolled EK only; it proves the node holds the EK by
    credential activation at every join.
  - Returns the identity (the hex SHA-256 of the EK's SubjectPublicKeyInfo), the EK public area and the certificate.
    Nothing secret. M(confidential.kubernetes.node_enrolment) records them on the controller.
  - With O(state_disk), also the LUKS UUID of the node's state disk when it is LUKS already (a member's disk stays
    bound to its TPM), read with C(cryptsetup luksUUID) in the same call.
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
  - confidential.kubernetes._attributes.INFO_MODULE
  - confidential.kubernetes._attributes.TPM
attributes:
  idempotent:
    support: full
options:
  state_disk:
    description:
      - The state disk device (or file). Empty or unset reads no disk and returns RV(disk_uuid=null).
    type: str
    default: ""
seealso:
  - module: confidential.kubernetes.node_enrolment
"""

EXAMPLES = r"""
- name: Read the node's TPM identity
  confidential.kubernetes.tpm_identity:
  register: identity
"""

RETURN = r"""
ek:
  description: The node's identity, the hex SHA-256 of the EK's SubjectPublicKeyInfo (DER).
  returned: success
  type: str
  sample: 80cd394f3e92b8094f5d6a1e0c7b2f3a9d8e7c6b5a4f3e2d1c0b9a8f7e6d5c4b
ek_public:
  description: The EK's TPMT_PUBLIC, base64.
  returned: success
  type: str
ek_certificate:
  description: The EK certificate (DER, base64) from the TPM's NV index; null when the TPM has none.
  returned: success
  type: str
disk_uuid:
  description: The LUKS UUID of O(state_disk); null when no disk is given or it is no LUKS device yet.
  returned: success
  type: str
  sample: 0d3b1c4e-9f2a-4e57-8a61-2f4c9b7d5e13
"""

import base64

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import node
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.issuer import Tpm, TpmError
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.request import ek_identity


def luks_uuid(module: AnsibleModule, device: str) -> str | None:
    """The LUKS UUID of the device, None when it is no LUKS device (cryptsetup's exit 1); fails on any other error."""
    if not device:
        return None
    rc, stdout, stderr = module.run_command([module.get_bin_path("cryptsetup", required=True), "luksUUID", device])
    if rc not in (0, 1):
        module.fail_json(msg=f"cryptsetup luksUUID {device} failed (exit {rc}): {stderr.strip()}")
    return stdout.strip() if rc == 0 else None


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(tcti=dict(type="str", default="auto"), state_disk=dict(type="str", default="")),
        supports_check_mode=True,
    )
    if node.CRYPTOGRAPHY_IMPORT_ERROR:
        module.fail_json(msg=missing_required_lib("cryptography >= 47"), exception=str(node.CRYPTOGRAPHY_IMPORT_ERROR))
    try:
        with Tpm(module.params["tcti"]) as tpm:
            certificate, handle, ek_public = tpm.endorsement_key()
            tpm.flush(handle)
    except TpmError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(
        changed=False,
        ek=ek_identity(ek_public),
        ek_public=base64.b64encode(ek_public).decode(),
        ek_certificate=base64.b64encode(certificate).decode() if certificate else None,
        disk_uuid=luks_uuid(module, module.params["state_disk"]),
    )


if __name__ == "__main__":
    main()
