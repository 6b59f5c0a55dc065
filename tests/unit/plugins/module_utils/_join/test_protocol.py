"""The sealed messages as types: the bytes on the wire are the ones the dict-built tickets had, and parsing is strict
(wrong version, a missing or unknown field, a wrong type: refused, naming the field)."""

from __future__ import annotations

import base64
import json
import pickle

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto import derive
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import RootSecrets
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.protocol import (
    CONTROL_PLANE_FILE_MODES,
    ControlPlaneFile,
    JoinTicket,
    ProtocolError,
    RecoverHandOver,
    RejoinTicket,
)

SECRETS = RootSecrets(bytes(range(32)), bytes(range(32, 64)), bytes(range(64, 96)))
MEASUREMENT_SECRET = SECRETS.measurement_secret()
CLUSTER_ID = SECRETS.cluster_id()
DISK_UUID = "0a1b2c3d-0000-4000-8000-000000000000"
DISK_KEY = derive.state_disk_key(SECRETS.master_key, SECRETS.master_salt, DISK_UUID)
PKI = {name: (f"content of {name}\n".encode(), mode) for name, mode in CONTROL_PLANE_FILE_MODES.items()}


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def _old_identity_payload() -> dict:
    """As issuance.TicketIssuer._identity_payload built it before the types."""
    return {
        "version": 1,
        "cluster_id": CLUSTER_ID.hex(),
        "measurement_secret": _b64(MEASUREMENT_SECRET),
        "measurement_salt": _b64(SECRETS.measurement_salt),
        "state_disk_key": _b64(DISK_KEY),
    }


def _old_join_payload(control_plane: bool) -> dict:
    """As issuance.TicketIssuer.reserve_join and JoinCrypto.seal_ticket built it before the types."""
    payload = _old_identity_payload()
    files = PKI if control_plane else {}
    payload.update(
        {
            "node_name": "cp-2" if control_plane else "worker-1",
            "control_plane": control_plane,
            "api_server_endpoint": "10.0.0.10:6443",
            "bootstrap_token": "abcdef.0123456789abcdef",
            "ca_cert_hashes": ["sha256:" + "ab" * 32],
            "ca_crt": "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n",
            "control_plane_files": {
                name: {"content": _b64(content), "mode": f"{mode:04o}"} for name, (content, mode) in files.items()
            },
            "kubernetes_version": "v1.34.4",
        }
    )
    if control_plane:
        payload["cluster_secrets"] = SECRETS.to_document()
    payload = dict(payload, kubelet_client_crt="-----BEGIN CERTIFICATE-----\nkubelet\n-----END CERTIFICATE-----\n")
    return payload


def _old_bytes(payload: dict) -> bytes:
    """How JoinCrypto.seal_ticket encoded a payload before it was sealed."""
    return json.dumps(payload, sort_keys=True).encode()


def _join_ticket(control_plane: bool) -> JoinTicket:
    return JoinTicket(
        node_name="cp-2" if control_plane else "worker-1",
        control_plane=control_plane,
        cluster_id=CLUSTER_ID,
        measurement_secret=MEASUREMENT_SECRET,
        measurement_salt=SECRETS.measurement_salt,
        state_disk_key=DISK_KEY,
        api_server_endpoint="10.0.0.10:6443",
        bootstrap_token="abcdef.0123456789abcdef",
        ca_cert_hashes=("sha256:" + "ab" * 32,),
        ca_crt="-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n",
        kubelet_client_crt="-----BEGIN CERTIFICATE-----\nkubelet\n-----END CERTIFICATE-----\n",
        control_plane_files=tuple(ControlPlaneFile(n, c, m) for n, (c, m) in PKI.items()) if control_plane else (),
        kubernetes_version="v1.34.4",
        cluster_secrets=SECRETS if control_plane else None,
    )


def _rejoin_ticket() -> RejoinTicket:
    return RejoinTicket(CLUSTER_ID, MEASUREMENT_SECRET, SECRETS.measurement_salt, DISK_KEY)


MESSAGES = {
    "worker join ticket": (lambda: _join_ticket(False), lambda: _old_bytes(_old_join_payload(False))),
    "control-plane join ticket": (lambda: _join_ticket(True), lambda: _old_bytes(_old_join_payload(True))),
    "rejoin ticket": (_rejoin_ticket, lambda: _old_bytes(_old_identity_payload())),
    # As _ticket.recover.RecoverHandOver.to_bytes wrote it before the types.
    "recover hand-over": (
        lambda: RecoverHandOver.for_disk(SECRETS, DISK_UUID.upper()),
        lambda: json.dumps(
            {
                "version": 1,
                "flow": "recover",
                "disk_uuid": DISK_UUID,
                "state_disk_key": _b64(DISK_KEY),
                "measurement_secret": _b64(MEASUREMENT_SECRET),
                "measurement_salt": _b64(SECRETS.measurement_salt),
            },
            sort_keys=True,
        ).encode(),
    ),
}


@pytest.mark.parametrize("name", MESSAGES)
def test_the_type_writes_the_bytes_the_dict_did(name):
    build, old = MESSAGES[name]
    assert build().to_bytes() == old()


@pytest.mark.parametrize("name", MESSAGES)
def test_round_trip(name):
    message = MESSAGES[name][0]()
    again = type(message).from_bytes(message.to_bytes())
    assert again == message and again.to_bytes() == message.to_bytes()
    # Tickets travel to the service's worker processes pickled.
    assert pickle.loads(pickle.dumps(message)) == message


