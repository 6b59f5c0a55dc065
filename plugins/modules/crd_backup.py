#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: crd_backup
short_description: Back up every CRD and custom resource, and an upgrade's charts and values, to the controller
version_added: 0.1.0
description:
  - Runs on the controller with the official C(kubernetes) Python client and the controller's copy of the admin
    kubeconfig. Taken before a Helm upgrade (Constellation's C(upgrade apply) backups); if it fails, do not upgrade.
  - Creates a new directory C(<backup_dir>/upgrade-<UTC time>) (0700) and writes
    C(backups/crds/<crd name>.yaml) for every CRD and C(backups/<group>/<version>/<namespace>/<Kind>/<name>.yaml) for
    every custom resource of every served version of every CRD (cluster-scoped resources have no namespace level).
  - Each file is the object exactly as the API serves it, as block YAML in the served key order, including
    C(status), C(metadata.managedFields), C(resourceVersion) and C(uid) (a restore removes C(resourceVersion) and
    C(uid), for example with C(kubectl create) after editing). Files are 0600, directories 0700.
  - For every entry of O(releases) it also saves the merged user values as C(values/<namespace>/<release>.yaml) and
    a copy of a local chart (archive or directory) with a C(reference.json) under C(charts/<namespace>/<release>/).
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
  - confidential.kubernetes._attributes.action
  - confidential.kubernetes._helm.releases
attributes:
  check_mode:
    support: full
    details:
      - Writes nothing.
  diff_mode:
    support: none
  idempotent:
    support: none
    details:
      - Every run writes a new backup directory.
options:
  kubeconfig:
    description: The admin kubeconfig on the controller.
    type: path
    required: true
  context:
    description: The kubeconfig context.
    type: str
  backup_dir:
    description: The controller directory under which the C(upgrade-<UTC time>) directory is made.
    type: path
    required: true
requirements:
  - kubernetes (Python) on the controller
seealso:
  - module: confidential.kubernetes.helm_release
"""

EXAMPLES = r"""
- name: Back up CRDs and custom resources before upgrading
  confidential.kubernetes.crd_backup:
    kubeconfig: "{{ inventory_dir }}/secrets/admin.conf"
    backup_dir: "{{ inventory_dir }}/upgrades"
    releases:
      - release_name: coredns
        release_namespace: kube-system
        chart_ref: charts/coredns-1.36.1.tgz
  register: backup
"""

RETURN = r"""
backup_path:
  description: The new C(upgrade-<UTC time>) directory (null in check mode).
  returned: always
  type: str
crds:
  description: How many CRDs were saved.
  returned: success
  type: int
custom_resources:
  description: How many custom resources were saved (one per served version).
  returned: success
  type: int
files:
  description: How many files were written.
  returned: success
  type: int
"""
