# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the join service does for one request, independent of gRPC: two steps, nothing issued before the second.

Step 1 (``begin``, for a join or a rejoin): check the nonce (a MAC, its age, not used); verify the evidence against the
current measurement policy (PCR 15 zero for a join, zero or this cluster's mark for a rejoin); check that the quote
covers what the node asks for (``request.py``); mark the nonce used; identify the node by the evidence's EK; let the
registry grant name, role and disk; answer with a credential for the evidence's EK and AK. Nothing is signed, sealed or
registered.

Step 2 (``activate``): the node proves it activated the credential (only the TPM holding the EK, with the AK loaded,
can). Only then: claim a first disk binding in the cluster's API, take the control-plane slot, derive the disk key,
sign the kubelet certificate for the granted name, seal the ticket to the evidence's ephemeral key, and register the
bootstrap token last. Every refusal is a ``Refusal`` raised before a token is registered.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from .._attestation import tpm2
from .._attestation.nonces import NonceLimitError
from .._attestation.policy import NODE_LOCK_PCR, MeasurementPolicy, node_lock_mark
from .._attestation.verifier import EK_REQUIRED_ATTRIBUTES, VerificationError, VerificationResult, Verifier
from .._crypto import derive, seal
from .._crypto.root_secrets import RootSecrets
from .bindings import BindingConflict, KubectlDiskBindings
from .credential import proof_matches
from .nonces import MacNonces
from .pki import ClusterPki, PkiError, RequestError, check_disk_uuid, check_node_name, load_kubelet_csr
from .registry import Grant, NodeIdentity, NodeRegistry, RegistryRefusal
from .request import BindingError, digest_matches, ek_identity, public_key_digest, request_digest, split_user_data
from .tokens import LiveToken, TokenMinter, TokenMintError, generate_token

TICKET_VERSION = 1
CREDENTIAL_SECRET_BYTES = 32
# Challenges answered by nobody are forgotten after a nonce lifetime; at most this many wait at once.
MAX_PENDING = 4096
STATUS_FOR_REASON = {
    "malformed": "INVALID_ARGUMENT",
    "nonce-unknown": "FAILED_PRECONDITION",
    "nonce-reused": "FAILED_PRECONDITION",
    "nonce-stale": "FAILED_PRECONDITION",
    "nonce-limit": "RESOURCE_EXHAUSTED",
    "node-name": "INVALID_ARGUMENT",
    "disk-uuid": "INVALID_ARGUMENT",
    "csr-malformed": "INVALID_ARGUMENT",
    "csr-signature": "INVALID_ARGUMENT",
    "csr-key": "INVALID_ARGUMENT",
    "csr-subject": "PERMISSION_DENIED",
    "ephemeral-key": "INVALID_ARGUMENT",
    "activation-unknown": "FAILED_PRECONDITION",
    "busy": "RESOURCE_EXHAUSTED",
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
class Challenge:
    """Step 1's answer: the credential, and what was granted (nothing secret)."""

    credential_blob: bytes
    credential_encrypted_seed: bytes
    node_name: str
    control_plane: bool
    ak_trust_level: int = 1
    warnings: list[dict] = field(default_factory=list)


@dataclass(frozen=True, repr=False)
class Pending:
    """A request that passed step 1 and waits for its activation proof."""

    flow: str
    nonce: bytes
    verified: VerificationResult
    grant: Grant
    ephemeral_key: bytes
    secret: bytes
    expires: float
    csr: object = None


@dataclass(frozen=True, repr=False)
class PreparedJoin:
    """A join checked and sealed, waiting for its token to be registered."""

    pending: Pending
    token: str
    envelope: bytes
    release: Callable[[], None]

    @property
    def node_name(self) -> str:
        return self.pending.grant.node_name


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


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
    """The service's decisions and state: used nonces, pending challenges, the control-plane slot, live tokens.

    ``begin`` and ``prepare_join``/``prepare_rejoin`` are CPU-bound and thread-safe (the service runs them in its worker
    threads); ``activate_*`` coroutines run on the service's event loop around them.
    """

    def __init__(self, secrets: RootSecrets, pki: ClusterPki, policy: Callable[[], MeasurementPolicy], ek_cas: list,
                 token_minter: TokenMinter, nonces: MacNonces, registry: NodeRegistry, disk_bindings: KubectlDiskBindings,
                 api_server_endpoint: str, kubernetes_version: str, verifier_id: str,
                 now: Callable[[], datetime.datetime] = _utcnow, max_registrations: int = 16, clock=time.monotonic):
        self._secrets = secrets
        self._pki = pki
        self._policy = policy
        self._ek_cas = ek_cas
        self.token_minter = token_minter
        self._nonces = nonces
        self.registry = registry
        self._disk_bindings = disk_bindings
        self.api_server_endpoint = api_server_endpoint
        self.kubernetes_version = kubernetes_version
        self.verifier_id = verifier_id
        self._now = now
        self._clock = clock
        self._measurement_secret = secrets.measurement_secret()
        self.cluster_id = secrets.cluster_id()
        self._control_plane = threading.Lock()
        self._verifier_cache: tuple[MeasurementPolicy, Verifier, Verifier] | None = None
        self._pending: dict[bytes, Pending] = {}
        self._pending_lock = threading.Lock()
        # Tokens registered and not yet retired, by token ID (the service retires them once their node registered).
        self.live_tokens: dict[str, LiveToken] = {}
        # At most this many kubectl processes at once; joins beyond wait their turn.
        self._registrations = asyncio.Semaphore(max_registrations)

    def issue_nonce(self) -> bytes:
        return self._nonces.issue()

    # --- step 1 -------------------------------------------------------------------------------------------------

    def begin_join(self, request: JoinRequest) -> Challenge:
        return self._begin("join", request.evidence, request.nonce, request.node_name, request.control_plane, request.disk_uuid,
                           request.kubelet_csr)

    def begin_rejoin(self, request: RejoinRequest) -> Challenge:
        return self._begin("rejoin", request.evidence, request.nonce, request.node_name, False, request.disk_uuid, b"")

    def _begin(self, flow: str, evidence: bytes, nonce: bytes, node_name: str, control_plane: bool, disk_uuid: str,
               kubelet_csr: bytes) -> Challenge:
        verified = self._attest(evidence, nonce, fresh_only=flow == "join")
        try:
            if node_name:
                check_node_name(node_name)
            check_disk_uuid(disk_uuid)
            csr = load_kubelet_csr(kubelet_csr, node_name) if flow == "join" else None
        except RequestError as exc:
            raise Refusal.of(exc.reason, str(exc)) from None
        try:
            ephemeral_key, quoted = split_user_data(verified.evidence.user_data)
        except BindingError as exc:
            raise Refusal.of("request-binding", str(exc)) from None
        kubelet_key = public_key_digest(csr.public_key()) if csr is not None else b""
        if not digest_matches(quoted, request_digest(flow, node_name, control_plane, disk_uuid, kubelet_key)):
            raise Refusal.of("request-binding", "the quote does not cover this request: the node name, role, disk UUID or kubelet key "
                                                "differ from what the TPM quoted")
        try:
            seal.check_public_key(ephemeral_key)
        except seal.SealError as exc:
            raise Refusal.of("ephemeral-key", f"the evidence's user_data is not a usable ephemeral key: {exc}") from None
        identity = self._identity(verified)
        try:
            self._nonces.consume(nonce)
        except VerificationError as exc:
            raise Refusal.of(exc.reason, str(exc)) from None
        except NonceLimitError as exc:
            raise Refusal.of("nonce-limit", str(exc)) from None
        try:
            grant = self.registry.grant(identity, flow, node_name, control_plane, disk_uuid)
        except RegistryRefusal as refusal:
            raise Refusal.of(refusal.reason, str(refusal)) from None
        secret, credential = self._credential(verified)
        self._remember(Pending(flow, nonce, verified, grant, ephemeral_key, secret, self._clock() + self._nonces.ttl, csr))
        return Challenge(credential.blob, credential.encrypted_seed, grant.node_name, grant.control_plane, verified.ak_trust_level,
                         verified.warnings)

    def _identity(self, verified: VerificationResult) -> NodeIdentity:
        """The node is its EK: the evidence must carry the EK public key (and carries its certificate where one exists)."""
        evidence = verified.evidence
        if evidence.ek_public is None:
            raise Refusal.of("ek-missing", "the evidence carries no EK public key: the join service identifies a node by its TPM's "
                                           "endorsement key")
        try:
            ek = tpm2.parse_public(evidence.ek_public)
            return NodeIdentity(ek_identity(evidence.ek_public), ek.public_key(), evidence.ek_certificate)
        except tpm2.StructureError as exc:
            raise Refusal.of("malformed", f"evidence field 'ek_public': {exc}") from None

    def _credential(self, verified: VerificationResult) -> tuple[bytes, tpm2.Credential]:
        """At level 2 the verifier's challenge; at level 1 one made here for the evidence's EK (identity needs it too)."""
        if verified.challenge is not None:
            return verified.challenge.secret, verified.challenge.credential
        ek = tpm2.parse_public(verified.evidence.ek_public)
        missing = [name for name, bit in EK_REQUIRED_ATTRIBUTES.items() if not ek.attributes & bit]
        if missing:
            raise Refusal.of("ek-missing", f"the evidence's EK lacks required attribute(s): {', '.join(missing)}")
        secret = os.urandom(CREDENTIAL_SECRET_BYTES)
        try:
            return secret, tpm2.make_credential(ek, verified.ak_name, secret)
        except tpm2.StructureError as exc:
            raise Refusal.of("ek-missing", f"cannot make a credential for the evidence's EK: {exc}") from None

    def _remember(self, pending: Pending) -> None:
        with self._pending_lock:
            now = self._clock()
            for nonce in [n for n, p in self._pending.items() if p.expires < now]:
                del self._pending[nonce]
            if len(self._pending) >= MAX_PENDING:
                raise Refusal.of("busy", f"{len(self._pending)} challenges wait for their activation; retry in a few seconds")
            self._pending[pending.nonce] = pending

    def pending(self) -> int:
        with self._pending_lock:
            return len(self._pending)

    # --- step 2 -------------------------------------------------------------------------------------------------

    def take(self, nonce: bytes, proof: bytes) -> Pending:
        """The pending request of this nonce, once: a wrong proof forgets it as well."""
        with self._pending_lock:
            pending = self._pending.pop(nonce, None) if isinstance(nonce, bytes) else None
        if pending is None:
            raise Refusal.of("activation-unknown", "no challenge waits for this nonce: it was answered, it expired, or step 1 did not "
                                                   "succeed; start again with a new nonce")
        if pending.expires < self._clock():
            raise Refusal.of("activation-unknown", "the challenge expired before its activation proof arrived; start again with a new nonce")
        if not proof_matches(pending.secret, pending.nonce, proof):
            raise Refusal.of("credential-activation", "the activation proof does not match: the caller's TPM does not hold both the EK "
                                                      "and the AK of the evidence")
        return pending

    async def claim_disk(self, pending: Pending) -> None:
        """A first binding becomes the node's only in the cluster's API, before anything is issued for it."""
        binding = pending.grant.bind
        if binding is None:
            return
        try:
            holder = await self._disk_bindings.claim(binding, self.registry.counts)
        except BindingConflict as exc:
            raise Refusal("UNAVAILABLE", "disk-binding", str(exc)) from None
        if holder.ek != binding.ek:
            self.registry.mirror.record(holder)
            raise Refusal.of("disk-not-granted", f"disk {binding.disk_uuid} is bound to another node's TPM: a node gets only its own "
                                                 "disk's key")
        self.registry.mirror.record(holder)

    def prepare_join(self, pending: Pending) -> PreparedJoin:
        """Reserve the control-plane slot, derive, sign and seal. The caller must ``release()`` the result once the
        response is sent (it frees the control-plane slot)."""
        grant = pending.grant
        release = _noop
        if grant.control_plane:
            if not self._control_plane.acquire(blocking=False):
                raise Refusal("ABORTED", "control-plane-busy", f"{CONTROL_PLANE_BUSY}; retry in a few seconds")
            release = _once(self._control_plane.release)
        try:
            payload = self._identity_payload(grant.disk_uuid)
            try:
                files = self._pki.control_plane_files() if grant.control_plane else {}
                kubelet_crt = self._pki.sign_kubelet_client(pending.csr, grant.node_name, self._now())
            except PkiError as exc:
                raise Refusal("INTERNAL", "pki", str(exc)) from None
            token = generate_token()
            payload.update({
                "node_name": grant.node_name,
                "control_plane": grant.control_plane,
                "api_server_endpoint": self.api_server_endpoint,
                "bootstrap_token": token,
                "ca_cert_hashes": [self._pki.ca_cert_hash],
                "ca_crt": self._pki.ca_pem.decode(),
                "kubelet_client_crt": kubelet_crt.decode(),
                "control_plane_files": {name: {"content": _b64(content), "mode": f"{mode:04o}"} for name, (content, mode) in files.items()},
                "kubernetes_version": self.kubernetes_version,
            })
            if grant.control_plane:
                # A control plane runs a join service of its own, which needs the root secrets.
                payload["cluster_secrets"] = self._secrets.to_document()
            envelope = self._seal(pending, payload)
        except BaseException:
            release()
            raise
        return PreparedJoin(pending, token, envelope, release)

    async def register_token(self, prepared: PreparedJoin) -> None:
        """The token becomes valid only now, for a ticket that is sealed and about to be sent."""
        try:
            async with self._registrations:
                await self.token_minter.mint(prepared.token, prepared.node_name)
        except TokenMintError as exc:
            raise Refusal("UNAVAILABLE", "token-mint", str(exc)) from None
        token_id = prepared.token.split(".")[0]
        self.live_tokens[token_id] = LiveToken(token_id, prepared.node_name, self._now())

    def prepare_rejoin(self, pending: Pending) -> bytes:
        """A rebooted member: disk key and measurement secret only."""
        return self._seal(pending, self._identity_payload(pending.grant.disk_uuid))

    # --- shared -------------------------------------------------------------------------------------------------

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
            self._nonces.check(nonce)
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

    def _identity_payload(self, disk_uuid: str) -> dict:
        return {
            "version": TICKET_VERSION,
            "cluster_id": self.cluster_id.hex(),
            "measurement_secret": _b64(self._measurement_secret),
            "measurement_salt": _b64(self._secrets.measurement_salt),
            "state_disk_key": _b64(derive.state_disk_key(self._secrets.master_key, self._secrets.master_salt, disk_uuid)),
        }

    def _seal(self, pending: Pending, payload: dict) -> bytes:
        try:
            return seal.seal(json.dumps(payload, sort_keys=True).encode(), pending.ephemeral_key, pending.flow, pending.nonce,
                             self.verifier_id)
        except seal.SealError as exc:
            raise Refusal.of("ephemeral-key", f"the evidence's user_data is not a usable ephemeral key: {exc}") from None