def _document(name: str) -> dict:
    return json.loads(MESSAGES[name][1]())


def _message_type(name: str) -> type:
    return type(MESSAGES[name][0]())


def _every_field():
    for name in MESSAGES:
        for field_name in _document(name):
            yield name, field_name


@pytest.mark.parametrize("name,field_name", list(_every_field()))
def test_a_missing_field_is_refused_by_name(name, field_name):
    document = {k: v for k, v in _document(name).items() if k != field_name}
    if field_name == "cluster_secrets":
        expected = "must carry 'cluster_secrets' for a control plane"
    elif field_name in ("version", "flow"):
        expected = "is not a version 1"
    else:
        expected = f"lacks field\\(s\\): {field_name}$"
    with pytest.raises(ProtocolError, match=expected) as refused:
        _message_type(name).from_bytes(json.dumps(document).encode())
    assert refused.value.field == ("version" if field_name == "flow" else field_name)


@pytest.mark.parametrize("name", MESSAGES)
def test_an_unknown_field_is_refused_by_name(name):
    document = dict(_document(name), expected_pcrs="00")
    with pytest.raises(ProtocolError, match="has unknown field\\(s\\): expected_pcrs") as refused:
        _message_type(name).from_bytes(json.dumps(document).encode())
    assert refused.value.field == "expected_pcrs"


@pytest.mark.parametrize("name", MESSAGES)
@pytest.mark.parametrize("version", [2, 0, "1", 1.0, True, None])
def test_another_version_is_refused(name, version):
    document = dict(_document(name), version=version)
    with pytest.raises(ProtocolError, match="is not a version 1 ") as refused:
        _message_type(name).from_bytes(json.dumps(document).encode())
    assert refused.value.field == "version"


def test_a_hand_over_of_another_flow_is_refused():
    with pytest.raises(ProtocolError, match="not a version 1 recover hand-over"):
        RecoverHandOver.from_bytes(json.dumps(dict(_document("recover hand-over"), flow="rejoin")).encode())


WRONG_TYPES = {
    "node_name": ["", 7, None],
    "control_plane": [1, "false", None],
    "cluster_id": ["AB" * 32, "ab" * 31, 5],
    "measurement_secret": ["%%%", _b64(b"short"), 32],
    "state_disk_key": [_b64(bytes(33)), None],
    "bootstrap_token": ["", ["abcdef.0123456789abcdef"]],
    "ca_cert_hashes": [[], "sha256:ab", [""], [7]],
    "kubelet_client_crt": ["", None],
    "kubernetes_version": [None, 1.34],
    "control_plane_files": [[], "ca.crt"],
}


@pytest.mark.parametrize("field_name,value", [(f, v) for f, values in WRONG_TYPES.items() for v in values])
def test_a_field_of_the_wrong_type_is_refused_by_name(field_name, value):
    document = dict(_document("worker join ticket"), **{field_name: value})
    with pytest.raises(ProtocolError, match=repr(field_name)) as refused:
        JoinTicket.from_bytes(json.dumps(document).encode())
    assert refused.value.field == field_name


CONTROL_PLANE_FILE_FAULTS = {
    "a file no ticket carries": (
        {"kubelet.key": {"content": "", "mode": "0600"}},
        "kubelet.key",
        "unexpected control-plane file 'kubelet.key'",
    ),
    "a mode that is not octal": ({"ca.key": {"content": "", "mode": "600"}}, "ca.key.mode", "octal mode"),
    "content not base64": ({"ca.key": {"content": "%%", "mode": "0600"}}, "ca.key.content", "is not base64"),
    "an entry with more": (
        {"ca.key": {"content": "", "mode": "0600", "owner": "root"}},
        "ca.key",
        "exactly 'content' and 'mode'",
    ),
}


@pytest.mark.parametrize("case", CONTROL_PLANE_FILE_FAULTS)
def test_a_control_plane_file_at_fault_is_refused_by_name(case):
    files, where, expected = CONTROL_PLANE_FILE_FAULTS[case]
    document = dict(_document("control-plane join ticket"), control_plane_files=files)
    with pytest.raises(ProtocolError, match=expected) as refused:
        JoinTicket.from_bytes(json.dumps(document).encode())
    assert refused.value.field == f"control_plane_files.{where}"


def test_root_secrets_go_to_control_planes_only():
    worker = dict(_document("worker join ticket"), cluster_secrets=SECRETS.to_document())
    with pytest.raises(ProtocolError, match="for a control plane and only for one"):
        JoinTicket.from_bytes(json.dumps(worker).encode())
    secrets = dict(SECRETS.to_document(), master_iv=_b64(bytes(16)))
    control_plane = dict(_document("control-plane join ticket"), cluster_secrets=secrets)
    with pytest.raises(ProtocolError, match="'cluster_secrets' has unknown field\\(s\\): master_iv") as refused:
        JoinTicket.from_bytes(json.dumps(control_plane).encode())
    assert refused.value.field == "cluster_secrets"


@pytest.mark.parametrize("data", [b"not json", b"\xff\xfe", b"[1]", b"null"])
def test_what_is_no_json_object_is_refused(data):
    with pytest.raises(ProtocolError, match="rejoin ticket"):
        RejoinTicket.from_bytes(data)


def test_secrets_stay_out_of_repr():
    text = repr(_join_ticket(True))
    for secret in (MEASUREMENT_SECRET, DISK_KEY, SECRETS.master_key):
        assert repr(secret) not in text and _b64(secret) not in text
    assert "abcdef.0123456789abcdef" not in text and "worker" not in text and "cp-2" in text
