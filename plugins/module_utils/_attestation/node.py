# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Node-side tasks behind the tpm_evidence and measurements modules."""

from __future__ import annotations

import base64
import binascii
import json
import os

from .._crypto import seal
from .._crypto.seal import MLKEM768_X25519, X25519, EphemeralKey
from .._files import write_private_file
from .evidence import EvidenceError
from .issuer import ALL_PCRS, Tpm, answer_challenge, issue_evidence
from .policy import MeasurementPolicy, PcrRule

CRYPTOGRAPHY_IMPORT_ERROR = seal.CRYPTOGRAPHY_IMPORT_ERROR
SUITES = {"mlkem768-x25519": MLKEM768_X25519, "x25519": X25519}
MAX_EVENT_LOG_BYTES = 256 * 1024


def decode_nonce(value: str) -> bytes:
    try:
        nonce = bytes.fromhex(value)
    except (ValueError, TypeError):
        raise EvidenceError("nonce must be 64 hex characters (32 bytes)") from None
    if len(nonce) != 32:
        raise EvidenceError(f"nonce must be 32 bytes, got {len(nonce)}")
    return nonce


def decode_b64(name: str, value: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise EvidenceError(f"{name} is not valid base64") from None


def read_event_log(path: str | None) -> list[dict]:
    if not path or not os.path.exists(path):
        return []
    with open(path, "rb") as handle:
        data = handle.read(MAX_EVENT_LOG_BYTES + 1)
    if len(data) > MAX_EVENT_LOG_BYTES:
        raise EvidenceError(f"event log {path} is larger than {MAX_EVENT_LOG_BYTES} bytes")
    try:
        events = json.loads(data)
    except ValueError:
        raise EvidenceError(f"event log {path} is not JSON") from None
    if not isinstance(events, list):
        raise EvidenceError(f"event log {path} must be a JSON list of events")
    return events


def produce_evidence(tcti: str, nonce_hex: str, suite: str, include_ek: bool, event_log_path: str | None,
                     ephemeral_key_path: str | None, check_mode: bool) -> dict:
    nonce = decode_nonce(nonce_hex)
    key = EphemeralKey.generate(SUITES[suite])
    with Tpm(tcti) as tpm:
        evidence = issue_evidence(tpm, nonce, key.public_bytes(), include_ek, read_event_log(event_log_path))
    if ephemeral_key_path and not check_mode:
        write_private_file(ephemeral_key_path, key.private_bytes())
    # The kept key is transient: the next task of the hand-over consumes and deletes it.
    return {"changed": False, "evidence": evidence.to_document(), "ephemeral_key_path": ephemeral_key_path,
            "ak_trust_material": evidence.ek_certificate is not None}


def activate_credential(tcti: str, blob_b64: str, encrypted_seed_b64: str) -> bytes:
    with Tpm(tcti) as tpm:
        return answer_challenge(tpm, decode_b64("credential blob", blob_b64), decode_b64("credential secret", encrypted_seed_b64))


def read_measurements(tcti: str, pcrs: list[int], bank: str, ak_trust: str, warn_only: list[int]) -> dict:
    with Tpm(tcti) as tpm:
        values = tpm.read_pcrs(bank, tuple(pcrs) if pcrs else ALL_PCRS)
    rules = {i: PcrRule(i, (v,), i in warn_only) for i, v in values.items()}
    return MeasurementPolicy(bank, rules, ak_trust).to_document()
