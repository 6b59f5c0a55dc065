"""Evidence encoding attacks (issue 25, from fuzzing): against the real join service (gRPC over TLS, real swtpm) and
the controller's seal_init_secrets action. Each document is a genuine quote changed in its encoding only; each is
refused with its reason, and the attacker obtains nothing (no token, no sealed secret).
"""

from __future__ import annotations

import base64
import json
from types import SimpleNamespace

import grpc
import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import controller, issuer, tpm2
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import dump_policy
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.seal import EphemeralKey
from ansible_collections.confidential.kubernetes.plugins.module_utils._join import joinservice_pb2 as pb2

from join_harness import (
    activate,
    assert_refused,
    bound_user_data,
    evidence_for,
    join_request,
    make_csr,
    policy_from_swtpm,
)

_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _duplicate_key(text: str) -> str:
    """PCR 0 twice in the sha256 bank: zeros first, the quoted value last (json.loads keeps the last)."""
    document = json.loads(text)
    bank = json.dumps(document["pcrs"]["sha256"])
    return text.replace(bank, '{"0": "' + base64.b64encode(bytes(32)).decode() + '", ' + bank[1:], 1)


def _padding_bits(text: str) -> str:
    document = json.loads(text)
    name = next(n for n in ("ak_public", "signature", "quote", "user_data") if document[n].endswith("="))
    value = document[name]
    stripped = value.rstrip("=")
    document[name] = stripped[:-1] + _ALPHABET[_ALPHABET.index(stripped[-1]) | 1] + value[len(stripped) :]
    return json.dumps(document)


def _ek_bit(offset_of, bit: int):
    def change(text: str) -> str:
        document = json.loads(text)
        raw = bytearray(base64.b64decode(document["ek_public"]))
        raw[offset_of(raw)] ^= 1 << bit
        document["ek_public"] = base64.b64encode(bytes(raw)).decode()
        return json.dumps(document)

    return change


ATTACKS = {
    # (change to the genuine evidence text, gRPC status, reason, words of the refusal)
    "duplicate PCR key, zeros first": (
        _duplicate_key,
        grpc.StatusCode.INVALID_ARGUMENT,
        "malformed",
        "repeats the key '0'",
    ),
    "base64 with padding bits set": (
        _padding_bits,
        grpc.StatusCode.INVALID_ARGUMENT,
        "malformed",
        "not canonical base64",
    ),
    "version 1.0": (
        lambda t: t.replace('"version": 1', '"version": 1.0', 1),
        grpc.StatusCode.INVALID_ARGUMENT,
        "malformed",
        "expected 1, an integer",
    ),
    "version true": (
        lambda t: t.replace('"version": 1', '"version": true', 1),
        grpc.StatusCode.INVALID_ARGUMENT,
        "malformed",
        "expected 1, an integer",
    ),
    "nested 500 deep": (
        lambda t: t.replace('"pcrs": ', '"x": ' + "[" * 500 + "]" * 500 + ', "pcrs": ', 1),
        grpc.StatusCode.INVALID_ARGUMENT,
        "malformed",
        "objects and arrays",
    ),
    "5 KB variant echoed": (
        lambda t: t.replace('"variant": "tpm"', '"variant": "' + "A" * 5000 + '"', 1),
        grpc.StatusCode.INVALID_ARGUMENT,
        "malformed",
        "(5002 characters)",
    ),
    # EK objectAttributes is bytes 4..7: clear adminWithPolicy (bit 7 of the last byte), set userWithAuth (bit 6).
    "EK without adminWithPolicy": (
        _ek_bit(lambda raw: 7, 7),
        grpc.StatusCode.PERMISSION_DENIED,
        "ek-template",
        "L-1/H-1",
    ),
    "EK with userWithAuth": (_ek_bit(lambda raw: 7, 6), grpc.StatusCode.PERMISSION_DENIED, "ek-template", "L-1/H-1"),
    # authPolicy's digest starts at byte 10 (after type, nameAlg, attributes and its size).
    "EK with another authPolicy": (
        _ek_bit(lambda raw: 10, 0),
        grpc.StatusCode.PERMISSION_DENIED,
        "ek-template",
        "L-1/H-1",
    ),
}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_join_evidence_in_a_non_canonical_encoding(join_lab, attack, name):
    change, code, reason, words = ATTACKS[name]
    service = join_lab.start("pcrs-only")
    stub, channel = join_lab.stub(service)
    csr = make_csr("worker-1")
    with channel:
        nonce = stub.GetNonce(pb2.GetNonceRequest()).nonce
        genuine = evidence_for(
            join_lab.swtpm.tcti, nonce, bound_user_data(EphemeralKey.generate().public_bytes(), csr=csr)
        )
        changed = change(genuine.decode()).encode()
        assert changed != genuine
        error = assert_refused(
            lambda: stub.IssueJoinTicket(join_request(join_lab.swtpm.tcti, nonce, b"", csr=csr, evidence=changed)),
            code,
            reason,
        )
        assert words in error.details() and len(error.details()) < 600, error.details()
        # The control: the genuine text of the same quote is answered with a challenge, and the node joins.
        challenge = stub.IssueJoinTicket(join_request(join_lab.swtpm.tcti, nonce, b"", csr=csr, evidence=genuine))
        assert activate(stub, join_lab.swtpm.tcti, challenge, nonce).sealed_ticket
    attack.obtained("bootstrap token(s) minted for the changed evidence", len(service.minter.tokens) - 1)


