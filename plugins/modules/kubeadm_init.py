#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: kubeadm_init
short_description: Initialise the first Kubernetes control plane with kubeadm
version_added: 0.1.0
description:
  - Renders an InitConfiguration, a ClusterConfiguration and a KubeletConfiguration in the config API the installed
    kubeadm reads (V(v1beta4) from 1.31, V(v1beta3) from 1.22, V(v1beta2) before), has kubeadm validate them
    (C(kubeadm config validate) from 1.26, C(kubeadm config images list) before, which loads them the way C(kubeadm init)
    does) and runs C(kubeadm init).
  - Nothing changes when the node is already initialised (C(/etc/kubernetes/admin.conf) exists and an earlier run of this
    module recorded that C(kubeadm init) completed for the node's cluster CA). Where C(admin.conf) exists without that
    record, an earlier C(kubeadm init) may have been cut short (C(admin.conf) is written before the control plane
    starts), so the module asks the control plane for its bootstrap tokens; when it answers, the init is recorded as
    complete (and the 24-hour token deleted), otherwise the task fails with V(needs_reset=true).
  - The 24-hour bootstrap token C(kubeadm init) mints is deleted again, because in this collection nodes join only with
    single-use tokens that the attested join service mints. Tokens and certificate keys are masked in all output.
  - kubeadm's ClusterRoleBindings that let bootstrap tokens create node client CSRs and have them approved for any node
    name are deleted as well (also when an interrupted init is completed); see RV(revoked_token_bindings).
  - If C(kubeadm init) fails, the task fails with kubeadm's error and V(needs_reset=true); a node that already took the
    node lock must be reset (C(kubeadm reset) and a reboot) before it can be initialised again.
  - With O(preflight=true) nothing is initialised; the module makes the checks the init role runs before the node
    lock. The installed kubeadm's and kubelet's versions (C(kubeadm version -o short), C(kubelet --version)) must equal
    O(kubernetes_version) when it is set, the rendered configuration is validated as above, and
    C(kubeadm init phase preflight) runs on it with O(ignore_preflight_errors). That pulls the images kubeadm needs,
    so in check mode it does not run. A failure names what to fix. An initialised node is not checked again.
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
  - confidential.kubernetes._kubeadm
  - confidential.kubernetes._kubeadm.preflight
attributes:
  check_mode:
    support: full
    details:
      - Renders and, where kubeadm is installed, validates the configuration; runs nothing else.
  diff_mode:
    support: full
    details:
      - Shows the rendered configuration against the one of the last run.
  idempotent:
    support: full
options:
  node_name:
    description: The node name (defaults to the host name, as kubeadm does).
    type: str
  advertise_address:
    description: The address the API server advertises on this node.
    type: str
  bind_port:
    description: The API server's port on this node.
    type: int
    default: 6443
  control_plane_endpoint:
    description: A stable address (DNS name or load balancer, with port) for all control planes.
    type: str
  kubernetes_version:
    description:
      - The Kubernetes version, for example V(v1.36.4).
      - Omitted, the version of the installed kubeadm, so that kubeadm never looks a version up on the internet.
    type: str
  image_repository:
    description:
      - The registry kubeadm takes the control plane's images from (its C(imageRepository)), for example a site
        registry C(registry.example.com/k8s); kubeadm's default (C(registry.k8s.io)) when omitted.
      - The node role's containerd takes its pause image from the same registry.
    type: str
  cluster_name:
    description: The cluster name in the kubeconfigs.
    type: str
  cert_sans:
    description: Extra Subject Alternative Names for the API server certificate.
    type: list
    elements: str
    default: []
  pod_subnet:
    description: The pod network CIDR.
    type: str
  service_subnet:
    description: The service network CIDR.
    type: str
  api_server_extra_args:
    description: Extra flags for kube-apiserver.
    type: dict
    default: {}
  encryption_provider_config:
    description:
      - The API servers' C(EncryptionConfiguration) (Kubernetes Secrets encrypted at rest in etcd, written by
        M(confidential.kubernetes.init_ticket) from the root secrets). Given, kube-apiserver gets
        C(--encryption-provider-config) with this path and the file is mounted read-only into its pod at the same
        path (C(apiServer.extraVolumes)); kubeadm keeps both in the cluster's ClusterConfiguration, so control planes
        that join and upgrades keep them too. The file must exist before kubeadm init runs.
    type: path
  controller_manager_extra_args:
    description: Extra flags for kube-controller-manager.
    type: dict
    default: {}
  scheduler_extra_args:
    description: Extra flags for kube-scheduler.
    type: dict
    default: {}
  kubelet_config:
    description: Fields of the KubeletConfiguration.
    type: dict
    default: {}
  skip_phases:
    description: kubeadm init phases to skip.
    type: list
    elements: str
    default: []
  upload_certs:
    description: Upload the control-plane certificates to the kubeadm-certs Secret (not needed with the join service).
    type: bool
    default: false
  config_path:
    description: Where the rendered configuration is kept (mode 0600).
    type: path
    default: /etc/kubernetes/kubeadm-init.yaml
  ca_key_algorithm:
    description:
      - The key algorithm of the cluster's certificate authorities (C(ca), C(front-proxy-ca), C(etcd/ca)). The join service
        signs kubelet client certificates with the cluster CA's key, so V(ecdsa-p256) makes every join cheaper.
      - V(ecdsa-p256) with kubeadm 1.31 or later (config API V(v1beta4)) sets the ClusterConfiguration's
        C(encryptionAlgorithm) to C(ECDSA-P256). With older kubeadm the module makes the three CAs on the node before
        C(kubeadm init), as kubeadm would (ten years, CA:true, key mode 0600), and kubeadm uses them; a CA already in
        C(/etc/kubernetes/pki) is kept, and one with its certificate or its key missing fails the task.
      - V(rsa-2048) is kubeadm's own default.
      - Like the rest of the configuration, it counts only when the node is initialised; later runs change nothing.
    type: str
    choices: [rsa-2048, ecdsa-p256]
    default: rsa-2048
    version_added: 0.2.0
