# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # Options kubeadm_init and kubeadm_join share.
    DOCUMENTATION = r"""
options:
  cri_socket:
    description: The CRI socket, when kubeadm cannot detect it.
    type: str
  kubelet_extra_args:
    description: Extra flags for the kubelet of this node.
    type: dict
    default: {}
  ignore_preflight_errors:
    description: Preflight checks whose errors are shown as warnings.
    type: list
    elements: str
    default: []
  config_api_version:
    description:
      - The kubeadm config API; V(auto) picks what the installed kubeadm reads - V(v1beta4) from kubeadm 1.31,
        V(v1beta3) from 1.22, V(v1beta2) before.
      - Phases to skip are in the configuration from V(v1beta3) on; with V(v1beta2) they go to kubeadm as C(--skip-phases).
    type: str
    choices: [auto, v1beta2, v1beta3, v1beta4]
    default: auto
  binary_path:
    description: The kubeadm binary.
    type: path
    default: kubeadm
"""

    # The checks before the node lock (module_utils._kubeadm.preflight.PREFLIGHT_OPTIONS); each module's description
    # says what it checks.
    PREFLIGHT = r"""
options:
  preflight:
    description:
      - Only make the checks before the node lock (the installed versions and kubeadm's own preflight, as the
        description says); change nothing.
    type: bool
    default: false
    version_added: 0.2.0
  kubelet_binary_path:
    description: The kubelet whose version O(preflight=true) compares with O(kubernetes_version).
    type: path
    default: kubelet
    version_added: 0.2.0
"""
