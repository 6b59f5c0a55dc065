# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the join service does for one request, independent of gRPC.

Order for a join: consume the nonce; verify the evidence against the current
measurement policy with PCR 15 required to be zero (a fresh node); check node
name, disk UUID and kubelet CSR; serialise control-plane joins; only then
derive the disk key, sign the kubelet certificate, read the control-plane PKI,
generate the bootstrap token and seal the ticket to the evidence's ephemeral
key; register the token (a bootstrap-token Secret) last, and wrap the sealed ticket under the
activation credential at AK trust level 2. Every refusal is a ``Refusal``
raised before a token is registered.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import threading
from dataclasses import dataclass, field
from typing import Callable

from .._attestation.nonces import NonceStore
from .._attestation.policy import NODE_LOCK_PCR, MeasurementPolicy, node_lock_mark
from .._attestation.verifier import VerificationError, VerificationResult, Verifier
from .._crypto import derive, seal
from . import credential
from .._crypto.root_secrets import RootSecrets
from .pki import ClusterPki, PkiError, RequestError, check_disk_uuid, check_node_name, load_kubelet_csr
from .tokens import TokenMinter, TokenMintError, generate_token

TICKET_VERSION = 1
STATUS_FOR_REASON = {
    "malformed": "INVALID_ARGUMENT",
    "nonce-unknown": "FAILED_PRECONDITION",
    "nonce-reused": "FAILED_PRECONDITION",
    "nonce-stale": "FAILED_PRECONDITION",
    "node-name": "INVALID_ARGUMENT",
    "disk-uuid": "INVALID_ARGUMENT",
    "csr-malformed": "INVALID_ARGUMENT",
    "csr-signature": "INVALID_ARGUMENT",
    "csr-key": "INVALID_ARGUMENT",
    "csr-subject": "PERMISSION_DENIED",
    "ephemeral-key": "INVALID_ARGUMENT",
}
CONTROL_PLANE_BUSY = "another control-plane join is in progress"


