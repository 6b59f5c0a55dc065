# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The options etcd_snapshot and etcd_restore share (doc fragment _etcd), and their etcdctl built from them."""

from __future__ import annotations

from .etcd import Etcdctl


def etcd_argument_spec() -> dict:
    return dict(
        etcdctl_path=dict(type="path", default="etcdctl"),
        endpoint=dict(type="str", default="https://127.0.0.1:2379"),
        cacert=dict(type="path", default="/etc/kubernetes/pki/etcd/ca.crt"),
        cert=dict(type="path", default="/etc/kubernetes/pki/etcd/healthcheck-client.crt"),
        # Paths, not secrets.
        key=dict(type="path", default="/etc/kubernetes/pki/etcd/healthcheck-client.key", no_log=False),
        secrets_file=dict(type="path", default="/etc/confidential-kubernetes/cluster-secrets.json", no_log=False),
        work_dir=dict(type="path", default="/run/confidential-kubernetes/etcd-snapshot"),
    )


def etcdctl(module) -> Etcdctl:
    """etcdctl run through the module's run_command (argv, never a shell), with the v3 API."""
    params = module.params

    def runner(argv: list) -> tuple:
        return module.run_command(argv, environ_update={"ETCDCTL_API": "3"})

    return Etcdctl(
        binary=params["etcdctl_path"],
        endpoint=params["endpoint"],
        cacert=params["cacert"],
        cert=params["cert"],
        key=params["key"],
        runner=runner,
    )
