#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: certificate_expiry
short_description: Report when a node's Kubernetes certificates expire
version_added: 0.2.0
description:
  - Reads the expiry of the certificates a node runs on. On a control plane (O(control_plane)) these are kubeadm's
    certificates and kubeconfigs, the ones C(kubeadm certs check-expiration) lists (C(apiserver), C(apiserver-kubelet-client),
    C(apiserver-etcd-client), C(front-proxy-client), C(etcd/server), C(etcd/peer), C(etcd/healthcheck-client),
    C(admin.conf), C(controller-manager.conf), C(scheduler.conf)), which C(kubeadm certs renew all) renews, and the
    three CAs, which it does not. On every node, the kubelet's client certificate. Plus any file in O(certificates).
  - Reports each file's expiry, the earliest per group, and the files below O(threshold_days) (a warning each) or
    expired. Files that are not there (a node that has not joined) are listed as missing, not an error; a file that is
    there but holds no certificate fails the module, naming it.
  - Reads files only, with the node's clock. Nothing secret is read or returned (certificates, never keys).
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
requirements:
  - cryptography >= 47 and PyYAML on the node (the node environment the node role builds)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
  - confidential.kubernetes._attributes.INFO_MODULE
attributes:
  idempotent:
    support: full
options:
  control_plane:
    description: Whether the node is a control plane, whose kubeadm certificates and kubeconfigs are read too.
    type: bool
    default: false
  kubernetes_dir:
    description: kubeadm's directory (its C(pki) directory and the kubeconfigs).
    type: path
    default: /etc/kubernetes
  kubelet_client_certificate:
    description: The kubelet's client certificate (the kubelet's certificate manager keeps it current).
    type: path
    default: /var/lib/kubelet/pki/kubelet-client-current.pem
  certificates:
    description: Further certificate files to report (group C(other)), such as the join service's TLS certificate.
    type: list
    elements: path
    default: []
  threshold_days:
    description: A certificate with less than this many days left is reported as expiring (and warned about).
    type: int
    default: 30
seealso:
  - module: confidential.kubernetes.join_service
"""

EXAMPLES = r"""
- name: Read when this control plane's certificates expire
  confidential.kubernetes.certificate_expiry:
    control_plane: true
    certificates: [/etc/confidential-kubernetes/joinservice.crt]
    threshold_days: 30
  register: expiry

- name: Fail for an expired certificate, naming it
  ansible.builtin.assert:
    that: expiry.expired | length == 0
    fail_msg: "expired: {{ expiry.expired | join(', ') }}"
"""

RETURN = r"""
certificates:
  description: Every file found, earliest expiry first.
  returned: success
  type: list
  elements: dict
  contains:
    path:
      description: The file.
      type: str
    group:
      description: C(control_plane) (kubeadm's files), C(kubelet) (the kubelet's client certificate) or C(other).
      type: str
    renewable:
      description: Whether C(kubeadm certs renew all) renews it.
      type: bool
    not_after:
      description: The certificate's expiry, UTC (C(YYYY-MM-DDTHH:MM:SSZ)).
      type: str
    days_left:
      description: Days until then (negative once expired).
      type: float
    status:
      description: C(ok), C(expiring) (fewer than O(threshold_days) left) or C(expired).
      type: str
  sample:
    - {path: /etc/kubernetes/admin.conf, group: control_plane, renewable: true, not_after: "2027-11-26T08:41:12Z",
       days_left: 364.99, status: ok}
control_plane:
  description: The earliest of kubeadm's files (C(certificates) entry); null on a worker or a node that has none.
  returned: success
  type: dict
control_plane_renewable:
  description: The earliest of the files C(kubeadm certs renew all) renews; null when there is none.
  returned: success
  type: dict
kubelet:
  description: The kubelet's client certificate (C(certificates) entry); null when it is not there.
  returned: success
  type: dict
expiring:
  description: The files with fewer than O(threshold_days) days left that have not expired.
  returned: success
  type: list
  elements: str
expired:
  description: The files whose certificate has expired.
  returned: success
  type: list
  elements: str
missing:
  description: The files looked for that are not there.
  returned: success
  type: list
  elements: str
threshold_days:
  description: O(threshold_days), as the report used it.
  returned: success
  type: float
"""

import datetime

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import expiry


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            control_plane=dict(type="bool", default=False),
            kubernetes_dir=dict(type="path", default="/etc/kubernetes"),
            kubelet_client_certificate=dict(type="path", default=expiry.KUBELET_CLIENT),
            certificates=dict(type="list", elements="path", default=[]),
            threshold_days=dict(type="int", default=30),
        ),
        supports_check_mode=True,
    )
    if expiry.IMPORT_ERROR is not None:
        module.fail_json(msg=missing_required_lib("cryptography >= 47 and PyYAML"), exception=str(expiry.IMPORT_ERROR))
    params = module.params
    if params["threshold_days"] < 0:
        module.fail_json(msg=f"threshold_days must not be negative, got {params['threshold_days']}")
    try:
        found, missing = expiry.scan(
            params["kubernetes_dir"],
            params["control_plane"],
            params["kubelet_client_certificate"],
            tuple(params["certificates"]),
        )
    except expiry.ExpiryError as exc:
        module.fail_json(msg=str(exc))
    now = datetime.datetime.now(datetime.timezone.utc)
    result = expiry.summary(found, missing, now, datetime.timedelta(days=params["threshold_days"]))
    for entry in result["certificates"]:
        if entry["status"] == expiry.EXPIRING:
            module.warn(
                f"{entry['path']} expires in {entry['days_left']:.1f} days ({entry['not_after']}), "
                f"less than {params['threshold_days']}"
            )
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
