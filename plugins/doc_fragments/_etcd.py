# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # etcdctl and the node's copy of the root secrets, shared by etcd_snapshot and etcd_restore.
    DOCUMENTATION = r"""
options:
  etcdctl_path:
    description: The etcdctl binary (v3 API; 3.4 or later) on the node.
    type: path
    default: etcdctl
  endpoint:
    description: The etcd member to talk to, as kubeadm's static pod serves it on a control plane.
    type: str
    default: https://127.0.0.1:2379
  cacert:
    description: The etcd CA certificate.
    type: path
    default: /etc/kubernetes/pki/etcd/ca.crt
  cert:
    description: An etcd client certificate (kubeadm's health-check client by default).
    type: path
    default: /etc/kubernetes/pki/etcd/healthcheck-client.crt
  key:
    description: The key of O(cert). A path, not a key.
    type: path
    default: /etc/kubernetes/pki/etcd/healthcheck-client.key
  secrets_file:
    description:
      - The node's copy of the cluster's root secrets (mode 0600), which the join service of every control plane
        holds. The snapshot key is derived from it on the node (HKDF-SHA256 of the master key and salt, info C(key-etcdBackup)), so no key
        travels for a backup or a restore. A path, not a secret.
    type: path
    default: /etc/confidential-kubernetes/cluster-secrets.json
  work_dir:
    description:
      - Where the plaintext snapshot lives while it is encrypted or restored (made 0700). Keep it on C(/run) or the
        state disk; the plaintext is deleted whatever happens.
    type: path
    default: /run/confidential-kubernetes/etcd-snapshot
requirements:
  - cryptography on the node
  - etcdctl on the node
"""
