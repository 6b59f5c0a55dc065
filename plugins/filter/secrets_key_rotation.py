# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Secrets key rotation's plan over every control plane's reading (logic in module_utils/_kubeadm/encryption.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
name: secrets_key_rotation
short_description: Which Secrets key rotation to run, from every control plane's key generations
version_added: 0.2.0
description:
  - From the M(confidential.kubernetes.secrets_encryption) result (O(confidential.kubernetes.secrets_encryption#module:step=read))
    of every control plane, the rotation to run - from generation C(old) to C(new) - and every reason none may run.
  - When every control plane holds the same single generation, a new rotation to the next generation starts;
    when two generations are named (a rotation cut short), that rotation is resumed.
  - A cluster from before encryption at rest (API servers not started with the file, no generation but 0) is turned
    on instead (C(enable), generation 0), also when a run that turned it on was cut short.
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
options:
  _input:
    description: Host name -> that host's C(secrets_encryption) result.
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Plan the rotation
  ansible.builtin.set_fact:
    plan: "{{ dict(ansible_play_hosts | zip(ansible_play_hosts | map('extract', hostvars, 'read')))
              | confidential.kubernetes.secrets_key_rotation }}"
"""

RETURN = r"""
_value:
  description: The plan.
  type: dict
  contains:
    problems:
      description: Every reason no rotation may run, each naming the host; empty when it may.
      type: list
      elements: str
    enable:
      description: Whether encryption at rest is turned on (generation 0) instead of a rotation.
      type: bool
    old:
      description: The generation the rotation starts from (none when it is turned on).
      type: int
    new:
      description: The generation it rotates to.
      type: int
    resumed:
      description: Whether it resumes a rotation that was cut short.
      type: bool
"""

from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm.encryption import secrets_key_plan


def secrets_key_rotation(readings) -> dict:
    return secrets_key_plan(dict(readings or {}))


class FilterModule:
    def filters(self):
        return {"secrets_key_rotation": secrets_key_rotation}
