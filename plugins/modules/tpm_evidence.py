#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: tpm_evidence
short_description: Produce TPM evidence bound to a verifier's nonce and a fresh ephemeral key
version_added: 0.1.0
description:
  - Quotes every PCR of the SHA-256 bank with an ECC P-256 attestation key (AK) that lives in the
    TPM's endorsement hierarchy, over C(SHA-256(nonce || SHA-256(user_data))), where C(user_data) is the
    raw public key of a fresh HPKE key pair. The verifier seals secrets to that key.
  - Adds the TPM's RSA-2048 EK certificate and EK public key, so that a verifier can establish AK trust
    level 2 (EK certificate chain plus credential activation).
  - With O(credential), answers a verifier's credential challenge instead (TPM2_ActivateCredential).
  - Every TPM handle and session this module creates is flushed before it returns.
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
  - confidential.kubernetes._attributes.TPM
attributes:
  action:
    support: full
    description: Indicates this has a corresponding action plugin so some parts of the options can be executed on the controller.
    details:
      - The action runs the module on the node and censors a result that carries RV(activated_secret).
  check_mode:
    support: full
    details:
      - In check mode the ephemeral private key is not written; the evidence is still produced (a quote changes nothing).
  diff_mode:
    support: none
  idempotent:
    support: full
    details:
      - Every run draws a new ephemeral key and a new quote, but reports no change - the only state it leaves, the kept
        ephemeral key, is consumed and deleted by the next task of the hand-over.
options:
  nonce:
    description:
      - The verifier's 32-byte nonce as 64 hexadecimal characters.
      - Required unless O(credential) is given.
    type: str
  hpke_suite:
    description:
      - KEM of the ephemeral key the evidence binds. V(mlkem768-x25519) is the post-quantum hybrid default.
    type: str
    choices: [mlkem768-x25519, x25519]
    default: mlkem768-x25519
  include_ek_certificate:
    description: Include the EK certificate and EK public key (needed for AK trust level 2).
    type: bool
    default: true
  event_log_path:
    description:
      - The TCG event log to include in the evidence, in the binary format firmware writes (crypto-agile, or the
        older SHA-1 format); the verifier replays it against the quoted PCRs.
      - When omitted, the firmware's log C(/sys/kernel/security/tpm0/binary_bios_measurements) if the node has one
        and the module may read it (root only).
      - A log that cannot be parsed, is over the parser's limits, or is in a bank the TPM has not allocated is left
        out with a warning; the quoted PCRs are checked all the same. A log that cannot be read fails.
    type: path
  event_log:
    description: V(auto) includes the event log as O(event_log_path) says; V(none) includes none.
    type: str
    choices: [auto, none]
    default: auto
    version_added: 0.2.0
  ephemeral_key_path:
    description:
      - Keep the ephemeral private key in this file (mode 0600, directory 0700), for flows that open the
        sealed reply in a later task. Use a path under C(/run) so that it never reaches a disk.
      - When omitted the private key is discarded.
    type: path
  credential:
    description:
      - A verifier's credential challenge (from M(confidential.kubernetes.verify_evidence)) to activate with this TPM's AK and EK.
    type: dict
    suboptions:
      blob:
        description: The TPM2B_ID_OBJECT contents, base64.
        type: str
        required: true
      encrypted_seed:
        description: The TPM2B_ENCRYPTED_SECRET contents, base64.
        type: str
        required: true
"""

EXAMPLES = r"""
- name: Produce evidence for a nonce drawn by the controller
  confidential.kubernetes.tpm_evidence:
    nonce: "{{ attestation_nonce.nonce }}"
  register: node_evidence

- name: Keep the ephemeral key for the sealed init hand-over
  confidential.kubernetes.tpm_evidence:
    nonce: "{{ attestation_nonce.nonce }}"
    ephemeral_key_path: /run/confidential-kubernetes/init-ephemeral.key
    tcti: "swtpm:path=/run/tpm/swtpm.sock"
"""

RETURN = r"""
evidence:
  description: The evidence document (version, variant, ak_public, quote, signature, pcrs, user_data, ek_public, ek_certificate, event_log).
  returned: when O(nonce) is given
  type: dict
ephemeral_key_path:
  description: Where the ephemeral private key was kept.
  returned: when O(nonce) is given
  type: str
activated_secret:
  description:
    - The credential secret the TPM released, base64; proves the AK and EK sit in the same TPM.
    - Secret - the task's result is censored (as with C(no_log)) whenever it carries this value.
  returned: when O(credential) is given
  type: str
"""

import base64
from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import node
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.evidence import EvidenceError
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.issuer import TpmError


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            nonce=dict(type="str"),
            tcti=dict(type="str", default="auto"),
            hpke_suite=dict(type="str", default="mlkem768-x25519", choices=["mlkem768-x25519", "x25519"]),
            include_ek_certificate=dict(type="bool", default=True),
            event_log_path=dict(type="path"),
            event_log=dict(type="str", default="auto", choices=["auto", "none"]),
            ephemeral_key_path=dict(type="path", no_log=False),
            credential=dict(
                type="dict",
                options=dict(
                    blob=dict(type="str", required=True),
                    encrypted_seed=dict(type="str", required=True, no_log=False),
                ),
            ),
        ),
        required_one_of=[("nonce", "credential")],
        mutually_exclusive=[("nonce", "credential")],
        supports_check_mode=True,
    )
    if node.CRYPTOGRAPHY_IMPORT_ERROR:
        module.fail_json(msg=missing_required_lib("cryptography >= 47"), exception=str(node.CRYPTOGRAPHY_IMPORT_ERROR))
    params = module.params
    try:
        if params["credential"]:
            secret = node.activate_credential(
                params["tcti"], params["credential"]["blob"], params["credential"]["encrypted_seed"]
            )
            module.exit_json(changed=False, activated_secret=base64.b64encode(secret).decode())
        result = node.produce_evidence(
            params["tcti"],
            params["nonce"],
            params["hpke_suite"],
            params["include_ek_certificate"],
            params["event_log_path"],
            params["ephemeral_key_path"],
            module.check_mode,
            params["event_log"],
        )
    except (EvidenceError, TpmError, OSError) as exc:
        module.fail_json(msg=str(exc))
    for warning in result.pop("warnings"):
        module.warn(warning)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