def test_the_ek_bit_offsets_above_are_the_fields_they_name(swtpm):
    with issuer.Tpm(swtpm.tcti) as tpm:
        ek = tpm2.parse_public(tpm.endorsement_key()[2])
    assert ek.raw[4:8] == ek.attributes.to_bytes(4, "big") and ek.attributes & 0x80 and not ek.attributes & 0x40
    assert ek.raw[10:42] == ek.auth_policy


def _seal_init(tmp_path, swtpm, evidence: object, nonce_hex: str) -> dict:
    from ansible.parsing.dataloader import DataLoader
    from ansible_collections.confidential.kubernetes.plugins.action.seal_init_secrets import ActionModule

    policy_file = tmp_path / "policy.json"
    policy_file.write_text(dump_policy(policy_from_swtpm(swtpm.tcti, "pcrs-only")))
    args = dict(
        evidence=evidence,
        nonce=nonce_hex,
        nonce_ledger=str(tmp_path / "ledger"),
        policy=str(policy_file),
        secrets_file=str(tmp_path / "secrets.json"),
    )
    task = SimpleNamespace(
        args=args,
        async_val=0,
        check_mode=False,
        diff=False,
        no_log=False,
        action="confidential.kubernetes.seal_init_secrets",
    )
    action = ActionModule(
        task, SimpleNamespace(_shell=SimpleNamespace(tmpdir="/nonexistent")), None, DataLoader(), None, None
    )
    return action.run(task_vars={"inventory_hostname": "cp-1"})


@pytest.mark.parametrize("case", ["nonce with a trailing newline", "evidence nested 500 deep", "genuine (control)"])
def test_init_evidence_encoding(tmp_path, swtpm, attack, case):
    """The controller's init hand-over: the nonce hex with one more character, and a 500-deep evidence object (which
    raised RecursionError in Ansible's argument validation before our code ran)."""
    nonce = controller.nonce_store(str(tmp_path / "ledger")).issue()
    with issuer.Tpm(swtpm.tcti) as tpm:
        evidence: object = issuer.issue_evidence(tpm, nonce, EphemeralKey.generate().public_bytes()).to_json()
    nonce_hex = nonce.hex()
    if case == "nonce with a trailing newline":
        nonce_hex += "\n"
    elif case == "evidence nested 500 deep":
        for dummy in range(500):
            evidence = {"a": evidence}
    result = _seal_init(tmp_path, swtpm, evidence, nonce_hex)
    if case == "genuine (control)":
        assert not result.get("failed") and result["sealed"], result
        return
    assert result["failed"] and result["reason"] == ("nonce" if "nonce" in case else "malformed"), result
    attack.obtained("sealed init secrets", int("sealed" in result))
    attack.obtained("cluster secrets generated", int((tmp_path / "secrets.json").exists()))
