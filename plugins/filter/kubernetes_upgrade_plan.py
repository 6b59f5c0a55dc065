# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The upgrade preflight's decisions over what the API reports (logic in module_utils/_kubeadm/upgrade.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
name: kubernetes_upgrade_plan
short_description: Whether an in-place Kubernetes upgrade may start, and which nodes it still has to upgrade
version_added: 0.2.0
description:
  - From C(kubectl get nodes -o json) (the input) and the API server's version, every reason the upgrade to O(target)
    may not start - a target more than one minor above the control plane's or lower than it, a pre-release target
    without O(allow_pre_release), a node newer than the target, a node that is not Ready - and the nodes whose kubelet
    does not run O(target) yet (a resumed upgrade skips the others).
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
positional: server_version, target, allow_pre_release
options:
  _input:
    description: The output of C(kubectl get nodes -o json), parsed.
    type: dict
    required: true
  server_version:
    description: The API server's version (C(kubectl version -o json)'s C(serverVersion.gitVersion)).
    type: str
    required: true
  target:
    description: The version to upgrade to.
    type: str
    required: true
  allow_pre_release:
    description: Accept a pre-release target (kubeadm upgrade treats it as unstable).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Refuse an upgrade that may not start
  ansible.builtin.assert:
    that: (nodes.stdout | from_json | confidential.kubernetes.kubernetes_upgrade_plan('v1.20.2', '1.21.1')).problems == []
"""

RETURN = r"""
_value:
  description: The decision.
  type: dict
  contains:
    problems:
      description: Every reason the upgrade may not start, each naming the node or version; empty when it may.
      type: list
      elements: str
    pending:
      description: The nodes whose kubelet does not run the target yet (empty when there are problems).
      type: list
      elements: str
"""

from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm.upgrade import (
    nodes_from_api,
    pending_nodes,
    upgrade_problems,
)


def kubernetes_upgrade_plan(node_list, server_version, target, allow_pre_release=False) -> dict:
    nodes = nodes_from_api(node_list)
    problems = upgrade_problems(str(server_version), nodes, str(target), bool(allow_pre_release))
    return {"problems": problems, "pending": [] if problems else pending_nodes(nodes, str(target))}


class FilterModule:
    def filters(self):
        return {"kubernetes_upgrade_plan": kubernetes_upgrade_plan}
