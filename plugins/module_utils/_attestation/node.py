# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Node-side tasks behind the tpm_evidence and measurements modules."""

from __future__ import annotations

import base64
import binascii
import os
import re

from .._crypto import seal
from .._crypto.seal import MLKEM768_X25519, X25519, EphemeralKey
from .._files import FileTooLargeError, read_bounded, write_private_file
from . import eventlog
from .evidence import EvidenceError
from .issuer import ALL_PCRS, Tpm, answer_challenge, issue_evidence
from .policy import MeasurementPolicy, PcrRule

CRYPTOGRAPHY_IMPORT_ERROR = seal.CRYPTOGRAPHY_IMPORT_ERROR
SUITES = {"mlkem768-x25519": MLKEM768_X25519, "x25519": X25519}


def decode_nonce(value: str) -> bytes:
    # Exactly 64 hex digits: bytes.fromhex alone skips whitespace, so "<nonce>\n" would read as the same nonce.
    if not isinstance(value, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", value):
        raise EvidenceError("nonce must be 64 hex characters (32 bytes), nothing else")
    return bytes.fromhex(value)


def decode_b64(name: str, value: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise EvidenceError(f"{name} is not valid base64") from None


def read_event_log(path: str | None) -> bytes | None:
    """The TCG event log at ``path``, or the firmware's (securityfs) when no path is given and the node has one that
    this user may read (it is root's only). Read bounded and parsed here too, so that a node with a malformed log
    says so instead of being refused."""
    if not path:
        if not os.access(eventlog.DEFAULT_PATH, os.R_OK):
            return None
        path = eventlog.DEFAULT_PATH
    try:
        data = read_bounded(path, eventlog.MAX_EVENT_LOG_BYTES)
    except OSError as exc:
        raise EvidenceError(f"cannot read the event log {path}: {exc.strerror}") from None
    except FileTooLargeError as exc:
        raise EvidenceError(f"event log {exc}") from None
    try:
        eventlog.parse(data)
    except eventlog.EventLogError as exc:
        raise EvidenceError(f"event log {path}: {exc}") from None
    return data


EVENT_LOG_CHOICES = ("auto", "none")


def event_log_for_evidence(path: str | None, choice: str = "auto") -> tuple[bytes | None, list[str]]:
    """The event log to attach to evidence, and the warnings: none with ``choice`` V(none); else as read_event_log
    reads it, except that a log that cannot be parsed or is over the parser's limits is left out with a warning - the
    quote's PCRs are still checked against the policy, so a node is not refused for its firmware's log."""
    if choice not in EVENT_LOG_CHOICES:
        raise EvidenceError(f"the event log choice must be one of {', '.join(EVENT_LOG_CHOICES)}, got {choice!r}")
    if choice == "none":
        return None, []
    try:
        return read_event_log(path), []
    except EvidenceError as exc:
        if str(exc).startswith("cannot read"):
            raise
        return None, [f"{exc}: the evidence goes without the event log (its PCRs are checked as quoted)"]


def produce_evidence(
    tcti: str,
    nonce_hex: str,
    suite: str,
    include_ek: bool,
    event_log_path: str | None,
    ephemeral_key_path: str | None,
    check_mode: bool,
    event_log_choice: str = "auto",
) -> dict:
    nonce = decode_nonce(nonce_hex)
    key = EphemeralKey.generate(SUITES[suite])
    event_log, warnings = event_log_for_evidence(event_log_path, event_log_choice)
    with Tpm(tcti) as tpm:
        evidence = issue_evidence(tpm, nonce, key.public_bytes(), include_ek, event_log, warnings=warnings)
    if ephemeral_key_path and not check_mode:
        write_private_file(ephemeral_key_path, key.private_bytes())
    # The kept key is transient: the next task of the hand-over consumes and deletes it.
    return {
        "changed": False,
        "evidence": evidence.to_document(),
        "ephemeral_key_path": ephemeral_key_path,
        "ak_trust_material": evidence.ek_certificate is not None,
        "warnings": warnings,
    }


def activate_credential(tcti: str, blob_b64: str, encrypted_seed_b64: str) -> bytes:
    with Tpm(tcti) as tpm:
        return answer_challenge(
            tpm, decode_b64("credential blob", blob_b64), decode_b64("credential secret", encrypted_seed_b64)
        )


def read_measurements(
    tcti: str, pcrs: list[int], bank: str, ak_trust: str, warn_only: list[int], event_log_path: str | None = None
) -> dict:
    """The node's PCRs as a policy, with its event log's events of those PCRs enrolled beside them when it has one."""
    raw = read_event_log(event_log_path)
    with Tpm(tcti) as tpm:
        values = tpm.read_pcrs(bank, tuple(pcrs) if pcrs else ALL_PCRS)
    rules = {i: PcrRule(i, (v,), i in warn_only) for i, v in values.items()}
    golden = ()
    if raw is not None:
        log = eventlog.parse(raw)
        replayed = log.replay().get(bank, {})
        # A golden log that does not explain the golden PCRs would name the wrong events later: refuse it now.
        differing = sorted(i for i in replayed if i in values and replayed[i] != values[i])
        if differing:
            raise EvidenceError(
                f"event log {event_log_path or eventlog.DEFAULT_PATH} does not replay to this node's "
                f"{bank} PCR(s) {', '.join(map(str, differing))}: not enrolled"
            )
        # A log without this bank (a SHA-1 format log for a sha256 policy) explains none of its PCRs: none enrolled.
        golden = eventlog.golden_events(log, bank, set(values)) if bank in log.banks else ()
    return MeasurementPolicy(bank, rules, ak_trust, golden).to_document()