class Refusal(Exception):
    """The service refuses a request. ``code`` is a gRPC status name, ``reason`` a stable code the client can act on."""

    def __init__(self, code: str, reason: str, message: str, mismatches: list[dict] | None = None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.mismatches = mismatches or []

    @classmethod
    def of(cls, reason: str, message: str, mismatches: list[dict] | None = None) -> "Refusal":
        return cls(STATUS_FOR_REASON.get(reason, "PERMISSION_DENIED"), reason, message, mismatches)


@dataclass(frozen=True, repr=False)
class JoinRequest:
    evidence: bytes
    nonce: bytes
    node_name: str
    control_plane: bool
    kubelet_csr: bytes
    disk_uuid: str


@dataclass(frozen=True, repr=False)
class RejoinRequest:
    evidence: bytes
    nonce: bytes
    node_name: str
    disk_uuid: str


@dataclass(frozen=True, repr=False)
class IssuedTicket:
    sealed_ticket: bytes
    credential_blob: bytes = b""
    credential_encrypted_seed: bytes = b""
    ak_trust_level: int = 1
    warnings: list[dict] = field(default_factory=list)


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


@dataclass(frozen=True, repr=False)
class PreparedJoin:
    """A join checked and sealed, waiting for its token to be registered."""

    verified: VerificationResult
    node_name: str
    token: str
    envelope: bytes
    nonce: bytes
    release: Callable[[], None]


def _noop() -> None:
    return None


def _once(action: Callable[[], None]) -> Callable[[], None]:
    """``action`` at most once, however often (and from wherever) it is called."""
    done = threading.Lock()

    def run() -> None:
        if done.acquire(blocking=False):
            action()

    return run


class TicketIssuer:
    def __init__(self, secrets: RootSecrets, pki: ClusterPki, policy: Callable[[], MeasurementPolicy], ek_cas: list,
                 token_minter: TokenMinter, nonces: NonceStore, api_server_endpoint: str, kubernetes_version: str,
                 verifier_id: str, now: Callable[[], datetime.datetime] = _utcnow, max_registrations: int = 16):
        self._secrets = secrets
        self._pki = pki
        self._policy = policy
        self._ek_cas = ek_cas
        self._token_minter = token_minter
        self._nonces = nonces
        self.api_server_endpoint = api_server_endpoint
        self.kubernetes_version = kubernetes_version
        self.verifier_id = verifier_id
        self._now = now
        self._measurement_secret = secrets.measurement_secret()
        self.cluster_id = secrets.cluster_id()
        self._control_plane = threading.Lock()
        self._verifier_cache: tuple[MeasurementPolicy, Verifier, Verifier] | None = None
        # At most this many kubectl processes at once; joins beyond wait their turn.
        self._registrations = asyncio.Semaphore(max_registrations)

    def issue_nonce(self) -> bytes:
        return self._nonces.issue()

    def prepare_join(self, request: JoinRequest) -> "PreparedJoin":
        """Everything but the token registration: verify, check, reserve the control-plane slot, derive, sign and seal.

        The caller must ``release()`` the result once the response is sent (it frees the control-plane slot).
        """
        verified = self._attest(request.evidence, request.nonce, fresh_only=True)
        try:
            node_name = check_node_name(request.node_name)
            disk_uuid = check_disk_uuid(request.disk_uuid)
            csr = load_kubelet_csr(request.kubelet_csr, node_name)
        except RequestError as exc:
            raise Refusal.of(exc.reason, str(exc)) from None
        release = _noop
        if request.control_plane:
            if not self._control_plane.acquire(blocking=False):
                raise Refusal("ABORTED", "control-plane-busy", f"{CONTROL_PLANE_BUSY}; retry in a few seconds")
            release = _once(self._control_plane.release)
        try:
            payload = self._identity(disk_uuid)
            try:
                files = self._pki.control_plane_files() if request.control_plane else {}
                kubelet_crt = self._pki.sign_kubelet_client(csr, node_name, self._now())
            except PkiError as exc:
                raise Refusal("INTERNAL", "pki", str(exc)) from None
            token = generate_token()
            payload.update({
                "api_server_endpoint": self.api_server_endpoint,
                "bootstrap_token": token,
                "ca_cert_hashes": [self._pki.ca_cert_hash],
                "ca_crt": self._pki.ca_pem.decode(),
                "kubelet_client_crt": kubelet_crt.decode(),
                "control_plane_files": {name: {"content": _b64(content), "mode": f"{mode:04o}"} for name, (content, mode) in files.items()},
                "kubernetes_version": self.kubernetes_version,
            })
            if request.control_plane:
                # A control plane runs a join service of its own, which needs the root secrets.
                payload["cluster_secrets"] = self._secrets.to_document()
            envelope = self._seal(verified, payload, "join", request.nonce)
        except BaseException:
            release()
            raise
        return PreparedJoin(verified, node_name, token, envelope, request.nonce, release)

    async def register_token(self, prepared: "PreparedJoin") -> None:
        """The token becomes valid only now, for a ticket that is sealed and about to be sent."""
        try:
            async with self._registrations:
                await self._token_minter.mint(prepared.token, prepared.node_name)
        except TokenMintError as exc:
            raise Refusal("UNAVAILABLE", "token-mint", str(exc)) from None

    def finish(self, prepared: "PreparedJoin") -> IssuedTicket:
        return self._ticket(prepared.verified, prepared.envelope, prepared.nonce)

    def issue_rejoin_ticket(self, request: RejoinRequest) -> IssuedTicket:
        """A rebooted member: PCR 15 zero (not yet re-marked) or the mark of this cluster; disk key and measurement secret only."""
        verified = self._attest(request.evidence, request.nonce, fresh_only=False)
        try:
            check_node_name(request.node_name)
            disk_uuid = check_disk_uuid(request.disk_uuid)
        except RequestError as exc:
            raise Refusal.of(exc.reason, str(exc)) from None
        return self._ticket(verified, self._seal(verified, self._identity(disk_uuid), "rejoin", request.nonce), request.nonce)

    def _verifiers(self) -> tuple[MeasurementPolicy, Verifier, Verifier]:
        """(policy, verifier of fresh nodes, verifier of rejoining members), made again only when the policy changes."""
        policy = self._policy()
        cached = self._verifier_cache
        if cached is not None and cached[0] is policy:
            return cached
        unlocked = bytes(len(node_lock_mark(b"", policy.hash_algorithm)))
        member = node_lock_mark(self.cluster_id, policy.hash_algorithm)
        cached = (policy, Verifier(policy.with_rule(NODE_LOCK_PCR, [unlocked]), self._ek_cas),
                  Verifier(policy.with_rule(NODE_LOCK_PCR, [unlocked, member]), self._ek_cas))
        self._verifier_cache = cached
        return cached

    def _attest(self, evidence: bytes, nonce: bytes, fresh_only: bool) -> VerificationResult:
        policy, fresh, member = self._verifiers()
        try:
            self._nonces.consume(nonce)
            return (fresh if fresh_only else member).verify(evidence, nonce)
        except VerificationError as exc:
            raise Refusal.of(exc.reason, self._explain(exc, policy, fresh_only), exc.mismatches) from None

    def _explain(self, error: VerificationError, policy: MeasurementPolicy, fresh_only: bool) -> str:
        for mismatch in error.mismatches:
            if mismatch["pcr"] != NODE_LOCK_PCR:
                continue
            if fresh_only and mismatch["actual"] == node_lock_mark(self.cluster_id, policy.hash_algorithm).hex():
                return f"{error}; PCR 15 shows the node is already a member of this cluster: a rebooted node asks for a rejoin ticket"
            return f"{error}; PCR 15 shows the node is locked for another cluster (or was tampered with): it needs a reset"
        return str(error)

    def _identity(self, disk_uuid: str) -> dict:
        return {
            "version": TICKET_VERSION,
            "cluster_id": self.cluster_id.hex(),
            "measurement_secret": _b64(self._measurement_secret),
            "measurement_salt": _b64(self._secrets.measurement_salt),
            "state_disk_key": _b64(derive.state_disk_key(self._secrets.master_key, self._secrets.master_salt, disk_uuid)),
        }

    def _seal(self, verified: VerificationResult, payload: dict, flow: str, nonce: bytes) -> bytes:
        try:
            return seal.seal(json.dumps(payload, sort_keys=True).encode(), verified.evidence.user_data, flow, nonce, self.verifier_id)
        except seal.SealError as exc:
            raise Refusal.of("ephemeral-key", f"the evidence's user_data is not a usable ephemeral key: {exc}") from None

    @staticmethod
    def _ticket(verified: VerificationResult, envelope: bytes, nonce: bytes) -> IssuedTicket:
        challenge = verified.challenge
        if challenge is None:
            return IssuedTicket(envelope, ak_trust_level=verified.ak_trust_level, warnings=verified.warnings)
        return IssuedTicket(credential.wrap(envelope, challenge.secret, nonce), challenge.credential.blob,
                            challenge.credential.encrypted_seed, verified.ak_trust_level, verified.warnings)
