#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: preflight
short_description: Check that the controller and a node run versions the collection supports
version_added: 0.2.0
description:
  - Runs on the controller with no round trip to any host. Fails, naming the value found, what is supported and the
    variable or step that fixes it, when the controller's Python is older than 3.10, when its ansible-core does not meet
    C(requires_ansible) of the collection's C(meta/runtime.yml), and - for the values a node reported
    (O(node_architecture), O(node_python_version)) - when the node's machine has no builds in the versions table
    (C(x86_64)/C(amd64) and C(aarch64)/C(arm64) have) or Ansible runs a Python older than 3.10 there.
  - Every playbook checks the controller once, before any host is touched (C(groups.yml)); the C(node) role checks each
    node with what its C(node_state) probe reported, so the check costs no round trip.
  - Never changes anything (V(changed=false)).
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
  - confidential.kubernetes._attributes.action
attributes:
  check_mode:
    support: full
    details:
      - Checks the same in check mode.
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  node_architecture:
    description: The node's machine as Ansible's facts name it (C(ansible_architecture); M(confidential.kubernetes.node_state)'s C(architecture)).
    type: str
  node_python_version:
    description: The version of the Python Ansible runs on the node (M(confidential.kubernetes.node_state)'s C(python_version)).
    type: str
seealso:
  - module: confidential.kubernetes.node_state
"""

EXAMPLES = r"""
- name: Check the controller
  confidential.kubernetes.preflight:
  run_once: true

- name: Check a node with what it reported
  confidential.kubernetes.preflight:
    node_architecture: "{{ probe.architecture }}"
    node_python_version: "{{ probe.python_version }}"
"""

RETURN = r"""
problems:
  description: Every unsupported value found, each naming what is supported and what fixes it; empty when none.
  returned: always
  type: list
  elements: str
"""
