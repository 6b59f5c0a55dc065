#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: cluster_identity
short_description: Derive the cluster ID and its PCR 15 mark from the root secrets (runs on the controller)
version_added: 0.1.0
description:
  - Reads the cluster's root secrets file on the controller (0600, ansible-vault aware) and returns the cluster ID and
    the PCR 15 value a node locked for this cluster must show. Attestation compares nodes against this, never against
    what a node claims.
  - Returns nothing secret.
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
  - confidential.kubernetes._root_secrets
  - confidential.kubernetes._attributes.action
  - confidential.kubernetes._attributes.INFO_MODULE
attributes:
  idempotent:
    support: full
"""

EXAMPLES = r"""
- name: Which cluster the nodes must belong to
  confidential.kubernetes.cluster_identity:
    secrets_file: "{{ playbook_dir }}/secrets/cluster-secrets.json"
  register: cluster
"""

RETURN = r"""
cluster_id:
  description: The cluster ID (hex).
  returned: success
  type: str
  sample: 128c164378fe8767f998fbdfe4b4d6463ec5ae1b664ea5999bc27417607ae9b6
node_lock_mark:
  description: The PCR 15 value (hex) of a node locked for this cluster, C(SHA-256(0^32 || SHA-256(cluster_id))).
  returned: success
  type: str
  sample: 23400370357e846478cce7cc0c76cdfe4da077cc57b36dee0f665ede2c8b3f2f
"""
