# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Runs on the controller: record nodes' TPM identities, names, roles and disks in the node enrolment file."""

from __future__ import annotations

import base64
import binascii
import hashlib
import os

from ansible.plugins.action import ActionBase

from ansible_collections.confidential.kubernetes.plugins.module_utils._join.registry import (
    Enrolment,
    RegistryError,
    merge_enrolment,
    parse_bindings,
    parse_enrolment,
)

ARGUMENT_SPEC = dict(
    enrolment_file=dict(type="path", required=True),
    absent=dict(type="list", elements="str", default=[]),
    # The cluster's disk bindings (the join services' mirrors: JSON documents of disk-bindings.json): a node is not
    # enrolled with a disk bound to another EK.
    disk_bindings=dict(type="list", elements="str", default=[], no_log=False),
    nodes=dict(
        type="list",
        elements="dict",
        default=[],
        options=dict(
            ek=dict(type="str", required=True),
            node_name=dict(type="str", required=True),
            control_plane=dict(type="bool", default=False),
            disk_uuid=dict(type="str"),
            ek_certificate=dict(type="str", no_log=False),
        ),
    ),
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        validation, dummy = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        params = validation.validated_parameters
        path = os.path.expanduser(params["enrolment_file"])
        try:
            nodes = [_enrolment(node) for node in params["nodes"]]
            bindings = tuple(
                binding
                for number, text in enumerate(params["disk_bindings"])
                for binding in parse_bindings(text.encode(), f"disk bindings {number}")
            )
            changed, content = merge_enrolment(path, nodes, self._task.check_mode, tuple(params["absent"]), bindings)
        except (RegistryError, OSError) as exc:
            result.update(failed=True, msg=f"cannot enrol the nodes in {path}: {exc}; nothing was changed")
            return result
        enrolled = parse_enrolment(content, path).by_ek.values()
        result.update(
            changed=changed,
            enrolment_file=path,
            digest=hashlib.sha256(content).hexdigest(),
            nodes={
                entry.node_name: {"ek": entry.ek, "control_plane": entry.control_plane, "disk_uuid": entry.disk_uuid}
                for entry in enrolled
            },
        )
        return result


def _enrolment(node: dict) -> Enrolment:
    certificate = None
    if node["ek_certificate"]:
        try:
            certificate = base64.b64decode(node["ek_certificate"], validate=True)
        except (binascii.Error, ValueError):
            raise RegistryError(f"node {node['node_name']}: ek_certificate is not base64") from None
    return Enrolment(
        node["ek"], node["node_name"], node["control_plane"], (node["disk_uuid"] or "").lower() or None, "", certificate
    )
