#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: join_service
short_description: Set up and run the join service on a control-plane node in one call
version_added: 0.2.0
description:
  - Takes the join service of this control plane to the state the options give, and decides in one place what needs
    to change, where the tasks it replaces each needed a round trip of their own.
  - First, the node must keep the cluster secrets (C(cluster-secrets.json) in O(config_dir), mode 0600); without them the
    module fails and changes nothing. Then it makes the configuration directory O(config_dir) (mode 0700).
  - The service's TLS certificate and key (C(joinservice.crt), C(joinservice.key)) are issued from the cluster CA in
    O(pki_dir) for O(tls_names) when missing, about to expire, issued by another CA, or lacking a name.
  - Each file given is written atomically, and only where its content or mode differs. The previous measurement policy
    and node enrolment are kept as backups, named C(<file>.<pid>.<timestamp>~) as M(ansible.builtin.copy) names them.
  - A changed unit file is reloaded into systemd, the unit enabled and started, and the running service restarted when
    something it reads only at start changed (its certificate, EK CA, configuration or unit file), or when O(restart)
    says so. The measurement policy and the node enrolment restart nothing, because the service re-reads them on change.
  - Last, the module waits until the service answers its health check (over TLS, verified against the cluster CA) with
    the measurement policy and node enrolment given here loaded. A file the service refuses to load fails the module
    with the service's own load error, and the previous file is put back from its backup, so that a restart finds a
    file the service can load; the service goes on enforcing the previous one meanwhile.
  - The file contents are passed as module arguments, never on a command line. None of them is secret (the measurement
    policy, the node enrolment with EK public keys and certificates, names and disk UUIDs, the EK CA certificates, the
    configuration and the unit); the cluster secrets and the TLS key are only ever written on the node.
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
requirements:
  - grpcio, protobuf and cryptography >= 47 on the node (the node environment the node role builds)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
attributes:
  check_mode:
    support: full
    details:
      - In check mode nothing is written or started and the service is not asked what it has loaded.
  diff_mode:
    support: full
    details:
      - Shows the files that change, before and after (never the TLS key or the cluster secrets, which it does not show).
  idempotent:
    support: full
