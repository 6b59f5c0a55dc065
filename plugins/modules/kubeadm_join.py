#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: kubeadm_join
short_description: Join a node to the cluster with kubeadm, pinned to the cluster CA
version_added: 0.1.0
description:
  - Renders a JoinConfiguration in the config API the installed kubeadm reads (V(v1beta4) from 1.31, V(v1beta3) from
    1.22, V(v1beta2) before) with bootstrap-token discovery pinned to the cluster CA (C(caCertHashes);
    C(unsafeSkipCAVerification) is never used), validates it with C(kubeadm config validate) (kubeadm 1.26 and later;
    older kubeadm validates it itself before C(kubeadm join) changes anything) and runs C(kubeadm join).
  - The bootstrap token is read from O(token_file) on the node (written 0600 by M(confidential.kubernetes.join_ticket))
    and travels to kubeadm in a 0600 configuration file, never on the command line. Both files are deleted after the join.
  - Control planes join with C(controlPlane.localAPIEndpoint) and skip kubeadm's C(control-plane-prepare/download-certs)
    phase, because the join ticket already placed their PKI files.
  - Nothing changes on a node that has joined (C(/etc/kubernetes/kubelet.conf) exists), except that a control plane
    deletes kubeadm's ClusterRoleBindings that give bootstrap tokens certificate rights wherever they exist (after
    its join and on every later run; see RV(revoked_token_bindings)).
  - With O(preflight=true) nothing is joined; the module makes the checks the join role runs before the node has a
    ticket, and so before the node lock. The installed kubeadm's and kubelet's versions (C(kubeadm version -o short),
    C(kubelet --version)) must equal O(kubernetes_version) when it is set, and C(kubeadm join phase preflight) runs the
    checks kubeadm makes before discovery (root, an empty C(/etc/kubernetes/manifests), no C(kubelet.conf),
    C(bootstrap-kubelet.conf) or, on workers, C(ca.crt), the container runtime, port 10250, swap, the kubelet,
    required binaries, C(ip_forward), C(bridge-nf-call-iptables)). Discovery is a local placeholder file that kubeadm
    cannot parse, so nothing is dialled. kubeadm's control-plane checks (ports 6443, 2379, 2380, 10257, 10259, the etcd
    directory) and image pulls need the cluster's configuration and run only in the join itself.
    O(api_server_endpoint) and O(ca_cert_hashes) are not needed. In check mode C(kubeadm join phase preflight) does not
    run. A joined node is not checked again.
  - The cluster's version is compared with the kubelet's (the skew policy) by M(confidential.kubernetes.join_ticket),
    after it opened the ticket and before it locks the node.
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
  - confidential.kubernetes._kubeadm
  - confidential.kubernetes._kubeadm.preflight
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
    details:
      - The configuration holds the bootstrap token, so it is not shown.
  idempotent:
    support: full
options:
  api_server_endpoint:
    description: The control-plane endpoint (host:port) to discover the cluster at. Required unless O(preflight=true).
    type: str
  ca_cert_hashes:
    description: CA pins, C(sha256:) and the hex SHA-256 of the CA's SubjectPublicKeyInfo. Required unless O(preflight=true).
    type: list
    elements: str
  token_file:
    description: File on the node holding the bootstrap token (mode 0600). Deleted after a successful join.
    type: path
    default: /run/confidential-kubernetes/join-token
  node_name:
    description: The node name (defaults to the host name, as kubeadm does).
    type: str
  control_plane:
    description: Join as a control plane.
    type: bool
    default: false
  advertise_address:
    description: For control planes, the address this node's API server advertises.
    type: str
  bind_port:
    description: For control planes, this node's API server port.
    type: int
    default: 6443
  skip_phases:
    description: Further kubeadm join phases to skip.
    type: list
    elements: str
    default: []
  kubernetes_version:
    description: With O(preflight=true), the version the installed kubeadm and kubelet must have (empty, any).
    type: str
    default: ""
    version_added: 0.2.0
