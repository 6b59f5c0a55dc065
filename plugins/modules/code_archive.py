#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: code_archive
short_description: Pack this collection's code into a deterministic archive on the controller
version_added: 0.2.0
description:
  - Runs on the controller, in Ansible's own process (no module is sent anywhere, no command runs). Packs the
    collection's C(plugins/module_utils) into a tar archive at O(dest), each name under
    C(ansible_collections/confidential/kubernetes/), for the programs that run on a node without Ansible (the join
    service, the boot-time join) to import from C(PYTHONPATH).
  - The same code gives the same bytes on every controller - members in name order, modification time 0, owner and
    group 0 with no names, no C(__pycache__) - so a node compares one sha256 (RV(sha256)) to know whether its copy is
    current (M(confidential.kubernetes.node_state) with O(confidential.kubernetes.node_state#module:archive_sha256)).
  - O(dest) is written only when its bytes differ, whole (a temporary file renamed over it), so concurrent runs never
    read half an archive.
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
  - confidential.kubernetes._attributes.action
attributes:
  check_mode:
    support: full
    details:
      - Packs in memory and writes nothing; RV(sha256) is the archive's all the same. The C(node) role runs it with
        C(check_mode=false), so that check mode can compare the node's copy with the file.
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  dest:
    description: The archive's path on the controller.
    type: path
    required: true
"""

EXAMPLES = r"""
- name: Pack the collection's code
  confidential.kubernetes.code_archive:
    dest: /tmp/confidential-kubernetes-lib.tar
  run_once: true
  register: code

- name: Is the node's copy current?
  confidential.kubernetes.node_state:
    archive: /opt/confidential-kubernetes/lib.tar
    archive_dest: /opt/confidential-kubernetes/lib
    archive_sha256: "{{ code.sha256 }}"
"""

RETURN = r"""
dest:
  description: The archive's absolute path on the controller.
  returned: success
  type: str
  sample: /tmp/confidential-kubernetes-lib.tar
sha256:
  description: The archive's sha256.
  returned: success
  type: str
  sample: 0e5751c026e543b2e8ab2eb06099daa1d1e5df47778f7787faab45cdf12fe3a8
size:
  description: The archive's size in bytes.
  returned: success
  type: int
  sample: 522240
"""