"""

EXAMPLES = r"""
- name: Initialise the control plane
  confidential.kubernetes.kubeadm_init:
    control_plane_endpoint: "{{ ansible_host }}:6443"
    advertise_address: "{{ ansible_host }}"
    kubernetes_version: v1.36.4
    pod_subnet: 10.244.0.0/16
    service_subnet: 10.96.0.0/12
    cert_sans: ["{{ ansible_host }}"]
  register: kubeadm_init
"""

RETURN = r"""
admin_kubeconfig:
  description: Path of the admin kubeconfig on the node (mode 0600).
  returned: success
  type: str
ca_cert_hash:
  description: The CA pin joining nodes use, C(sha256:) and the hex SHA-256 of the CA's SubjectPublicKeyInfo.
  returned: when the node is initialised
  type: str
config_api_version:
  description: The kubeadm config API used.
  returned: success
  type: str
config_validated:
  description: Whether kubeadm validated the rendered configuration before anything changed.
  returned: when the node was not initialised yet
  type: bool
generated_cas:
  description:
    - The CAs made with ECDSA P-256 keys before C(kubeadm init) (paths in C(/etc/kubernetes/pki) without C(.crt)/C(.key)),
      or that would be in check mode.
  returned: when O(ca_key_algorithm=ecdsa-p256), kubeadm is older than 1.31 and the node was not initialised yet
  type: list
  elements: str
  sample: [ca, front-proxy-ca, etcd/ca]
deleted_default_tokens:
  description: How many default bootstrap tokens of C(kubeadm init) were deleted.
  returned: when kubeadm init ran
  type: int
revoked_token_bindings:
  description:
    - kubeadm's ClusterRoleBindings deleted right after C(kubeadm init) because they give bootstrap tokens certificate
      rights (C(kubeadm:node-autoapprove-bootstrap), C(kubeadm:kubelet-bootstrap)); with them, any token holder gets a
      kubelet client certificate for any node name. The join service signs each node's kubelet certificate itself; the
      kubelet's renewal of its own certificate (C(kubeadm:node-autoapprove-certificate-rotation)) is kept.
  returned: when kubeadm init ran
  type: list
  elements: str
  sample: [kubeadm:node-autoapprove-bootstrap, kubeadm:kubelet-bootstrap]
stdout:
  description: kubeadm's output, tokens and certificate keys masked.
  returned: when kubeadm init ran
  type: str
preflight:
  description:
    - V(passed) (every check ran), V(checked) (check mode, without C(kubeadm init phase preflight)) or V(initialised)
      (the node was initialised, nothing was checked).
  returned: with O(preflight=true)
  type: str
kubeadm_version:
  description: The installed kubeadm's version.
  returned: when O(preflight=true) checked the node
  type: str
kubelet_version:
  description: The installed kubelet's version, as C(kubelet --version) prints it.
  returned: when O(preflight=true) checked the node
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import (
    KUBEADM_OPTIONS,
    InitOptions,
    Kubeadm,
    KubeadmError,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm.ca import CA_KEY_ALGORITHMS
from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm.init import (
    DEFAULT_CONFIG_PATH,
    InitRun,
    check_before_init,
    initialise,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm.preflight import PREFLIGHT_OPTIONS

OPTION_NAMES = list(InitOptions.__dataclass_fields__)
RUN_NAMES = list(InitRun.__dataclass_fields__)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            KUBEADM_OPTIONS,
            **PREFLIGHT_OPTIONS,
            node_name=dict(type="str"),
            advertise_address=dict(type="str"),
            bind_port=dict(type="int", default=6443),
            control_plane_endpoint=dict(type="str"),
            kubernetes_version=dict(type="str"),
            image_repository=dict(type="str"),
            cluster_name=dict(type="str"),
            cert_sans=dict(type="list", elements="str", default=[]),
            pod_subnet=dict(type="str"),
            service_subnet=dict(type="str"),
            api_server_extra_args=dict(type="dict", default={}),
            encryption_provider_config=dict(type="path", no_log=False),
            controller_manager_extra_args=dict(type="dict", default={}),
            scheduler_extra_args=dict(type="dict", default={}),
            kubelet_config=dict(type="dict", default={}),
            skip_phases=dict(type="list", elements="str", default=[]),
            upload_certs=dict(type="bool", default=False),
            config_path=dict(type="path", default=DEFAULT_CONFIG_PATH),
            ca_key_algorithm=dict(type="str", choices=list(CA_KEY_ALGORITHMS), default="rsa-2048"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    kubeadm = Kubeadm(params["binary_path"])
    options = InitOptions(**{name: params[name] for name in OPTION_NAMES})
    run = InitRun(**{name: params[name] for name in RUN_NAMES})
    try:
        if params["preflight"]:
            result = check_before_init(kubeadm, options, run, params["kubelet_binary_path"], module.check_mode)
        else:
            result = initialise(kubeadm, options, run, module.check_mode, module._diff)
    except KubeadmError as exc:
        module.fail_json(msg=str(exc), **exc.result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
