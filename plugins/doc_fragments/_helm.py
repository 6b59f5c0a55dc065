# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # How helm_release and helm_plan run helm on the node (module_utils._helm.HELM_OPTIONS).
    DOCUMENTATION = r"""
options:
  kubeconfig:
    description: The kubeconfig helm uses on the node (for example C(/etc/kubernetes/admin.conf)); helm's default when omitted.
    type: path
    aliases: [kubeconfig_path]
  context:
    description: The kubeconfig context.
    type: str
    aliases: [kube_context]
  binary_path:
    description: The helm binary on the node.
    type: path
    default: helm
"""

    # The upgrade role's release list as helm_plan and crd_backup take it (module_utils._helm.ROLE_RELEASE_OPTIONS).
    RELEASES = r"""
options:
  releases:
    description:
      - The releases of the upgrade, in order, as the C(confidential.kubernetes.upgrade) role takes them (options of
        M(confidential.kubernetes.helm_release)); O(releases[].chart_ref) and O(releases[].values_files) are
        controller paths.
    type: list
    elements: dict
    default: []
    suboptions:
      release_name:
        description: The release name.
        type: str
        required: true
        aliases: [name]
      release_namespace:
        description: The release namespace.
        type: str
        required: true
        aliases: [namespace]
      chart_ref:
        description:
          - A chart archive or directory on the controller, or a chart name in O(releases[].chart_repo_url).
          - M(confidential.kubernetes.crd_backup) copies a local chart and records a repository chart by reference.
        type: path
        required: true
      chart_version:
        description:
          - The chart version. Required for a repository chart (versions are pinned); for a local chart, when given, it
            must equal the version in its C(Chart.yaml).
        type: str
      chart_repo_url:
        description: The chart repository URL.
        type: str
      release_values:
        description: Values, merged over O(releases[].values_files) (V(no_log), they may hold credentials).
        type: dict
        default: {}
        aliases: [values]
      values_files:
        description: Values files on the controller, merged in order, then O(releases[].release_values) on top.
        type: list
        elements: path
        default: []
      skip_version_policy:
        description:
          - Skip the version policy for this release. M(confidential.kubernetes.helm_plan) defaults it to its own
            option of that name; M(confidential.kubernetes.crd_backup) ignores it.
        type: bool
      wait_timeout:
        description: Ignored (accepted so that the upgrade role's release list can be passed as it is).
        type: str
      atomic:
        description: Ignored (accepted so that the upgrade role's release list can be passed as it is).
        type: bool
      create_namespace:
        description: Ignored (accepted so that the upgrade role's release list can be passed as it is).
        type: bool
      force:
        description: Ignored (accepted so that the upgrade role's release list can be passed as it is).
        type: bool
"""
