# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the join service does for one request, independent of gRPC: two steps, nothing issued before the second.

Step 1 (``begin``, for a join or a rejoin): check the nonce (a MAC, its age, not used); verify the evidence against the
current measurement policy (PCR 15 zero for a join, zero or this cluster's mark for a rejoin); check that the quote
covers what the node asks for (``request.py``); identify the node by the evidence's EK; let the registry grant name,
role and disk; answer with a credential for the evidence's EK and AK, and nothing else (the grant is disclosed in the
ticket only). Nothing is signed, sealed or registered, and the nonce is not used up: a software key that claims TPM
attributes passes step 1, so what it leaves behind is bounded - a challenge lives ``PENDING_TTL`` seconds, a client
has at most ``MAX_PENDING_PER_CLIENT`` waiting, an EK at most ``MAX_PENDING_PER_EK`` (further ones are refused, none
is displaced), and one per EK and connection (a node's new challenge on its connection replaces its old one; a
neighbour behind the same address, on a connection of its own, cannot).

Step 2 (``activate``): the node proves it activated the credential (only the TPM holding the EK, with the AK loaded,
can). Only then: the nonce is used, the registry's grant is checked again (an enrolment changed in between counts), then
claim a first disk binding in the cluster's API (one disk per EK, one EK per disk), take the control-plane slot, derive
the disk key, sign the kubelet certificate for the granted name, seal the ticket to the evidence's ephemeral key, and
register the bootstrap token last. Every refusal is a ``Refusal`` raised before a token is registered.
"""

from __future__ import annotations

import asyncio
import datetime
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

from .._attestation.nonces import NonceLimitError
from .._attestation.policy import MeasurementPolicy
from .._attestation.verifier import VerificationError
from .._crypto import derive
from .._crypto.root_secrets import RootSecrets
from .bindings import ApiDiskBindings, BindingConflict
from .credential import proof_matches
from .crypto import CheckRequest, Checked, JoinCrypto, Refusal, SealRequest
from .nonces import MacNonces
from .pki import ClusterPki, PkiError
from .protocol import JOIN, REJOIN, ControlPlaneFile, JoinTicket, RejoinTicket
from .registry import Grant, NodeIdentity, NodeRegistry, RegistryRefusal
from .tokens import LiveToken, TokenMinter, TokenMintError, generate_token

# Challenges answered by nobody are forgotten after PENDING_TTL seconds; at most MAX_PENDING wait at once, at most
# MAX_PENDING_PER_CLIENT of one client (a site behind one address may join a few nodes at once).
MAX_PENDING = 4096
MAX_PENDING_PER_CLIENT = 16
# Challenges of one EK waiting at once (further ones are refused, none displaced): with PENDING_TTL, step 1 per EK over
# time; 16 named EKs hold a quarter of MAX_PENDING.
MAX_PENDING_PER_EK = 64
PENDING_TTL = 10.0
STEP1_NOT_GRANTED = (
    "the node registry does not grant what this request asks for (name, role or disk) to this TPM; the join "
    "service's log says why"
)
CONTROL_PLANE_BUSY = "another control-plane join is in progress"


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
    ak_trust_level: int
    warnings: list[dict]
    grant: Grant
    ephemeral_key: bytes
    secret: bytes
    expires: float
    kubelet_key: bytes = b""
    # Who asked and for what, to check the grant again at step 2; the client (its rate-limit key) whose slot it holds.
    identity: NodeIdentity | None = None
    requested: tuple = ()
    client: str = ""
    # The client's connection (its full address and port): the one slot it may replace.
    connection: str = ""
    # The AK proven by this activation and the TPM's clock info: recorded for continuous attestation.
    ak_name: bytes = b""
    clock: object = None

    @property
    def key(self) -> tuple[bytes, str, str]:
        return (self.nonce, self.grant.ek, self.client)

    @property
    def slot(self) -> tuple[str, str, str]:
        return (self.grant.ek, self.client, self.connection)


@dataclass(frozen=True, repr=False)
class ReservedJoin:
    """A join holding its control-plane slot (if it is a control plane's), its ticket waiting to be signed and sealed."""

    pending: Pending
    token: str
    seal: SealRequest
    release: Callable[[], None]

    def sealed(self, envelope: bytes) -> "PreparedJoin":
        return PreparedJoin(self.pending, self.token, envelope, self.release)


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

    Each step is cheap state work around one CPU-bound call of ``JoinCrypto`` (``check``, ``seal_ticket``): the service
    runs that call in its worker processes and the rest on its event loop, in this order, so every decision about
    state is taken once, in this process. ``begin_join``, ``begin_rejoin``, ``prepare_join`` and ``prepare_rejoin`` do
    all of a step in the calling thread (tests, tools).
    """

    def __init__(
        self,
        secrets: RootSecrets,
        pki: ClusterPki,
        policy: Callable[[], MeasurementPolicy],
        ek_cas: list,
        token_minter: TokenMinter,
        nonces: MacNonces,
        registry: NodeRegistry,
        disk_bindings: ApiDiskBindings,
        api_server_endpoint: str,
        kubernetes_version: str,
        verifier_id: str,
        now: Callable[[], datetime.datetime] = _utcnow,
        max_registrations: int = 16,
        clock=time.monotonic,
    ):
        self._secrets = secrets
        self._pki = pki
        self._policy = policy
        self.ek_cas = ek_cas
        self.token_minter = token_minter
        self._nonces = nonces
        self.registry = registry
        self.disk_bindings = disk_bindings
        self.api_server_endpoint = api_server_endpoint
        self.kubernetes_version = kubernetes_version
        self.verifier_id = verifier_id
        self._now = now
        self._clock = clock
        self._measurement_secret = secrets.measurement_secret()
        self.cluster_id = secrets.cluster_id()
        # The CPU-bound steps, for the calls that run a whole step here and a service without worker processes; workers hold their own.
        self.crypto = JoinCrypto(pki, ek_cas, self.cluster_id, verifier_id)
        self._control_plane = threading.Lock()
        # Oldest first: every challenge lives PENDING_TTL, so the expired ones are at the front. Indexed by nonce (step
        # 2), by EK and client (one each), and counted per client.
        self._pending: OrderedDict[tuple, Pending] = OrderedDict()
        self._by_nonce: dict[bytes, set[tuple]] = {}
        self._by_slot: dict[tuple[str, str, str], tuple] = {}
        self._per_client: dict[str, int] = {}
        self._per_ek: dict[str, int] = {}
        self._pending_lock = threading.Lock()
        # Tokens registered and not yet retired, by token ID (the service retires them once their node registered).
        self.live_tokens: dict[str, LiveToken] = {}
        # The quarantined EK's record (attest_state.ApiAttestationRecords.quarantined), or None; the service sets it.
        self.quarantined: Callable[[str], object] = lambda ek: None
        # At most this many registrations in flight at once (the API client's threads); joins beyond wait their turn.
        self._registrations = asyncio.Semaphore(max_registrations)

    @property
    def pki_dir(self) -> str:
        return self._pki.pki_dir

    def issue_nonce(self) -> bytes:
        return self._nonces.issue()

    def check_nonce(self, nonce: bytes) -> None:
        """VerificationError unless ``nonce`` is this service's, fresh and unused."""
        self._nonces.check(nonce)

    def use_nonce(self, nonce: bytes) -> None:
        self._nonces.consume(nonce)

    def policy(self) -> MeasurementPolicy:
        return self._policy()

    def _refuse_quarantined(self, ek: str) -> None:
        record = self.quarantined(ek)
        if record is not None:
            raise Refusal.of(
                "quarantined",
                f"this TPM (node {record.node_name}) is quarantined since {record.quarantined_at}: "
                f"{record.quarantine_reason[:300]}; it gets no ticket and no disk key until an operator releases it",
            )

    # --- step 1 -------------------------------------------------------------------------------------------------

    def begin_join(self, request: JoinRequest, client: str = "") -> Challenge:
        check = self.join_check(request)
        return self.accept(check, self.crypto.check(check), client)

    def begin_rejoin(self, request: RejoinRequest, client: str = "") -> Challenge:
        check = self.rejoin_check(request)
        return self.accept(check, self.crypto.check(check), client)

    def join_check(self, request: JoinRequest) -> CheckRequest:
        """What ``JoinCrypto.check`` verifies, once the nonce is known to be this service's, fresh and unused."""
        return self._check_request(
            CheckRequest(
                self._policy(),
                JOIN,
                request.evidence,
                request.nonce,
                request.node_name,
                request.control_plane,
                request.disk_uuid,
                request.kubelet_csr,
            )
        )

    def rejoin_check(self, request: RejoinRequest) -> CheckRequest:
        return self._check_request(
            CheckRequest(
                self._policy(),
                REJOIN,
                request.evidence,
                request.nonce,
                request.node_name,
                False,
                request.disk_uuid,
                b"",
            )
        )

    def _check_request(self, check: CheckRequest) -> CheckRequest:
        try:
            self._nonces.check(check.nonce)
        except VerificationError as exc:
            raise Refusal.of(exc.reason, str(exc)) from None
        return check

    def accept(self, check: CheckRequest, checked: Checked, client: str = "", connection: str = "") -> Challenge:
        """Let the registry grant and remember the challenge of ``client`` (its rate-limit key) on ``connection``. The
        nonce stays unused until step 2: a step 1 that nobody activates cannot burn it."""
        try:
            self._nonces.check(check.nonce)
        except VerificationError as exc:
            raise Refusal.of(exc.reason, str(exc)) from None
        identity = NodeIdentity(checked.ek, checked.ek_certificate)
        self._refuse_quarantined(checked.ek)
        requested = (check.node_name, check.control_plane, check.disk_uuid)
        try:
            grant = self.registry.grant(identity, check.flow, *requested)
        except RegistryRefusal as refusal:
            # Before step 2 the caller has proven no TPM: it learns no enrolled name, role or bound disk.
            raise Refusal.of(refusal.reason, str(refusal)).generic(STEP1_NOT_GRANTED) from None
        self._remember(
            Pending(
                check.flow,
                check.nonce,
                checked.ak_trust_level,
                checked.warnings,
                grant,
                checked.ephemeral_key,
                checked.secret,
                self._clock() + PENDING_TTL,
                checked.kubelet_key,
                identity,
                requested,
                client,
                connection,
                checked.ak_name,
                checked.clock,
            )
        )
        return Challenge(
            checked.credential.blob,
            checked.credential.encrypted_seed,
            grant.node_name,
            grant.control_plane,
            checked.ak_trust_level,
            checked.warnings,
        )

    def _remember(self, pending: Pending) -> None:
        with self._pending_lock:
            self._expire(self._clock())
            previous = self._by_slot.get(pending.slot)
            if previous is not None:
                self._drop(previous)
            ek = pending.grant.ek
            if self._per_ek.get(ek, 0) >= MAX_PENDING_PER_EK:
                raise Refusal.of(
                    "busy",
                    f"{MAX_PENDING_PER_EK} challenges of this TPM wait for their activation; retry in a few seconds",
                )
            if self._per_client.get(pending.client, 0) >= MAX_PENDING_PER_CLIENT:
                raise Refusal.of(
                    "busy",
                    f"{MAX_PENDING_PER_CLIENT} challenges of this client wait for their activation; retry in "
                    "a few seconds",
                )
            if len(self._pending) >= MAX_PENDING:
                raise Refusal.of(
                    "busy", f"{len(self._pending)} challenges wait for their activation; retry in a few seconds"
                )
            key = pending.key
            self._pending[key] = pending
            self._by_nonce.setdefault(pending.nonce, set()).add(key)
            self._by_slot[pending.slot] = key
            self._per_client[pending.client] = self._per_client.get(pending.client, 0) + 1
            self._per_ek[ek] = self._per_ek.get(ek, 0) + 1

    def _expire(self, now: float) -> None:
        while self._pending and next(iter(self._pending.values())).expires < now:
            self._drop(next(iter(self._pending)))

    def _drop(self, key: tuple) -> Pending:
        pending = self._pending.pop(key)
        keys = self._by_nonce[pending.nonce]
        keys.discard(key)
        if not keys:
            del self._by_nonce[pending.nonce]
        if self._by_slot.get(pending.slot) == key:
            del self._by_slot[pending.slot]
        for counts, name in ((self._per_client, pending.client), (self._per_ek, pending.grant.ek)):
            counts[name] -= 1
            if not counts[name]:
                del counts[name]
        return pending

    def pending(self) -> int:
        with self._pending_lock:
            return len(self._pending)

    # --- step 2 -------------------------------------------------------------------------------------------------

    def take(self, nonce: bytes, proof: bytes) -> Pending:
        """The pending request of this nonce whose credential the proof answers, once; then the nonce is used and the
        grant checked again. A wrong proof forgets the nonce's challenges as well."""
        with self._pending_lock:
            keys = list(self._by_nonce.get(nonce, ())) if isinstance(nonce, bytes) else []
            candidates = [self._drop(key) for key in keys]
        if not candidates:
            raise Refusal.of(
                "activation-unknown",
                "no challenge waits for this nonce: it was answered, it expired, or step 1 did not "
                "succeed; start again with a new nonce",
            )
        now = self._clock()
        live = [pending for pending in candidates if pending.expires >= now]
        if not live:
            raise Refusal.of(
                "activation-unknown",
                "the challenge expired before its activation proof arrived; start again with a new nonce",
            )
        matching = [pending for pending in live if proof_matches(pending.secret, pending.nonce, proof)]
        if not matching:
            raise Refusal.of(
                "credential-activation",
                "the activation proof does not match: the caller's TPM does not hold both the EK "
                "and the AK of the evidence",
            )
        pending = matching[0]
        self._refuse_quarantined(pending.grant.ek)
        try:
            self._nonces.consume(nonce)
        except VerificationError as exc:
            raise Refusal.of(exc.reason, str(exc)) from None
        except NonceLimitError as exc:
            raise Refusal.of("nonce-limit", str(exc)) from None
        self._recheck(pending)
        return pending

    def _recheck(self, pending: Pending) -> None:
        """The registry's grant again, now: an enrolment changed since step 1 (a control plane removed) counts."""
        if pending.identity is None:
            return
        try:
            grant = self.registry.grant(pending.identity, pending.flow, *pending.requested)
        except RegistryRefusal as refusal:
            raise Refusal.of(refusal.reason, f"{refusal} (checked again at activation)") from None
        before = pending.grant
        if (grant.node_name, grant.control_plane, grant.disk_uuid) != (
            before.node_name,
            before.control_plane,
            before.disk_uuid,
        ):
            raise Refusal.of(
                "grant-changed",
                f"the registry's grant changed since step 1 (now node {grant.node_name}, control plane: "
                f"{grant.control_plane}); start again with a new nonce",
            )

    async def claim_disk(self, pending: Pending) -> None:
        """A first binding becomes the node's only in the cluster's API, before anything is issued for it."""
        binding = pending.grant.bind
        if binding is None:
            return
        try:
            holder = await self.disk_bindings.claim(binding)
        except BindingConflict as exc:
            raise Refusal("UNAVAILABLE", "disk-binding", str(exc)) from None
        if holder.ek != binding.ek:
            self.registry.mirror.record(holder)
            raise Refusal.of(
                "disk-not-granted",
                f"disk {binding.disk_uuid} is bound to another node's TPM ({holder.node_name}): "
                "a node gets only its own disk's key; an operator releases a disk with "
                "remove_node.yml",
            )
        if holder.disk_uuid != binding.disk_uuid:
            raise Refusal.of(
                "disk-not-granted",
                f"this TPM's first join already claimed disk {holder.disk_uuid}; it may not "
                f"bind disk {binding.disk_uuid} as well",
            )
        self.registry.mirror.record(holder)

    def prepare_join(self, pending: Pending) -> PreparedJoin:
        """Reserve the control-plane slot, derive, sign and seal. The caller must ``release()`` the result once the
        response is sent (it frees the control-plane slot)."""
        reserved = self.reserve_join(pending)
        try:
            return reserved.sealed(self.crypto.seal_ticket(reserved.seal))
        except BaseException:
            reserved.release()
            raise

    def reserve_join(self, pending: Pending) -> "ReservedJoin":
        """Take the control-plane slot (a control plane's join), draw the token and build the ticket; what is left is
        ``JoinCrypto.seal_ticket`` of ``seal``. The caller must ``release()`` it once the response is sent or failed."""
        grant = pending.grant
        release = _noop
        if grant.control_plane:
            if not self._control_plane.acquire(blocking=False):
                raise Refusal("ABORTED", "control-plane-busy", f"{CONTROL_PLANE_BUSY}; retry in a few seconds")
            release = _once(self._control_plane.release)
        try:
            identity = self._identity(grant.disk_uuid)
            try:
                files = self._pki.control_plane_files() if grant.control_plane else {}
            except PkiError as exc:
                raise Refusal("INTERNAL", "pki", str(exc)) from None
            token = generate_token()
            # The kubelet client certificate is signed into it with the seal (JoinCrypto.seal_ticket).
            ticket = JoinTicket(
                node_name=grant.node_name,
                control_plane=grant.control_plane,
                cluster_id=identity.cluster_id,
                measurement_secret=identity.measurement_secret,
                measurement_salt=identity.measurement_salt,
                state_disk_key=identity.state_disk_key,
                api_server_endpoint=self.api_server_endpoint,
                bootstrap_token=token,
                ca_cert_hashes=(self._pki.ca_cert_hash,),
                ca_crt=self._pki.ca_pem.decode(),
                kubelet_client_crt="",
                control_plane_files=tuple(
                    ControlPlaneFile(name, content, mode) for name, (content, mode) in files.items()
                ),
                kubernetes_version=self.kubernetes_version,
                # A control plane runs a join service of its own, which needs the root secrets.
                cluster_secrets=self._secrets if grant.control_plane else None,
            )
        except BaseException:
            release()
            raise
        return ReservedJoin(
            pending,
            token,
            SealRequest(
                ticket,
                pending.ephemeral_key,
                pending.flow,
                pending.nonce,
                pending.kubelet_key,
                grant.node_name,
                self._now(),
            ),
            release,
        )

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
        return self.crypto.seal_ticket(self.rejoin_seal(pending))

    def rejoin_seal(self, pending: Pending) -> SealRequest:
        """A rebooted member: disk key and measurement secret only."""
        return SealRequest(self._identity(pending.grant.disk_uuid), pending.ephemeral_key, pending.flow, pending.nonce)

    # --- shared -------------------------------------------------------------------------------------------------

    def _identity(self, disk_uuid: str) -> RejoinTicket:
        """The cluster identity and the disk key: all a rejoin ticket carries, and where a join ticket starts."""
        return RejoinTicket(
            self.cluster_id,
            self._measurement_secret,
            self._secrets.measurement_salt,
            derive.state_disk_key(self._secrets.master_key, self._secrets.master_salt, disk_uuid),
        )
