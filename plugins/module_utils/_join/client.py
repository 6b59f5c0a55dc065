# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node side of the join protocol: ask a join service for a ticket, prove the TPM, open the ticket.

One attempt: a nonce; a fresh ephemeral key; evidence quoting ``SHA-256(nonce || SHA-256(key || request digest))``
(``request.py``: what the node asks for is covered by the quote); step 1 (``IssueJoinTicket`` or
``IssueRejoinTicket``) answers with a credential; the TPM activates it; step 2 (``ActivateTicket``) sends the proof
and gets the sealed ticket, which the ephemeral key opens.

Each attempt tries the endpoints in order; a transient failure (UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED,
RESOURCE_EXHAUSTED, an expired or unknown nonce or challenge) moves on to the next endpoint and, after the last, to
the next attempt after an exponential backoff with jitter. A refusal (PERMISSION_DENIED, INVALID_ARGUMENT, ...) ends
at once with a JoinError carrying the service's reason. Every attempt uses a new nonce and a new ephemeral key whose
private half never leaves this process.
"""

from __future__ import annotations

import random
import time

from . import joinservice_pb2 as pb2
from . import joinservice_pb2_grpc as pb2_grpc

try:
    import grpc
except ImportError as exc:  # reported by request_ticket()
    GRPC_IMPORT_ERROR: ImportError | None = exc
else:
    GRPC_IMPORT_ERROR = pb2.IMPORT_ERROR or pb2_grpc.IMPORT_ERROR

from .._attestation.evidence import EvidenceError
from .._attestation.issuer import Tpm, TpmError, answer_challenge, issue_evidence
from .._attestation.node import event_log_for_evidence
from .._crypto import seal
from .._crypto.seal import EphemeralKey, SealError
from .credential import ProofError, activation_proof
from .protocol import JOIN, REASON_METADATA, TICKET_FLOWS, JoinTicket, ProtocolError, RejoinTicket, ticket_type
from .request import bind_user_data, csr_key_digest, request_digest

RETRYABLE_CODES = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "ABORTED", "RESOURCE_EXHAUSTED")
RETRYABLE_REASONS = ("nonce-stale", "nonce-unknown", "activation-unknown")


class JoinError(RuntimeError):
    """No ticket: the service refused (``reason`` is its code), no endpoint answered, or the ticket did not open."""

    def __init__(self, reason: str, message: str, code: str | None = None, retryable: bool = False):
        super().__init__(message)
        self.reason = reason
        self.code = code
        self.retryable = retryable


def request_ticket(
    endpoints: list[str],
    ca_pem: bytes,
    tcti: str,
    node_name: str,
    control_plane: bool = False,
    disk_uuid: str = "",
    kubelet_csr_pem: bytes = b"",
    flow: str = JOIN,
    attempts: int = 5,
    backoff: float = 1.0,
    max_backoff: float = 30.0,
    timeout: float = 30.0,
    total_timeout: float = 300.0,
    server_name: str | None = None,
    sleep=time.sleep,
    clock=time.monotonic,
    event_log: str = "auto",
    warnings: list[str] | None = None,
) -> JoinTicket | RejoinTicket:
    """Return the opened ticket (a JoinTicket, or a RejoinTicket for ``flow="rejoin"``). ``ca_pem`` is the cluster CA
    that issued the services' TLS certificates. ``event_log`` V(none) sends no firmware event log; a log that cannot
    be used is left out, and why is appended to ``warnings``."""
    if GRPC_IMPORT_ERROR is not None:
        raise JoinError("dependency", f"grpcio and protobuf are required on the node: {GRPC_IMPORT_ERROR}")
    if seal.CRYPTOGRAPHY_IMPORT_ERROR is not None:
        raise JoinError("dependency", f"cryptography >= 47 is required on the node: {seal.CRYPTOGRAPHY_IMPORT_ERROR}")
    if flow not in TICKET_FLOWS:
        raise JoinError("flow", f"flow must be one of {', '.join(TICKET_FLOWS)}, got {flow!r}")
    if not endpoints:
        raise JoinError("endpoints", "no join service endpoint given")
    if not ca_pem:
        raise JoinError(
            "tls", "the cluster CA certificate is required to authenticate the join service (no trust on first use)"
        )
    started = clock()
    deadline = started + total_timeout
    last: JoinError | None = None
    for attempt in range(max(1, attempts)):
        for endpoint in endpoints:
            remaining = deadline - clock()
            if remaining <= 0:
                break
            try:
                return _attempt(
                    endpoint,
                    ca_pem,
                    tcti,
                    node_name,
                    control_plane,
                    disk_uuid,
                    kubelet_csr_pem,
                    flow,
                    min(timeout, remaining),
                    server_name,
                    event_log,
                    warnings,
                )
            except JoinError as exc:
                if not exc.retryable:
                    raise
                last = exc
        remaining = deadline - clock()
        if attempt + 1 >= attempts or remaining <= 0:
            break
        delay = min(max_backoff, backoff * 2**attempt) * (0.5 + random.random() / 2)  # nosec B311 - jitter, not a secret
        sleep(min(delay, remaining))
    # Only transient failures get here: a node that waits for a join service (a rebooted one) may try again later.
    raise JoinError(
        last.reason if last else "timeout",
        f"no join service issued a ticket after {attempt + 1} attempt(s) in {clock() - started:.1f} s (of "
        f"{total_timeout:g} s allowed) over "
        f"{', '.join(endpoints)}; last failure: {last}. Check that a join service runs (systemctl status "
        "confidential-joinservice on a control plane) and that its port is reachable from this node; "
        "join_attempts gives more rounds",
        last.code if last else None,
        retryable=True,
    )


def _channel(endpoint: str, ca_pem: bytes, server_name: str | None):
    # A private subchannel pool: a new attempt must not inherit the connection backoff of a failed one.
    options = [("grpc.use_local_subchannel_pool", 1), ("grpc.enable_retries", 0)]
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    return grpc.secure_channel(endpoint, grpc.ssl_channel_credentials(root_certificates=ca_pem), options=options)


def _call(method, request, timeout: float, endpoint: str):
    try:
        return method(request, timeout=timeout)
    except grpc.RpcError as exc:
        code = exc.code().name if exc.code() else "UNKNOWN"
        details = exc.details() or ""
        # Refusals name their reason in trailing metadata; transport failures have none.
        reason = dict(exc.trailing_metadata() or ()).get(REASON_METADATA) or code.lower()
        retryable = code in RETRYABLE_CODES or reason in RETRYABLE_REASONS
        raise JoinError(reason, f"join service {endpoint}: {code}: {details}", code, retryable) from None


def _attempt(
    endpoint: str,
    ca_pem: bytes,
    tcti: str,
    node_name: str,
    control_plane: bool,
    disk_uuid: str,
    kubelet_csr_pem: bytes,
    flow: str,
    timeout: float,
    server_name: str | None,
    event_log_choice: str = "auto",
    warnings: list[str] | None = None,
) -> JoinTicket | RejoinTicket:
    control_plane = control_plane and flow == JOIN
    try:
        kubelet_key = csr_key_digest(kubelet_csr_pem) if flow == JOIN else b""
    except ValueError:
        raise JoinError("csr-malformed", "the kubelet CSR is not a PEM certificate signing request") from None
    digest = request_digest(flow, node_name, control_plane, disk_uuid, kubelet_key)
    with _channel(endpoint, ca_pem, server_name) as channel:
        stub = pb2_grpc.JoinServiceStub(channel)
        challenge = _call(stub.GetNonce, pb2.GetNonceRequest(), timeout, endpoint)
        nonce, verifier_id = challenge.nonce, challenge.verifier_id
        if len(nonce) != 32:
            raise JoinError("nonce", f"join service {endpoint} sent a {len(nonce)}-byte nonce, not 32 bytes")
        key = EphemeralKey.generate()
        try:
            # The firmware's event log where the node has one, for the service to replay against the quote; one it
            # cannot use is left out (the quoted PCRs are checked all the same), and said so once per attempt.
            event_log, left_out = event_log_for_evidence(None, event_log_choice)
            with Tpm(tcti) as tpm:
                evidence = issue_evidence(
                    tpm, nonce, bind_user_data(key.public_bytes(), digest), event_log=event_log, warnings=left_out
                )
            if warnings is not None:
                warnings.extend(warning for warning in left_out if warning not in warnings)
            evidence = evidence.to_json().encode()
        except (TpmError, EvidenceError) as exc:
            raise JoinError("tpm", f"cannot produce evidence: {exc}") from None
        if flow == JOIN:
            granted = _call(
                stub.IssueJoinTicket,
                pb2.IssueJoinTicketRequest(
                    evidence=evidence,
                    nonce=nonce,
                    node_name=node_name,
                    control_plane=control_plane,
                    kubelet_csr=kubelet_csr_pem,
                    disk_uuid=disk_uuid,
                ),
                timeout,
                endpoint,
            )
        else:
            granted = _call(
                stub.IssueRejoinTicket,
                pb2.IssueRejoinTicketRequest(evidence=evidence, nonce=nonce, node_name=node_name, disk_uuid=disk_uuid),
                timeout,
                endpoint,
            )
        proof = prove_activation(tcti, granted.credential_blob, granted.credential_encrypted_seed, nonce)
        response = _call(
            stub.ActivateTicket, pb2.ActivateTicketRequest(nonce=nonce, activation_proof=proof), timeout, endpoint
        )
    return open_ticket(key, response.sealed_ticket, flow, nonce, verifier_id)


def prove_activation(tcti: str, credential_blob: bytes, credential_encrypted_seed: bytes, nonce: bytes) -> bytes:
    """Activate the service's credential with this TPM's EK and AK, and prove it (without sending the secret)."""
    try:
        with Tpm(tcti) as tpm:
            secret = answer_challenge(tpm, credential_blob, credential_encrypted_seed)
        return activation_proof(secret, nonce)
    except (TpmError, ProofError) as exc:
        raise JoinError("credential-activation", f"this TPM cannot activate the service's credential: {exc}") from None


def open_ticket(
    key: EphemeralKey, sealed_ticket: bytes, flow: str, nonce: bytes, verifier_id: str
) -> JoinTicket | RejoinTicket:
    """Open the HPKE envelope with the ephemeral key and read the ticket of ``flow`` from it."""
    try:
        plaintext = key.open(sealed_ticket, flow, nonce, verifier_id)
    except SealError as exc:
        raise JoinError("ticket-open", f"the ticket does not open: {exc}") from None
    try:
        return ticket_type(flow).from_bytes(plaintext)
    except ProtocolError as exc:
        raise JoinError("ticket-open", f"the opened ticket is refused: {exc}") from None
