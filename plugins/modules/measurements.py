#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: measurements
short_description: Read a node's current PCR values as a ready-to-use measurement policy
version_added: 0.1.0
description:
  - Reads the TPM's PCRs and returns them as a measurement policy document in this collection's format,
    for enrolling a golden node. Save the result on the controller and review it before trusting it.
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
  pcrs:
    description: PCR indices to include. All 24 when omitted. PCR 15 (the node lock) is usually left out.
    type: list
    elements: int
  bank:
    description: The PCR bank to read.
    type: str
    choices: [sha256, sha384]
    default: sha256
  ak_trust:
    description: The AK trust the policy demands; V(pcrs-only) is trust level 1 and must be chosen explicitly.
    type: str
    choices: [ek-certificate, pcrs-only]
    default: ek-certificate
  warn_only:
    description: PCR indices whose mismatch is only reported as a warning.
    type: list
    elements: int
    default: []
  event_log_path:
    description:
      - The node's TCG event log (crypto-agile binary format); its events of the enrolled PCRs are enrolled beside the
        PCR values (C(event_log) of the policy), so that a PCR failing the policy later names the events that differ.
      - When omitted, the firmware's log C(/sys/kernel/security/tpm0/binary_bios_measurements) if the node has one;
        no events are enrolled without a log. A log that does not replay to the PCRs read is refused.
    type: path
seealso:
  - module: confidential.kubernetes.verify_evidence
  - name: The measurements playbook
    description: Enrols a golden node into a policy file on the controller.
    link: https://github.com/confidential-kubernetes/confidential.kubernetes/blob/main/docs/playbooks/measurements.md
"""

EXAMPLES = r"""
# The measurements playbook does this, refusing to replace a different policy without force:
#   ansible-playbook -i inventory.yml confidential.kubernetes.measurements -e measurements_golden_node=cp-0
- name: Enrol the golden node's boot measurements
  confidential.kubernetes.measurements:
    pcrs: [0, 2, 4, 7, 8, 9]
  register: golden

- name: Store the policy on the controller, keeping a replaced one as a backup
  ansible.builtin.copy:
    content: "{{ golden.policy | to_nice_yaml(indent=2) }}"
    dest: "{{ inventory_dir }}/measurement-policy.yml"
    mode: "0644"
    backup: true
  delegate_to: localhost

- name: Accept two kernel command lines during a roll-out, and only warn about PCR 9
  confidential.kubernetes.measurements:
    pcrs: [4, 8, 9]
    warn_only: [9]
  register: golden
"""

RETURN = r"""
policy:
  description:
    - The measurement policy - C(version), C(hash_algorithm), C(ak_trust) and C(pcrs), which maps each PCR index (a
      string) to its C(allowed) values (hex) and C(warn_only) - as M(confidential.kubernetes.verify_evidence) reads it.
    - With an event log, C(event_log) lists the golden events of those PCRs (pcr, type, description, digest).
  returned: success
  type: dict
  sample:
    version: 1
    hash_algorithm: sha256
    ak_trust: ek-certificate
    pcrs:
      "8":
        allowed: [b77314521b36e4cbd9edb307f7a418aaf67490d1e20649f8f3d8cdd633cc359e]
        warn_only: false
    event_log:
      - pcr: 8
        type: EV_IPL
        description: "kernel_cmdline: BOOT_IMAGE=/boot/vmlinuz ro quiet"
        digest: b77314521b36e4cbd9edb307f7a418aaf67490d1e20649f8f3d8cdd633cc359e
pcrs:
  description: The PCR values read (index -> hex), for M(confidential.kubernetes.measurement_rollover).
  returned: success
  type: dict
  sample: {"8": b77314521b36e4cbd9edb307f7a418aaf67490d1e20649f8f3d8cdd633cc359e}
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import node
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.evidence import EvidenceError
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.issuer import TpmError


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            tcti=dict(type="str", default="auto"),
            pcrs=dict(type="list", elements="int"),
            bank=dict(type="str", default="sha256", choices=["sha256", "sha384"]),
            ak_trust=dict(type="str", default="ek-certificate", choices=["ek-certificate", "pcrs-only"]),
            warn_only=dict(type="list", elements="int", default=[]),
            event_log_path=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    if node.CRYPTOGRAPHY_IMPORT_ERROR:
        module.fail_json(msg=missing_required_lib("cryptography >= 47"), exception=str(node.CRYPTOGRAPHY_IMPORT_ERROR))
    params = module.params
    bad = [i for i in (params["pcrs"] or []) + params["warn_only"] if not 0 <= i <= 23]
    if bad:
        module.fail_json(msg=f"PCR indices must be 0..23, got {bad}")
    try:
        policy = node.read_measurements(
            params["tcti"],
            params["pcrs"] or [],
            params["bank"],
            params["ak_trust"],
            params["warn_only"],
            params["event_log_path"],
        )
    except (TpmError, EvidenceError) as exc:
        module.fail_json(msg=str(exc))
    pcrs = {index: rule["allowed"][0] for index, rule in policy["pcrs"].items()}
    module.exit_json(changed=False, policy=policy, pcrs=pcrs)


if __name__ == "__main__":
    main()
