# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller-side verification behind the verify_evidence and attestation_nonce actions."""

from __future__ import annotations

import os
import re

from .._crypto import seal
from .evidence import excerpt
from .nonces import DEFAULT_TTL, NonceStore
from .policy import (
    NODE_LOCK_PCR,
    MeasurementPolicy,
    PolicyError,
    load_policy,
    node_lock_mark,
    policy_from_document,
    parse_policy,
)
from .verifier import VerificationError, VerificationResult, Verifier, load_ca_certificates

CRYPTOGRAPHY_IMPORT_ERROR = seal.CRYPTOGRAPHY_IMPORT_ERROR
DEFAULT_NONCE_LEDGER = "~/.cache/confidential-kubernetes/nonce-ledger"
# fullmatch, never match with "$": "$" also matches before a trailing newline, and bytes.fromhex skips whitespace, so
# "<64 hex>\n" would pass as the same 32 bytes.
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")


def nonce_store(ledger: str | None, ttl: float = DEFAULT_TTL) -> NonceStore:
    path = os.path.expanduser(ledger or DEFAULT_NONCE_LEDGER)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    return NonceStore(ttl=ttl, path=path)


def resolve_policy(policy_path: str | None, policy_content: object, node_lock: str | None) -> MeasurementPolicy:
    if policy_path:
        policy = load_policy(os.path.expanduser(policy_path))
    elif isinstance(policy_content, (str, bytes)):
        policy = parse_policy(policy_content, "policy_content")
    else:
        policy = policy_from_document(policy_content)
    if node_lock is None:
        return policy
    if node_lock == "unlocked":
        return policy.with_rule(NODE_LOCK_PCR, [bytes(len(node_lock_mark(b"", policy.hash_algorithm)))])
    if not isinstance(node_lock, str) or not _HEX64.fullmatch(node_lock):
        raise PolicyError(f"node_lock must be 'unlocked' or a 64-hex cluster ID, got {excerpt(node_lock)}")
    return policy.with_rule(NODE_LOCK_PCR, [node_lock_mark(bytes.fromhex(node_lock), policy.hash_algorithm)])


def load_ek_cas(path: str | None) -> list:
    if not path:
        return []
    try:
        with open(os.path.expanduser(path), "rb") as handle:
            return load_ca_certificates(handle.read())
    except OSError as exc:
        raise VerificationError("ek-ca", f"cannot read EK CA file {path}: {exc.strerror}") from None


def verify(
    evidence: object,
    nonce_hex: str,
    policy: MeasurementPolicy,
    ek_cas: list,
    ledger: str | None,
    ttl: float = DEFAULT_TTL,
) -> VerificationResult:
    if not isinstance(nonce_hex, str) or not _HEX64.fullmatch(nonce_hex):
        raise VerificationError("nonce", "nonce must be 64 hex characters (32 bytes)")
    nonce = bytes.fromhex(nonce_hex)
    if ledger is not None:
        nonce_store(ledger, ttl).consume(nonce)
    return Verifier(policy, ek_cas).verify(evidence, nonce)
