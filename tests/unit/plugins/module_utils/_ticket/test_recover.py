"""The recover hand-over: a member rebooted while no join service answers waits for keys; the hand-over (sealed to a
fresh ephemeral key, flow recover) makes it a member again. Real swtpm, real cryptsetup on a file; the controller's
enrolment checks of the recover_secrets action against a real enrolment file."""

from __future__ import annotations

import base64
import json
import os

import pytest

from ansible_collections.confidential.kubernetes.plugins.action.recover_secrets import Refused, _bound_disk
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import node_lock_mark
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto import seal
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import RootSecrets
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.protocol import ProtocolError
from ansible_collections.confidential.kubernetes.plugins.module_utils._ticket import (
    TicketError,
    cluster_id_of,
    recover as recovering,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._ticket.join import MEMBER, REBOOTED
from test_boot import _cluster_id, node  # noqa: F401  # pylint: disable=unused-import

NONCE = bytes(range(32))
VERIFIER = "confidential.kubernetes/controller"


def _secrets(join_lab, **changes) -> RootSecrets:
    return RootSecrets(**dict(join_lab.secrets, **changes))


def _seal_to_node(node, hand_over: recovering.RecoverHandOver) -> tuple[str, str]:
    """What the controller does after attesting the node: seal to the ephemeral key the node keeps (0600 under /run)."""
    key = seal.EphemeralKey.generate(seal.X25519)
    path = node.dir / "recover-ephemeral.key"
    path.write_bytes(key.private_bytes())
    path.chmod(0o600)
    sealed = seal.seal(hand_over.to_bytes(), key.public_bytes(), seal.RECOVER, NONCE, VERIFIER)
    return base64.b64encode(sealed).decode(), str(path)


def _waiting(node, start_swtpm):
    """A member rebooted with every join service gone; its boot-time join has reported waiting for keys."""
    node.run()
    node.reboot(start_swtpm)
    node.service.stop_now()
    node.settings.total_timeout = 1
    os.makedirs(os.path.dirname(node.config().status_file), exist_ok=True)
    with open(node.config().status_file, "w", encoding="utf-8") as handle:
        json.dump({"state": recovering.WAITING_FOR_KEYS}, handle)


def test_waiting_member_is_made_a_member_again_by_the_hand_over(node, join_lab, start_swtpm):
    _waiting(node, start_swtpm)
    standing = recovering.standing(node.joining(), node.config().status_file)
    assert (standing.node_state, standing.waiting) == (REBOOTED, True)
    hand_over = recovering.RecoverHandOver.for_disk(_secrets(join_lab), standing.disk_uuid)
    sealed, key_path = _seal_to_node(node, hand_over)
    opened = recovering.recover(node.joining(), sealed, NONCE.hex(), VERIFIER, key_path)
    assert opened["changed"] and opened["cluster_id"] == _cluster_id(join_lab).hex()
    assert not os.path.exists(key_path), "the ephemeral key opens one hand-over only"
    assert node.pcr15() == node_lock_mark(_cluster_id(join_lab)).hex() and node.key_opens(node.disk_key())
    assert node.joining().state() == MEMBER
    # The boot-time join, still waiting, finds the node a member at its next look and lets the kubelet start.
    assert node.run(sleep=lambda _seconds: None) == MEMBER and node.status()["state"] == MEMBER
    again = recovering.standing(node.joining(), node.config().status_file)
    assert (again.node_state, again.waiting) == (MEMBER, False) and "member" in again.reason


def test_hand_over_for_another_cluster_or_disk_changes_nothing(node, join_lab, start_swtpm):
    _waiting(node, start_swtpm)
    uuid = recovering.standing(node.joining(), node.config().status_file).disk_uuid
    other_cluster = recovering.RecoverHandOver.for_disk(_secrets(join_lab, measurement_salt=b"\x07" * 32), uuid)
    sealed, key_path = _seal_to_node(node, other_cluster)
    with pytest.raises(TicketError, match="hand-over is for cluster .*but this node joined"):
        recovering.recover(node.joining(), sealed, NONCE.hex(), VERIFIER, key_path)
    other_disk = recovering.RecoverHandOver.for_disk(_secrets(join_lab), "00000000-0000-4000-8000-000000000000")
    sealed, key_path = _seal_to_node(node, other_disk)
    with pytest.raises(TicketError, match="hand-over is for disk 00000000-.*but this node's state disk is"):
        recovering.recover(node.joining(), sealed, NONCE.hex(), VERIFIER, key_path)
    assert node.pcr15() == "00" * 32 and node.joining().state() == REBOOTED


def test_hand_over_opens_only_with_the_recover_flow_nonce_and_verifier(node, join_lab, start_swtpm):
    _waiting(node, start_swtpm)
    uuid = recovering.standing(node.joining(), node.config().status_file).disk_uuid
    sealed, key_path = _seal_to_node(node, recovering.RecoverHandOver.for_disk(_secrets(join_lab), uuid))
    with pytest.raises(TicketError, match="does not open"):
        recovering.recover(node.joining(), sealed, bytes(32).hex(), VERIFIER, key_path)
    assert node.pcr15() == "00" * 32


def test_rebooted_node_whose_boot_time_join_does_not_wait_is_not_handed_anything(node, start_swtpm):
    node.run()
    node.reboot(start_swtpm)
    standing = recovering.standing(node.joining(), node.config().status_file)
    assert (standing.node_state, standing.waiting) == (REBOOTED, False) and "does not wait for keys" in standing.reason


def test_hand_over_carries_the_disk_key_and_measurement_secret_only(join_lab):
    hand_over = recovering.RecoverHandOver.for_disk(_secrets(join_lab), "0A1B2C3D-0000-4000-8000-000000000000")
    document = json.loads(hand_over.to_bytes())
    assert sorted(document) == [
        "disk_uuid",
        "flow",
        "measurement_salt",
        "measurement_secret",
        "state_disk_key",
        "version",
    ]
    assert document["disk_uuid"] == "0a1b2c3d-0000-4000-8000-000000000000"
    secret_values = {
        base64.b64decode(document[name]) for name in ("measurement_salt", "measurement_secret", "state_disk_key")
    }
    assert join_lab.secrets["master_key"] not in secret_values and join_lab.secrets["master_salt"] not in secret_values
    assert cluster_id_of(recovering.RecoverHandOver.from_bytes(json.dumps(document).encode())) == cluster_id_of(
        hand_over
    )
    with pytest.raises(ProtocolError, match="not a version 1 recover hand-over"):
        recovering.RecoverHandOver.from_bytes(json.dumps(dict(document, flow="rejoin")).encode())


# ---- the controller's enrolment checks (recover_secrets)


@pytest.fixture
def enrolment(join_lab, other_swtpm):
    join_lab.enrol(join_lab.swtpm.tcti, "cp-0", control_plane=True, disk_uuid="11111111-1111-4111-8111-111111111111")
    join_lab.enrol(other_swtpm.tcti, "worker-0", disk_uuid="22222222-2222-4222-8222-222222222222")
    return {entry.node_name: entry.ek for entry in join_lab.enrolments.values()}


def test_enrolled_control_plane_gets_its_enrolled_disk(join_lab, enrolment):
    bound = _bound_disk(str(join_lab.enrolment_file), enrolment["cp-0"], "cp-0")
    assert bound == "11111111-1111-4111-8111-111111111111"


@pytest.mark.parametrize(
    "who, name, reason",
    [
        ("worker-0", "worker-0", "not-a-control-plane"),
        ("cp-0", "cp-1", "name-not-granted"),
        ("nobody", "cp-0", "not-enrolled"),
    ],
)
def test_tpm_not_enrolled_as_this_control_plane_is_refused(join_lab, enrolment, who, name, reason):
    with pytest.raises(Refused) as refused:
        _bound_disk(str(join_lab.enrolment_file), enrolment.get(who, "ab" * 32), name)
    assert refused.value.reason == reason


def test_control_plane_enrolled_without_a_disk_is_refused(join_lab, enrolment):
    join_lab.enrol(join_lab.swtpm.tcti, "cp-0", control_plane=True)
    with pytest.raises(Refused, match="no state disk is enrolled for cp-0") as refused:
        _bound_disk(str(join_lab.enrolment_file), enrolment["cp-0"], "cp-0")
    assert refused.value.reason == "disk-not-bound"


def _mirror(*bindings) -> str:
    return json.dumps(
        {
            "version": 1,
            "bindings": [
                {
                    "disk_uuid": disk,
                    "ek": ek,
                    "node_name": "cp-0",
                    "enrolment_id": enrolment_id,
                    "bound_at": "2026-01-01T00:00:00Z",
                }
                for ek, disk, enrolment_id in bindings
            ],
        }
    )


def test_control_plane_enrolled_before_its_join_gets_the_disk_the_other_mirrors_agree_on(join_lab):
    disk, other = "33333333-3333-4333-8333-333333333333", "44444444-4444-4444-8444-444444444444"
    ek = join_lab.enrol(join_lab.swtpm.tcti, "cp-0", control_plane=True, enrolment_id="0123456789abcdef")
    path = str(join_lab.enrolment_file)
    mirrors = {"cp-1": _mirror((ek, disk, "0123456789abcdef")), "cp-2": _mirror((ek, disk, "0123456789abcdef"))}
    assert _bound_disk(path, ek, "cp-0", mirrors) == disk
    with pytest.raises(Refused, match="disagree on the disk of cp-0"):
        _bound_disk(path, ek, "cp-0", dict(mirrors, **{"cp-2": _mirror((ek, other, "0123456789abcdef"))}))
    # A binding made under an older enrolment (the node was reset and enrolled again) no longer counts.
    with pytest.raises(Refused, match="no other control plane's disk bindings name one") as refused:
        _bound_disk(path, ek, "cp-0", {"cp-1": _mirror((ek, disk, "fedcba9876543210"))})
    assert refused.value.reason == "disk-not-bound"