options:
  config_dir:
    description: The service's configuration directory, which holds the cluster secrets.
    type: path
    default: /etc/confidential-kubernetes
  measurement_policy:
    description:
      - The measurement policy the service enforces, written to C(measurement-policy.yml) in O(config_dir) (0600; the
        previous one kept as a backup). The service re-reads it; the module waits until the service enforces it.
      - Unset, the file is left alone and not waited for.
    type: str
  enrolment:
    description:
      - The node enrolment (see M(confidential.kubernetes.node_enrolment)), written to C(node-enrolment.json) in
        O(config_dir) (0600; the previous one kept as a backup). The service re-reads it; the module waits until the
        service has loaded it.
      - Unset, the file is left alone and not waited for.
    type: str
  ek_ca:
    description: The EK CA certificates (PEM), written to C(ek-ca.pem) in O(config_dir) (0644). Unset, the file is left alone.
    type: str
  config:
    description: The service configuration (YAML), written to C(joinservice.yml) in O(config_dir) (0600). Unset, it is left alone.
    type: str
  unit:
    description: The systemd unit file, written to O(unit_name) in O(unit_dir) (0644). Unset, it is left alone.
    type: str
  unit_name:
    description: The service's systemd unit.
    type: str
    default: confidential-joinservice.service
  unit_dir:
    description: Where the unit file is installed.
    type: path
    default: /etc/systemd/system
  tls_names:
    description:
      - The IP addresses and DNS names the service's TLS certificate must hold. Empty leaves the certificate alone.
    type: list
    elements: str
    default: []
  tls_renew_before_days:
    description:
      - Issue the TLS certificate again (and restart the service) when fewer than this many days of it are left. The
        certificate lasts 365 days (or until the cluster CA expires, if that is sooner). A value above 365 renews it on
        every run (the renew playbook's forced renewal).
    type: int
    default: 30
  pki_dir:
    description: The cluster PKI directory (C(ca.crt), and C(ca.key) to issue the service certificate).
    type: path
    default: /etc/kubernetes/pki
  port:
    description: The port the service listens on; the module checks it at C(127.0.0.1).
    type: int
    default: 9290
  health_timeout:
    description: Seconds to wait for the service to serve with the files given loaded.
    type: int
    default: 60
  restart:
    description: Restart the running service even when nothing written here calls for it (its code changed).
    type: bool
    default: false
  only_if_installed:
    description:
      - Change nothing where the unit file is not installed yet (RV(installed=false)), for pushing the enrolment to every
        control plane of which some have not joined yet.
    type: bool
    default: false
seealso:
  - module: confidential.kubernetes.node_enrolment
  - module: confidential.kubernetes.measurements
"""

EXAMPLES = r"""
- name: Set up the join service
  confidential.kubernetes.join_service:
    measurement_policy: "{{ lookup('ansible.builtin.file', 'measurement-policy.yml', rstrip=false) }}"
    enrolment: "{{ lookup('ansible.builtin.file', 'secrets/node-enrolment.json', rstrip=false) }}"
    config: "{{ lookup('ansible.builtin.template', 'joinservice.yml.j2') }}"
    unit: "{{ lookup('ansible.builtin.template', 'confidential-joinservice.service.j2') }}"
    tls_names: ["{{ ansible_host }}", 127.0.0.1, "{{ inventory_hostname }}"]

- name: Push a new node enrolment to a control plane whose join service runs
  confidential.kubernetes.join_service:
    enrolment: "{{ lookup('ansible.builtin.file', 'secrets/node-enrolment.json', rstrip=false) }}"
    only_if_installed: true
"""

RETURN = r"""
installed:
  description: Whether the unit file is installed (false only with O(only_if_installed), when nothing was done).
  returned: success
  type: bool
files:
  description:
    - Per file given (V(policy), V(enrolment), V(ek_ca), V(config), V(unit)) its path, whether it changed, and the
      backup of the previous content (null when none was made).
  returned: success
  type: dict
  sample: {"policy": {"path": "/etc/confidential-kubernetes/measurement-policy.yml", "changed": true,
           "backup_file": "/etc/confidential-kubernetes/measurement-policy.yml.4242.2026-11-21@10:00:00~"}}
tls_certificate_changed:
  description: Whether the service's TLS certificate was (or would be) issued.
  returned: success
  type: bool
service_actions:
  description: The systemctl verbs run (or, in check mode, to run) - C(daemon-reload), C(enable), C(start), C(restart).
  returned: success
  type: list
  elements: str
  sample: [restart]
"""

import datetime

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.confidential.kubernetes.plugins.module_utils._files import backup_copy
from ansible_collections.confidential.kubernetes.plugins.module_utils._join import (
    joinservice_pb2,
    joinservice_pb2_grpc,
    servercert,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.daemon import (
    ENROLMENT,
    POLICY,
    Deployment,
    JoinServiceError,
    ServiceFile,
    Systemd,
    apply,
)

# Option -> (what the result calls it, file name in config_dir, mode, backup, re-read by the service on change).
FILES = {
    "measurement_policy": (POLICY, "measurement-policy.yml", 0o600, True, True),
    "enrolment": (ENROLMENT, "node-enrolment.json", 0o600, True, True),
    "ek_ca": ("ek_ca", "ek-ca.pem", 0o644, False, False),
    "config": ("config", "joinservice.yml", 0o600, False, False),
}


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            config_dir=dict(type="path", default="/etc/confidential-kubernetes"),
            # Nothing secret in any file given here (see the description); the secrets never pass through this module.
            measurement_policy=dict(type="str"),
            enrolment=dict(type="str"),
            ek_ca=dict(type="str"),
            config=dict(type="str"),
            unit=dict(type="str"),
            unit_name=dict(type="str", default="confidential-joinservice.service"),
            unit_dir=dict(type="path", default="/etc/systemd/system"),
            tls_names=dict(type="list", elements="str", default=[]),
            tls_renew_before_days=dict(type="int", default=30),
            pki_dir=dict(type="path", default="/etc/kubernetes/pki"),
            port=dict(type="int", default=9290),
            health_timeout=dict(type="int", default=60),
            restart=dict(type="bool", default=False),
            only_if_installed=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    params = module.params
    unit_path = f"{params['unit_dir']}/{params['unit_name']}"
    files = [
        ServiceFile(what, f"{params['config_dir']}/{name}", params[option].encode(), mode, backup, watched)
        for option, (what, name, mode, backup, watched) in FILES.items()
        if params[option] is not None
    ]
    if params["unit"] is not None:
        files.append(ServiceFile("unit", unit_path, params["unit"].encode(), 0o644))
    missing = joinservice_pb2.IMPORT_ERROR or joinservice_pb2_grpc.IMPORT_ERROR or servercert.CRYPTOGRAPHY_IMPORT_ERROR
    if missing is not None:
        module.fail_json(msg=missing_required_lib("grpcio, protobuf and cryptography"), exception=str(missing))
    deployment = Deployment(
        config_dir=params["config_dir"],
        unit_path=unit_path,
        files=files,
        tls_names=params["tls_names"],
        pki_dir=params["pki_dir"],
        endpoint=f"127.0.0.1:{params['port']}",
        health_timeout=params["health_timeout"],
        restart=params["restart"],
        only_if_installed=params["only_if_installed"],
        tls_renew_before=datetime.timedelta(days=params["tls_renew_before_days"]),
    )
    try:
        result = apply(deployment, Systemd(params["unit_name"]), module.check_mode, backup_copy, module._diff)
    except JoinServiceError as exc:
        module.fail_json(msg=str(exc), **exc.result)
    except OSError as exc:
        module.fail_json(msg=f"cannot set up the join service: {exc}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
