# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node's side of one continuous attestation: a nonce from a join service, a quote of every sha256 PCR (the
policy's and PCR 15) with the AK proven at the node's join, bound to the nonce and the node's EK identity, the firmware
event log where the node has one, sent on the Attest RPC. The quote carries the TPM's clock info itself (signed)."""

from __future__ import annotations

from . import joinservice_pb2 as pb2
from . import joinservice_pb2_grpc as pb2_grpc
from .._attestation.issuer import Tpm, issue_evidence
from .attest import attest_user_data
from .client import GRPC_IMPORT_ERROR, JoinError, _call, _channel
from .request import ek_identity


def attestation_evidence(tcti: str, nonce: bytes, event_log: bytes | None = None) -> bytes:
    """The evidence document of one attestation of the TPM behind ``tcti``."""
    with Tpm(tcti) as tpm:
        _certificate, handle, ek_public = tpm.endorsement_key()
        tpm.flush(handle)
        return (
            issue_evidence(tpm, nonce, attest_user_data(ek_identity(ek_public)), event_log=event_log).to_json().encode()
        )


def attest_once(
    endpoint: str,
    ca_pem: bytes,
    tcti: str,
    event_log: bytes | None = None,
    timeout: float = 30.0,
    server_name: str | None = None,
) -> int:
    """One attestation at ``endpoint``; the seconds until the service takes the next. JoinError with the service's
    reason when it refuses (a failed verdict included)."""
    if GRPC_IMPORT_ERROR is not None:
        raise JoinError("dependency", f"grpcio and protobuf are required: {GRPC_IMPORT_ERROR}")
    channel = _channel(endpoint, ca_pem, server_name)
    try:
        stub = pb2_grpc.JoinServiceStub(channel)
        nonce = _call(stub.GetNonce, pb2.GetNonceRequest(), timeout, endpoint).nonce
        evidence = attestation_evidence(tcti, nonce, event_log)
        answer = _call(stub.Attest, pb2.AttestRequest(evidence=evidence, nonce=nonce), timeout, endpoint)
        return answer.next_attestation_seconds
    finally:
        channel.close()
