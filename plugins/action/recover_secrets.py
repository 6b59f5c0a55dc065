# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Runs on the controller: attest a control plane that waits for keys, then seal its recover hand-over to it."""

from __future__ import annotations

import base64
import os

from ansible.plugins.action import ActionBase

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import controller
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import (
    NODE_LOCK_PCR,
    PolicyError,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.verifier import VerificationError
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto import seal
from ansible_collections.confidential.kubernetes.plugins.module_utils._files import FileTooLargeError, read_bounded
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.protocol import RECOVER, RecoverHandOver
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.registry import (
    RegistryError,
    parse_bindings,
    parse_enrolment,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.request import ek_identity
from ansible_collections.confidential.kubernetes.plugins.plugin_utils._attest import (
    HAND_OVER_OPTIONS,
    attest,
    evidence_argument_refusal,
)
from ansible_collections.confidential.kubernetes.plugins.plugin_utils._secrets import (
    SOURCE_OPTIONS,
    ClusterSecretsError,
    load_from,
)

MAX_ENROLMENT_BYTES = 16 * 1024 * 1024

ARGUMENT_SPEC = dict(
    HAND_OVER_OPTIONS,
    policy=dict(type="path", required=True),
    **SOURCE_OPTIONS,
    enrolment_file=dict(type="path", required=True),
    node_name=dict(type="str", required=True),
    disk_uuid=dict(type="str", required=True),
    bindings_mirrors=dict(type="dict", default={}),
    verifier_id=dict(type="str", default="confidential.kubernetes/controller"),
)


class Refused(Exception):
    """The node gets nothing; ``reason`` is the refusal's code (evidence, not-enrolled, not-a-control-plane, name-not-granted,
    disk-not-bound), which the play names per refused node."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def _bound_disk(enrolment_file: str, ek: str, node_name: str, mirrors: dict | None = None) -> str:
    """The disk bound to this EK, which must be enrolled as the control plane ``node_name``: the disk the controller
    enrolled for it, or (enrolled before its first join, without a disk) the disk its join bound, as the disk-binding
    mirrors of the other control planes (``mirrors``: host -> file content) agree on, under its current enrolment."""
    path = os.path.expanduser(enrolment_file)
    try:
        text = read_bounded(path, MAX_ENROLMENT_BYTES)
    except OSError as exc:
        raise Refused("not-enrolled", f"cannot read the controller's enrolment {path}: {exc.strerror}") from None
    except FileTooLargeError as exc:
        raise Refused("not-enrolled", f"the controller's enrolment {exc}") from None
    try:
        enrolled = parse_enrolment(text, path).by_ek.get(ek)
    except RegistryError as exc:
        raise Refused("not-enrolled", str(exc)) from None
    if enrolled is None:
        raise Refused("not-enrolled", f"its TPM (EK {ek[:16]}...) is not enrolled in {path}")
    if not enrolled.control_plane:
        raise Refused(
            "not-a-control-plane",
            f"its TPM is enrolled as worker {enrolled.node_name}, not as a control "
            "plane: workers rejoin through a join service once a control plane serves",
        )
    if enrolled.node_name != node_name:
        raise Refused("name-not-granted", f"its TPM is enrolled as {enrolled.node_name}, not as {node_name}")
    if enrolled.disk_uuid:
        return enrolled.disk_uuid
    bound = set()
    for host, text in sorted((mirrors or {}).items()):
        try:
            bindings = parse_bindings(text.encode() if isinstance(text, str) else text, f"the disk bindings of {host}")
        except RegistryError as exc:
            raise Refused("disk-not-bound", str(exc)) from None
        bound |= {b.disk_uuid for b in bindings if b.ek == ek and b.enrolment_id == enrolled.enrolment_id}
    if len(bound) > 1:
        raise Refused(
            "disk-not-bound",
            f"the control planes' disk bindings disagree on the disk of {node_name}: {', '.join(sorted(bound))}",
        )
    if not bound:
        raise Refused(
            "disk-not-bound",
            f"no state disk is enrolled for {node_name} in {path}, and no other control "
            "plane's disk bindings name one for its TPM",
        )
    return bound.pop()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        refusal = evidence_argument_refusal(self._task.args)
        if refusal:
            result.update(refusal)
            return result
        validation, dummy = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        params = validation.validated_parameters
        host = task_vars.get("inventory_hostname")
        result["changed"] = False
        try:
            secrets = load_from(params, self._loader)
            # A control plane that waits for keys was rebooted: its PCR 15 must be zero (not yet marked in this boot).
            policy = controller.resolve_policy(params["policy"], None, None).with_rule(NODE_LOCK_PCR, [bytes(32)])
            verified = attest(self, params, policy, task_vars, prove_ek=True)
            ek = ek_identity(verified.evidence.ek_public)
            disk_uuid = _bound_disk(params["enrolment_file"], ek, params["node_name"], params["bindings_mirrors"])
            if disk_uuid.lower() != params["disk_uuid"].lower():
                raise Refused(
                    "disk-not-bound",
                    f"it reports state disk {params['disk_uuid']}, but the disk enrolled for it is {disk_uuid}",
                )
            hand_over = RecoverHandOver.for_disk(secrets, disk_uuid)
            sealed = seal.seal(
                hand_over.to_bytes(),
                verified.evidence.user_data,
                RECOVER,
                bytes.fromhex(params["nonce"]),
                params["verifier_id"],
            )
        except (ClusterSecretsError, PolicyError, seal.SealError) as exc:
            result.update(failed=True, msg=str(exc))
            return result
        except VerificationError as exc:
            result.update(failed=True, **exc.to_result())
            pcrs = ", ".join(str(mismatch.get("pcr")) for mismatch in exc.mismatches)
            which = f": PCR {pcrs}" if pcrs else ""
            result["msg"] = f"{host} gets nothing: its attestation failed ({exc.reason}{which}): {exc}"
            result["refused"] = "evidence"
            return result
        except Refused as exc:
            result.update(failed=True, refused=exc.reason, msg=f"{host} gets nothing ({exc.reason}): {exc}")
            return result
        result.update(
            changed=True,
            cluster_id=secrets.cluster_id().hex(),
            disk_uuid=disk_uuid,
            sealed=base64.b64encode(sealed).decode(),
            verifier_id=params["verifier_id"],
            attestation=verified.to_result(),
        )
        return result
