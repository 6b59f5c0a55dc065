# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Debian packages a Kubernetes version's row names, read by the versions table's one parser."""

from __future__ import annotations

DOCUMENTATION = r"""
name: kubernetes_host_packages
short_description: The Debian packages kubeadm's preflight checks for in one Kubernetes version
version_added: 0.2.0
description:
  - The C(host_packages) of the row of the input version in the versions table
    (C(plugins/module_utils/_versions/kubernetes_versions.yml)), with O(extra) merged over it - the packages the node
    role installs when a node lacks them, before kubeadm runs.
  - An unknown version or a malformed row gives an empty list; the M(confidential.kubernetes.kubernetes_artifacts)
    action, which runs right after, refuses it naming the problem. The node role's probe uses this to learn, in its
    one round trip, which of these packages a node already has.
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
positional: extra
options:
  _input:
    description: The Kubernetes version (a leading C(v) is ignored).
    type: str
    required: true
  extra:
    description: Rows merged over the table (C(kubernetes_versions_extra)).
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: The packages kubeadm 1.32's preflight checks for
  ansible.builtin.debug:
    msg: "{{ '1.32.11' | confidential.kubernetes.kubernetes_host_packages }}"
"""

RETURN = r"""
_value:
  description: The row's Debian packages, in the row's order.
  type: list
  elements: str
"""

from ansible_collections.confidential.kubernetes.plugins.module_utils import _versions


def kubernetes_host_packages(version, extra=None) -> list[str]:
    table = _versions.merged_table(_versions.load_table(), extra or {})
    version = str(version).lstrip("v")
    row = table.get(version)
    if not isinstance(row, dict):
        return []
    packages = row.get("host_packages") or []
    if not isinstance(packages, list) or not all(isinstance(p, str) and _versions.PACKAGE.match(p) for p in packages):
        return []
    return list(packages)


class FilterModule:
    def filters(self):
        return {"kubernetes_host_packages": kubernetes_host_packages}
