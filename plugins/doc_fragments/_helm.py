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
