# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where the first control plane stands: initialised for a given cluster, or not.

An initialised node needs no init hand-over: sending it the sealed root secrets again would only expose them once more.
What proves "initialised for this cluster" is what the init hand-over and ``kubeadm init`` leave behind, each checked
against the cluster ID the controller derives from its own secrets (never one the node names):

- the lock record names that cluster and PCR 15 carries its mark (so the node was not rebooted since: a reboot resets
  PCR 15, and a rebooted node gets the whole attested hand-over, which marks it again);
- ``kubeadm init`` ran to the end for the node's cluster CA (its completion record, see ``Kubeadm.init_completed``);
- the node keeps the root secrets of that cluster (0600) for its join service.

Anything less - a fresh node, one locked but not initialised, an interrupted ``kubeadm init``, another cluster - is
"not initialised", with the reason; the init hand-over and ``kubeadm_init`` then act on it as they always have
(resume, or fail saying that the node needs a reset). Nothing here changes the node.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from .._crypto.root_secrets import RootSecrets, RootSecretsError
from .._files import file_sha256
from .._kubeadm import ADMIN_CONF, CA_CERT, Kubeadm, ca_cert_hash
from .._nodelock import NodeLock, NodeLockError


@dataclass(frozen=True)
class InitState:
    initialised: bool
    # Why the node is not initialised for the cluster ("" when it is).
    reason: str
    node_lock: dict
    # Whether kubeadm init wrote the admin kubeconfig (kube-vip starts with super-admin.conf before it exists).
    admin_kubeconfig_exists: bool
    # The SHA-256 (hex) of the admin kubeconfig of an initialised node, so that the controller fetches it only when its
    # copy differs.
    admin_kubeconfig_sha256: str | None = None
    # kubeadm's pin of the cluster CA of an initialised node, for the join record its boot-time join keeps.
    ca_cert_hash: str | None = None

    def to_result(self) -> dict:
        return {
            "initialised": self.initialised,
            "reason": self.reason,
            "node_lock": self.node_lock,
            "admin_kubeconfig_exists": self.admin_kubeconfig_exists,
            "admin_kubeconfig_sha256": self.admin_kubeconfig_sha256,
            "ca_cert_hash": self.ca_cert_hash,
        }


def _kept_cluster_id(secrets_file: str) -> tuple[str | None, str]:
    """The cluster ID of the root secrets the node keeps for its join service, or None and why not."""
    try:
        info = os.stat(secrets_file)
        with open(secrets_file, "rb") as handle:
            document = json.load(handle)
    except FileNotFoundError:
        return None, f"the node keeps no root secrets ({secrets_file} is missing)"
    except (OSError, ValueError) as exc:
        return None, f"the root secrets the node keeps ({secrets_file}) are unreadable: {exc}"
    if info.st_mode & 0o777 != 0o600:
        return None, f"the root secrets the node keeps ({secrets_file}) are mode {info.st_mode & 0o777:04o}, not 0600"
    try:
        return RootSecrets.from_document(document, secrets_file).cluster_id().hex(), ""
    except RootSecretsError as exc:
        return None, str(exc)


def init_state(cluster_id: str | None, lock: NodeLock, kubeadm: Kubeadm, secrets_file: str) -> InitState:
    """Whether the node is initialised for ``cluster_id`` (hex; None: the controller has no cluster secrets yet).

    Raises TpmError when PCR 15 cannot be read: without it nothing can be decided.
    """
    admin_conf = kubeadm.path(ADMIN_CONF)
    exists = os.path.exists(admin_conf)
    try:
        lock_state = lock.state()
    except NodeLockError as exc:
        return InitState(False, str(exc), {}, exists)
    node_lock = lock_state.to_result()

    def not_initialised(reason: str) -> InitState:
        return InitState(False, reason, node_lock, exists)

    if cluster_id is None:
        return not_initialised("the controller holds no cluster secrets yet (a first init)")
    if not lock_state.locked:
        return not_initialised("the node is not locked")
    if lock_state.cluster_id != cluster_id:
        return not_initialised(f"the node is locked for cluster {lock_state.cluster_id}, not for {cluster_id}")
    if lock_state.pcr15_state != "marked":
        return not_initialised(
            f"PCR 15 does not carry the cluster's mark ({lock_state.pcr15_state}; a reboot resets it)"
        )
    if not exists:
        return not_initialised("kubeadm init has not written the admin kubeconfig")
    try:
        with open(kubeadm.path(CA_CERT), "rb") as handle:
            pin = ca_cert_hash(handle.read())
        completed = kubeadm.init_completed(pin)
    except (OSError, ValueError) as exc:
        return not_initialised(f"the cluster CA cannot be read: {exc}")
    if not completed:
        return not_initialised("kubeadm init did not run to the end")
    kept, why = _kept_cluster_id(secrets_file)
    if kept is None:
        return not_initialised(why)
    if kept != cluster_id:
        return not_initialised(f"the root secrets the node keeps are those of cluster {kept}")
    return InitState(True, "", node_lock, exists, file_sha256(admin_conf), pin)
