# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kubelet skew check a join makes once it has opened its ticket and before it takes the node lock.

The cluster's version reaches the node only inside the sealed ticket (the join service's ``kubernetes_version``).
"""

from __future__ import annotations

from . import TicketError
from .._kubeadm.preflight import PreflightError, check_kubelet_skew


def check_cluster_version(cluster_version: str, kubelet_version: str) -> None:
    """Refuse a ticket whose cluster version (its ``kubernetes_version``) the node's kubelet may not join; nothing to
    compare when either is unknown."""
    if not kubelet_version or not cluster_version:
        return
    try:
        check_kubelet_skew(kubelet_version, cluster_version)
    except PreflightError as exc:
        raise TicketError(f"{exc}; the node was not locked") from None
