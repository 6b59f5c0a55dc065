#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: kubeadm_upgrade
short_description: Upgrade a node's control plane or kubelet configuration with kubeadm upgrade apply or node
version_added: 0.2.0
description:
  - With O(mode=apply), on the first control plane, runs C(kubeadm upgrade apply <kubernetes_version> --yes); kubeadm
    checks its own version policy again, pulls the images, replaces the static pods one by one and waits for each, then
    re-creates its RBAC rules. Nothing is run when the node's C(kube-apiserver) static pod already runs the version.
  - After it (and on a re-run), kubeadm's ClusterRoleBindings that give bootstrap tokens certificate rights
    (C(kubeadm:node-autoapprove-bootstrap), C(kubeadm:kubelet-bootstrap)), which C(upgrade apply) re-creates as
    C(kubeadm init) does, are deleted again, as after init and control-plane joins (see RV(revoked_token_bindings)).
  - With O(mode=node), on every other node, runs C(kubeadm upgrade node) - a control plane's static pods and every
    node's kubelet configuration from the cluster's. A control plane whose C(kube-apiserver) static pod already runs
    the version is left alone; on a worker the command runs each time (the upgrade playbook runs it only for a node
    whose kubelet does not run the version yet).
  - The installed kubeadm must be of O(kubernetes_version) (the node role's stack of that version, installed by the
    upgrade playbook before this).
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
attributes:
  check_mode:
    support: full
    details:
      - Reports whether kubeadm would run and which bindings would be deleted; runs nothing that changes the node.
  diff_mode:
    support: none
  idempotent:
    support: partial
    details:
      - O(mode=apply) and O(mode=node) on a control plane change nothing when the static pods run the version;
        O(mode=node) on a worker runs C(kubeadm upgrade node) every time.
options:
  kubernetes_version:
    description: The version to upgrade to (C(v1.21.3), C(1.21.3)); a pre-release needs O(allow_pre_release).
    type: str
    required: true
  mode:
    description: C(apply) on the first control plane, C(node) on every other node.
    type: str
    choices: [apply, node]
    required: true
  allow_pre_release:
    description:
      - Pass C(--allow-experimental-upgrades) to C(kubeadm upgrade apply), which refuses a pre-release target
        (such as C(v1.20.3-lab.1)) without it.
    type: bool
    default: false
  ignore_preflight_errors:
    description:
      - kubeadm checks to ignore in C(kubeadm upgrade apply) and C(kubeadm upgrade node) (C(ImagePull) where images
        cannot be pulled; C(CreateJob), C(kubeadm upgrade apply)'s health check that runs a Job, where no Pod can run).
    type: list
    elements: str
    default: []
  binary_path:
    description: The kubeadm to run.
    type: path
    default: kubeadm
"""

EXAMPLES = r"""
- name: Upgrade the first control plane
  confidential.kubernetes.kubeadm_upgrade:
    kubernetes_version: v1.36.4
    mode: apply

- name: Upgrade another node's control plane or kubelet configuration
  confidential.kubernetes.kubeadm_upgrade:
    kubernetes_version: v1.36.4
    mode: node
"""

RETURN = r"""
ran:
  description: Whether kubeadm upgrade ran (in check mode, would run).
  type: bool
  returned: always
running_version:
  description: The version the node's C(kube-apiserver) static pod ran before; empty on a worker.
  type: str
  returned: always
stdout:
  description: kubeadm's output (secrets masked).
  type: str
  returned: when kubeadm ran
revoked_token_bindings:
  description: The bindings deleted after C(kubeadm upgrade apply) (in check mode, those that would be).
  type: list
  elements: str
  returned: O(mode=apply)
"""

import os

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import (
    ADMIN_CONF,
    Kubeadm,
    KubeadmError,
    scrub,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm.upgrade import (
    KUBE_APISERVER_MANIFEST,
    Upgrade,
    UpgradeRefused,
    Version,
    static_pod_version,
)

try:
    import yaml
except ImportError:
    yaml = None


def running_version() -> str:
    """The version the local kube-apiserver static pod runs; empty without one (a worker)."""
    try:
        with open(KUBE_APISERVER_MANIFEST, encoding="utf-8") as stream:
            return static_pod_version(yaml.safe_load(stream) or {})
    except FileNotFoundError:
        return ""


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            kubernetes_version=dict(type="str", required=True),
            mode=dict(type="str", required=True, choices=["apply", "node"]),
            allow_pre_release=dict(type="bool", default=False),
            ignore_preflight_errors=dict(type="list", elements="str", default=[]),
            binary_path=dict(type="path", default="kubeadm"),
        ),
        supports_check_mode=True,
    )
    if yaml is None:
        module.fail_json(msg=missing_required_lib("PyYAML"))
    params = module.params
    upgrade = Upgrade(Kubeadm(params["binary_path"]))
    try:
        target = str(Version.parse(params["kubernetes_version"]))
        running = running_version()
        pending = running != target
        result = dict(changed=pending, ran=pending, running_version=running)
        if pending and not module.check_mode:
            if params["mode"] == "apply":
                output = upgrade.apply(target, params["allow_pre_release"], params["ignore_preflight_errors"])
            else:
                output = upgrade.node(params["ignore_preflight_errors"])
            result["stdout"] = scrub(output)
        if params["mode"] == "apply" and os.path.exists(ADMIN_CONF):
            result["revoked_token_bindings"] = upgrade.revoke_token_rights(module.check_mode)
            result["changed"] = result["changed"] or bool(result["revoked_token_bindings"])
    except (KubeadmError, UpgradeRefused) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
