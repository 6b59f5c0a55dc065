#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: measurement_rollover
short_description: Roll a measurement policy file over to a new node image, retire the old values, or roll back
version_added: 0.2.0
description:
  - Runs on the controller, on the measurement policy file the join services enforce. Pushing the result to the join
    services is the C(policy) entry point of the C(joinservice) role; the C(measurements) playbook does both.
  - V(add) allows the golden values of an updated node image (read from a golden node running it by
    M(confidential.kubernetes.measurements)) beside the values the policy allows already, for each PCR it checks, so
    that nodes rejoin before and after they reboot into the new image. It keeps the policy from before as
    C(<policy_file>.<date>@<time>~) and records the rollover in C(<policy_file>.rollover.json) - which values are new,
    which will retire, where the backup is. Only one rollover at a time.
  - V(retire) drops the values the rollover will retire, once no node runs them. It refuses, naming each node and PCR,
    while a node of O(node_pcrs) still runs one of them or a node could not be read (O(unreadable_nodes)), unless
    O(force). The policy before is kept as a backup.
  - V(rollback) puts the policy from before the rollover back and ends the rollover; the policy it replaces is kept
    as a backup. After V(retire) it trusts the retired values again, so it refuses unless O(force). It names the nodes
    of O(node_pcrs) that the restored policy will refuse at their next rejoin.
  - V(status) changes nothing and names the nodes that still run values the rollover in progress will retire.
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
    details:
      - Shows the policy before and after.
  idempotent:
    support: full
    details:
      - V(add) with the values it added already, V(retire) after a retire and V(rollback) with no rollover in progress
        change nothing.
options:
  policy_file:
    description: The measurement policy file on the controller.
    type: path
    required: true
  mode:
    description: What to do (see the description).
    type: str
    required: true
    choices: [add, retire, rollback, status]
  golden:
    description:
      - The golden node's measurements, RV(confidential.kubernetes.measurements#module:policy). Required for V(add).
    type: dict
  golden_node:
    description: The golden node's name, recorded with the rollover.
    type: str
    default: golden node
  node_pcrs:
    description:
      - Each cluster node's current PCR values (node name -> PCR index -> hex), as
        RV(confidential.kubernetes.measurements#module:pcrs) or RV(confidential.kubernetes.verify_evidence#module:pcrs)
        return them. V(retire) refuses while one of them runs a value that retires.
    type: dict
    default: {}
  unreadable_nodes:
    description: Nodes whose PCRs could not be read; V(retire) refuses while there are any, unless O(force).
    type: list
    elements: str
    default: []
  force:
    description:
      - V(retire) even though nodes (named in a warning) still run the old values or could not be read.
      - V(rollback) after V(retire), which trusts the retired values again.
    type: bool
    default: false
seealso:
  - module: confidential.kubernetes.measurements
  - name: The measurements playbook
    description: Enrols a golden node, and rolls a policy over to a new node image.
    link: https://github.com/confidential-kubernetes/confidential.kubernetes/blob/main/docs/playbooks/measurements.md
"""

EXAMPLES = r"""
- name: Read the new image's values on a golden node running it
  confidential.kubernetes.measurements:
  register: golden

- name: Allow them beside the old ones
  confidential.kubernetes.measurement_rollover:
    policy_file: "{{ inventory_dir }}/measurement-policy.yml"
    mode: add
    golden: "{{ golden.policy }}"
    golden_node: "{{ inventory_hostname }}"
  delegate_to: localhost
"""

RETURN = r"""
policy:
  description: The policy document after the step (before, for V(status)); null when there is no policy to show.
  returned: success
  type: dict
policy_sha256:
  description: SHA-256 (hex) of the policy file after the step, the digest a join service reports once it enforces it.
  returned: success, outside check mode
  type: str
backup:
  description: Where the policy replaced by this step was kept (null when none was replaced).
  returned: success
  type: str
rollover:
  description:
    - The rollover record (C(golden_node), C(started), C(backup), C(new) and C(retiring) values per PCR, C(retired)
      time), or null when no rollover is recorded.
  returned: success
  type: dict
nodes_on_old_values:
  description: Node name -> the PCRs on which it runs a value that retires (V(status), V(retire)).
  returned: success
  type: dict
  sample: {"worker-0": [8]}
nodes_not_allowed:
  description: Node name -> the PCRs on which the restored policy does not allow what it runs (V(rollback)).
  returned: success
  type: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import (
    PolicyError,
    pcr_values_from_document,
    policy_from_document,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.rollover import (
    YAML_IMPORT_ERROR,
    PolicyRollover,
    RolloverError,
    policy_text,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._files import file_sha256


def _read(path: str) -> str:
    if not os.path.exists(path):
        return ""
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            policy_file=dict(type="path", required=True),
            mode=dict(type="str", required=True, choices=["add", "retire", "rollback", "status"]),
            golden=dict(type="dict"),
            golden_node=dict(type="str", default="golden node"),
            node_pcrs=dict(type="dict", default={}),
            unreadable_nodes=dict(type="list", elements="str", default=[]),
            force=dict(type="bool", default=False),
        ),
        required_if=[("mode", "add", ["golden"])],
        supports_check_mode=True,
    )
    if YAML_IMPORT_ERROR:
        module.fail_json(msg=missing_required_lib("PyYAML"), exception=str(YAML_IMPORT_ERROR))
    params = module.params
    rollover = PolicyRollover(params["policy_file"], check_mode=module.check_mode)
    before = _read(rollover.policy_file)
    try:
        algorithm = rollover.current().hash_algorithm if before else "sha256"
        node_pcrs = {
            str(node): pcr_values_from_document(values, f"node_pcrs {node}", algorithm)
            for node, values in params["node_pcrs"].items()
        }
        if params["mode"] == "add":
            outcome = rollover.add(policy_from_document(params["golden"]), params["golden_node"])
        elif params["mode"] == "retire":
            outcome = rollover.retire(node_pcrs, params["unreadable_nodes"], params["force"])
        elif params["mode"] == "rollback":
            outcome = rollover.rollback(node_pcrs, params["force"])
        else:
            outcome = rollover.status(node_pcrs)
    except (PolicyError, RolloverError) as exc:
        module.fail_json(msg=str(exc))
    for node, pcrs in sorted(outcome.nodes_on_old_values.items()) if params["mode"] == "retire" else ():
        module.warn(
            f"{node} still runs the old values of PCR {','.join(map(str, pcrs))}: it is refused at its next rejoin"
        )
    for node, pcrs in sorted(outcome.nodes_not_allowed.items()):
        module.warn(
            f"{node} runs values of PCR {','.join(map(str, pcrs))} that the restored policy refuses at its next rejoin"
        )
    result = dict(
        changed=outcome.changed,
        msg=outcome.msg,
        policy=outcome.policy.to_document() if outcome.policy else None,
        backup=outcome.backup,
        rollover=outcome.record.to_document() if outcome.record else None,
        nodes_on_old_values=outcome.nodes_on_old_values,
        nodes_not_allowed=outcome.nodes_not_allowed,
    )
    if not module.check_mode and os.path.exists(rollover.policy_file):
        result["policy_sha256"] = file_sha256(rollover.policy_file)
    if module._diff and outcome.changed:
        if module.check_mode:
            after = policy_text(outcome.policy).decode() if outcome.policy else before
        else:
            after = _read(rollover.policy_file)
        result["diff"] = dict(
            before=before, after=after, before_header=rollover.policy_file, after_header=rollover.policy_file
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
