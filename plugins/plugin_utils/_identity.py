# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cluster ID as the controller derives it from the root secrets (never from what a node claims)."""

from __future__ import annotations

from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto import derive
from ansible_collections.confidential.kubernetes.plugins.plugin_utils._secrets import ClusterSecrets


def cluster_id(secrets: ClusterSecrets) -> bytes:
    measurement_secret = derive.measurement_secret(secrets.master_key, secrets.master_salt)
    return derive.cluster_id(measurement_secret, secrets.measurement_salt)
