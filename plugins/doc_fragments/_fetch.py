# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # The options kubernetes_artifacts and container_images share (plugin_utils._artifacts.FETCH_ARGUMENT_SPEC).
    DOCUMENTATION = r"""
options:
  architectures:
    description:
      - The nodes' machine names as Ansible reports them (C(ansible_architecture)) - C(x86_64) or C(aarch64).
        What is fetched covers each distinct architecture.
    type: list
    elements: str
    default: [x86_64]
  cache_dir:
    description: The controller directory holding verified artefacts (images go to its C(images/) directory).
    type: path
    default: ~/.cache/confidential-kubernetes/artifacts
  mirror_url:
    description:
      - A base URL serving the mirror's tree the module's description names, used instead of upstream (for example
        C(https://mirror.example.com/k8s)).
    type: str
    default: ""
  source_dir:
    description:
      - A local directory holding the mirror's tree the module's description names, read instead of any network;
        mutually exclusive with O(mirror_url).
    type: path
    default: ""
  timeout:
    description: Seconds to wait for the mirror or upstream server before a download fails.
    type: int
    default: 60
"""
