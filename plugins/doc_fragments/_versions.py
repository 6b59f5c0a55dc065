# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # How kubernetes_artifacts and container_images select a row of the versions table (plugin_utils._artifacts.row_of).
    DOCUMENTATION = r"""
options:
  kubernetes_version:
    description: The Kubernetes version whose row pins every artefact and image, for example C(1.36.4) (a leading C(v) is ignored).
    type: str
    required: true
  versions_file:
    description: The versions table; the collection's own by default.
    type: path
  versions_extra:
    description:
      - Rows merged over the table, keyed by version, in the table's format (a row here replaces a shipped row
        whole). Their URLs may be plain C(http) (a local mirror), and an artefact set to null says explicitly that
        the row provides none (for example a local build without crictl); shipped rows must be complete and C(https).
    type: dict
    default: {}
  allow_end_of_life:
    description:
      - Use a row whose Kubernetes minor is past its end of life. The roles set it from C(kubernetes_allow_end_of_life).
    type: bool
    default: false
  today:
    description: The day end of life is judged on (C(YYYY-MM-DD)); the controller's date when empty.
    type: str
    default: ""
"""