"""

EXAMPLES = r"""
- name: Join the node
  confidential.kubernetes.kubeadm_join:
    api_server_endpoint: "{{ join_ticket.api_server_endpoint }}"
    ca_cert_hashes: "{{ join_ticket.ca_cert_hashes }}"
    control_plane: "{{ inventory_hostname in groups['control_plane'] }}"
    advertise_address: "{{ ansible_host }}"
"""

RETURN = r"""
kubelet_kubeconfig:
  description: The kubelet kubeconfig of the joined node.
  returned: success
  type: str
config_api_version:
  description: The kubeadm config API used.
  returned: success
  type: str
config_validated:
  description: Whether C(kubeadm config validate) checked the configuration before the join (kubeadm 1.26 and later).
  returned: when the node had not joined yet
  type: bool
revoked_token_bindings:
  description:
    - kubeadm's ClusterRoleBindings deleted (or, in check mode, to delete) because they give bootstrap tokens certificate
      rights (C(kubeadm:node-autoapprove-bootstrap), C(kubeadm:kubelet-bootstrap)); with them, any token holder gets a
      kubelet client certificate for any node name. The join service signs each node's kubelet certificate itself; the
      kubelet's renewal of its own certificate (C(kubeadm:node-autoapprove-certificate-rotation)) is kept.
  returned: on control planes with C(/etc/kubernetes/admin.conf)
  type: list
  elements: str
  sample: [kubeadm:node-autoapprove-bootstrap]
stdout:
  description: kubeadm's output, tokens and certificate keys masked.
  returned: when kubeadm join ran
  type: str
preflight:
  description:
    - V(passed) (every check ran), V(checked) (check mode, without C(kubeadm join phase preflight)) or V(joined) (the
      node has joined, nothing was checked).
  returned: with O(preflight=true)
  type: str
kubeadm_version:
  description: The installed kubeadm's version.
  returned: when O(preflight=true) checked the node
  type: str
kubelet_version:
  description: The installed kubelet's version, as C(kubelet --version) prints it (for M(confidential.kubernetes.join_ticket)).
  returned: when O(preflight=true) checked the node
  type: str
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import (
    ADMIN_CONF,
    KUBEADM_OPTIONS,
    TOKEN_FILE,
    JoinOptions,
    Kubeadm,
    KubeadmError,
    config_api_version,
    join_with_token_file,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm.preflight import (
    PREFLIGHT_OPTIONS,
    preflight_join,
)

OPTION_NAMES = list(JoinOptions.__dataclass_fields__)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            KUBEADM_OPTIONS,
            **PREFLIGHT_OPTIONS,
            kubernetes_version=dict(type="str", default=""),
            api_server_endpoint=dict(type="str"),
            ca_cert_hashes=dict(type="list", elements="str"),
            token_file=dict(type="path", default=TOKEN_FILE, no_log=False),
            node_name=dict(type="str"),
            control_plane=dict(type="bool", default=False),
            advertise_address=dict(type="str"),
            bind_port=dict(type="int", default=6443),
            skip_phases=dict(type="list", elements="str", default=[]),
        ),
        required_if=[("preflight", False, ("api_server_endpoint", "ca_cert_hashes"))],
        supports_check_mode=True,
    )
    params = module.params
    kubeadm = Kubeadm(params["binary_path"])
    options = JoinOptions(**{name: params[name] for name in OPTION_NAMES})
    try:
        if params["preflight"]:
            module.exit_json(
                **preflight_join(
                    kubeadm,
                    options,
                    config_api_version(kubeadm.version(), params["config_api_version"]),
                    params["kubernetes_version"],
                    params["kubelet_binary_path"],
                    params["ignore_preflight_errors"],
                    module.check_mode,
                )
            )
        result = join_with_token_file(
            kubeadm,
            options,
            params["token_file"],
            params["ignore_preflight_errors"],
            params["config_api_version"],
            module.check_mode,
        )
        if options.control_plane and os.path.exists(ADMIN_CONF):
            result["revoked_token_bindings"] = kubeadm.revoke_token_certificate_rights(ADMIN_CONF, module.check_mode)
            result["changed"] = result["changed"] or bool(result["revoked_token_bindings"])
    except KubeadmError as exc:
        module.fail_json(msg=str(exc), **exc.result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
