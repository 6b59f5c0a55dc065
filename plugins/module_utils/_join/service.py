# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The join service daemon: gRPC over TLS on a control-plane node.

Run: python -m ansible_collections.confidential.kubernetes.plugins.module_utils._join.service --config FILE
SIGTERM/SIGINT drain it: Health turns NOT_SERVING, new RPCs get UNAVAILABLE, joins in flight finish, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import signal
import threading
import time
from typing import Callable

from . import joinservice_pb2 as pb2
from . import joinservice_pb2_grpc as pb2_grpc

try:
    import grpc
    from grpc import aio as grpc_aio
    from cryptography.hazmat.primitives import serialization
except ImportError as exc:  # reported by main() and build_service()
    GRPC_IMPORT_ERROR: ImportError | None = exc
else:
    GRPC_IMPORT_ERROR = pb2.IMPORT_ERROR or pb2_grpc.IMPORT_ERROR

from .._attestation.verifier import VerificationError, load_ca_certificates
from .._crypto import seal
from .._kubeadm import scrub
from .attest_handler import AttestJudge
from .attest_service import attestation_parts, attest_work
from .bindings import ApiDiskBindings
from .config import ConfigError, PolicyWatcher, ServiceConfig, load_config, load_root_secrets, read_private_file
from .issuance import Challenge, JoinRequest, Refusal, RejoinRequest, TicketIssuer
from .gate import ConnectionGate
from .admission import FLOOD_LOG_INTERVAL, AdmittedRegistration, CallAdmission
from .limits import CallLimits, PeerLimiter, peer_key
from .tolerant import Undecodable
from .log import StructuredLog
from .nonces import MacNonces
from .pki import ClusterPki, PkiError
from .protocol import REASON_METADATA, REJOIN
from .registry import BindingMirror, EnrolmentWatcher, NodeRegistry
from .kubeapi import ClusterApi
from .tokens import TOKEN_TTL, ApiTokenMinter, TokenMinter, TokenMintError
from .workers import WorkerPool

SERVING = "SERVING"
NOT_SERVING = "NOT_SERVING"
MAX_MESSAGE_BYTES = 256 * 1024
MAX_DETAILS = 1024
DRAIN_DELAY = 1.0
# Flood resistance beside the configurable caps: per-connection streams, TLS handshakes, connection lifetime, keepalive.
MAX_STREAMS_PER_CONNECTION = 32
HANDSHAKE_TIMEOUT_MS = 10_000
MAX_CONNECTION_AGE_MS = 30 * 60 * 1000
MAX_CONNECTION_AGE_GRACE_MS = 60_000
KEEPALIVE_TIME_MS = 60_000
KEEPALIVE_TIMEOUT_MS = 20_000
# The gate closes a connection idle this long after gRPC's own idle timeout (a GOAWAY the client may ignore).
IDLE_GRACE = 5.0
# Without a change from the watch, live tokens are looked at this often (expiry, a retirement that failed).
RETIRE_RECHECK = 5.0


class JoinServicer:
    """The RPC handlers: per-peer rate limits, requests handed to the issuer, refusals turned into gRPC statuses, every
    outcome logged.

    They run on the service's event loop, which only dispatches: the CPU-bound part of a request (verify, make the
    credential, sign, seal) runs in the worker processes (``workers.py``; in the loop's own thread with
    ``worker_processes: 0``), and the API calls (token registration, disk bindings) are awaited on the one API client's
    threads, so neither a slow API nor a burst of heavy requests stalls the loop that answers everyone else. All state
    (used nonces, pending challenges, the control-plane slot, live tokens) stays in this one process: the workers
    compute, the loop decides.
    """

    def __init__(
        self,
        issuer: TicketIssuer,
        log: StructuredLog,
        draining: threading.Event,
        workers: WorkerPool,
        nonce_limiter: PeerLimiter,
        ticket_limiter: PeerLimiter,
        policy: PolicyWatcher,
        attest: AttestJudge,
        gate: ConnectionGate | None = None,
        health_limiter: PeerLimiter | None = None,
    ):
        self._issuer = issuer
        self._health_limiter = health_limiter or nonce_limiter
        self._attest = attest
        self._gate = gate
        self._log = log
        self._draining = draining
        self._workers = workers
        self._nonce_limiter = nonce_limiter
        self._ticket_limiter = ticket_limiter
        self._policy = policy
        self._flood_logged = 0.0
        self._malformed = 0
        self._malformed_logged = float("-inf")

    async def _admit(self, context, request, event: str, limiter: PeerLimiter, while_draining: bool = False) -> str:
        """The caller's address, once its request decoded, the service is not draining (unless ``while_draining``) and the
        address is within its rate. RESOURCE_EXHAUSTED for a flood is logged once per FLOOD_LOG_INTERVAL, not once per request.
        The address is the real client's, which the gate forwarded."""
        peer = self._gate.client_peer(context.peer()) if self._gate is not None else context.peer()
        if self._draining.is_set() and not while_draining:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, "draining: the join service is shutting down; try another endpoint"
            )
        # A malformed request counts against its caller's rate like any other, and is logged once per FLOOD_LOG_INTERVAL.
        if limiter.allow(peer):
            if isinstance(request, Undecodable):
                self._malformed += 1
                message = bounded(str(request))
                now = time.monotonic()
                if now - self._malformed_logged >= FLOOD_LOG_INTERVAL:
                    self._malformed_logged = now
                    self._log.warning(
                        event,
                        result="refused",
                        code="INVALID_ARGUMENT",
                        reason="malformed",
                        msg=message,
                        peer=peer,
                        malformed_total=self._malformed,
                    )
                context.set_trailing_metadata(((REASON_METADATA, "malformed"),))
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed: {message}")
            return peer
        now = time.monotonic()
        if now - self._flood_logged >= FLOOD_LOG_INTERVAL:
            self._flood_logged = now
            self._log.warning(
                event,
                result="refused",
                reason="rate-limit",
                peer=peer,
                refused_total=limiter.refused,
                rate=limiter.rate,
                burst=limiter.burst,
            )
        context.set_trailing_metadata(((REASON_METADATA, "rate-limit"),))
        await context.abort(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"rate-limit: more than {limiter.rate:g} requests per second from this address; retry later",
        )
        return peer

    async def GetNonce(self, request, context):  # noqa: N802 - gRPC method name
        await self._admit(context, request, "nonce", self._nonce_limiter)
        return pb2.GetNonceResponse(nonce=self._issuer.issue_nonce(), verifier_id=self._issuer.verifier_id)

    async def IssueJoinTicket(self, request, context):  # noqa: N802 - gRPC method name
        peer = await self._admit(context, request, "join", self._ticket_limiter)
        join = JoinRequest(
            request.evidence,
            request.nonce,
            request.node_name,
            request.control_plane,
            request.kubelet_csr,
            request.disk_uuid,
        )
        challenge = await self._outcome(
            context,
            peer,
            "join",
            request.node_name,
            self._begin(self._issuer.join_check, join, peer),
            "challenged",
            control_plane=request.control_plane,
        )
        return _challenge_message(challenge)

    async def IssueRejoinTicket(self, request, context):  # noqa: N802 - gRPC method name
        peer = await self._admit(context, request, "rejoin", self._ticket_limiter)
        rejoin = RejoinRequest(request.evidence, request.nonce, request.node_name, request.disk_uuid)
        challenge = await self._outcome(
            context,
            peer,
            "rejoin",
            request.node_name,
            self._begin(self._issuer.rejoin_check, rejoin, peer),
            "challenged",
        )
        return _challenge_message(challenge)

    async def ActivateTicket(self, request, context):  # noqa: N802 - gRPC method name
        peer = await self._admit(context, request, "activate", self._ticket_limiter)
        try:
            pending = self._issuer.take(request.nonce, request.activation_proof)
        except Refusal as refusal:
            await self._refuse(context, "activate", refusal, {"peer": peer}, time.monotonic())
            raise
        grant = pending.grant

        async def issue() -> bytes:
            if pending.flow == REJOIN:
                sealed = await self._workers.seal_ticket(self._issuer.rejoin_seal(pending))
            else:
                await self._issuer.claim_disk(pending)
                reserved = self._issuer.reserve_join(pending)
                # The control-plane slot stays taken until the response is sent (or the RPC fails or is cancelled).
                context.add_done_callback(lambda unused_context: reserved.release())
                prepared = reserved.sealed(await self._workers.seal_ticket(reserved.seal))
                await self._issuer.register_token(prepared)
                sealed = prepared.envelope
            # The AK this activation proved and the TPM's counters now: continuous attestation's starting point.
            await self._attest.enrolled_quietly(pending, self._log)
            return sealed

        sealed = await self._outcome(
            context,
            peer,
            pending.flow,
            grant.node_name,
            issue(),
            "issued",
            control_plane=grant.control_plane,
            disk_uuid=grant.disk_uuid,
            source=grant.source,
            ak_trust_level=pending.ak_trust_level,
            warnings=pending.warnings,
        )
        return pb2.ActivateTicketResponse(sealed_ticket=sealed)

    async def Attest(self, request, context):  # noqa: N802 - gRPC method name
        peer = await self._admit(context, request, "attest", self._ticket_limiter)
        await self._outcome(context, peer, "attest", "", attest_work(self._attest, self._workers, request), "passed")
        return pb2.AttestResponse(result="passed", next_attestation_seconds=int(self._attest.interval))

    async def Health(self, request, context):  # noqa: N802 - gRPC method name
        await self._admit(context, request, "health", self._health_limiter, while_draining=True)
        # A push is noticed at once: the watchers re-read a changed file (at most once per policy_check_interval).
        policy, enrolment = self._policy, self._issuer.registry.enrolment
        policy.current()
        enrolment.current()
        return pb2.HealthResponse(
            status=NOT_SERVING if self._draining.is_set() else SERVING,
            policy_digest=policy.digest,
            policy_rejected_digest=policy.rejected_digest,
            policy_error=bounded(policy.error),
            enrolment_digest=enrolment.digest,
            enrolment_rejected_digest=enrolment.rejected_digest,
            enrolment_error=bounded(enrolment.error),
        )

    async def _begin(self, make_check, request, peer: str) -> Challenge:
        """Step 1: the nonce checked here, the evidence and request in a worker, the grant made and the challenge kept here
        (counted against the client's rate-limit key, in the slot of its connection: ``peer`` has the port)."""
        check = make_check(request)
        return self._issuer.accept(
            check, await self._workers.check(check), peer_key(peer, self._ticket_limiter.ipv6_prefix), peer
        )

    async def _outcome(self, context, peer: str, event: str, node_name: str, work, result: str, **fields: object):
        started = time.monotonic()
        fields.update(node_name=node_name[:253], peer=peer)
        try:
            outcome = await work
        except Refusal as refusal:
            await self._refuse(context, event, refusal, fields, started)
            raise
        except Exception as exc:  # noqa: BLE001 - the log gets the failure, the client a generic status
            self._log.error(
                event,
                result="error",
                reason="internal",
                error=type(exc).__name__,
                msg=scrub(str(exc)),
                duration_ms=_elapsed_ms(started),
                **fields,
            )
            context.set_trailing_metadata(((REASON_METADATA, "internal"),))
            await context.abort(
                grpc.StatusCode.INTERNAL, "internal: the join service failed on this request; its log says why"
            )
            raise
        if isinstance(outcome, Challenge):
            fields.update(
                granted_node_name=outcome.node_name,
                granted_control_plane=outcome.control_plane,
                ak_trust_level=outcome.ak_trust_level,
                warnings=outcome.warnings,
            )
        self._log.info(event, result=result, duration_ms=_elapsed_ms(started), **fields)
        return outcome

    async def _refuse(self, context, event: str, refusal: Refusal, fields: dict, started: float) -> None:
        message = bounded(str(refusal))
        self._log.warning(
            event,
            result="refused",
            code=refusal.code,
            reason=refusal.reason,
            msg=message,
            mismatches=refusal.mismatches,
            duration_ms=_elapsed_ms(started),
            **fields,
        )
        context.set_trailing_metadata(((REASON_METADATA, refusal.reason),))
        told = message if refusal.public is None else refusal.public
        await context.abort(getattr(grpc.StatusCode, refusal.code), f"{refusal.reason}: {told}")


def _challenge_message(challenge: Challenge):
    """The credential only: what the registry granted (name, role, disk) is disclosed in the sealed ticket, to the TPM
    that activated the credential, never to whoever can produce step 1's evidence."""
    return pb2.Challenge(
        credential_blob=challenge.credential_blob, credential_encrypted_seed=challenge.credential_encrypted_seed
    )


def bounded(message: str) -> str:
    """A refusal message short enough for a gRPC status (clients drop metadata over 16 KiB) and a log line.

    Messages quote what the node sent (a node name, a field of the evidence), which an attacker can make huge.
    """
    if len(message) <= MAX_DETAILS:
        return message
    return f"{message[:MAX_DETAILS]}... ({len(message) - MAX_DETAILS} more characters)"


def _elapsed_ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)


def grpc_server(
    config: ServiceConfig,
    servicer,
    tls_cert_pem: bytes,
    tls_key_pem: bytes,
    listen: str | None = None,
    admission: CallAdmission | None = None,
):
    """The service's gRPC server around ``servicer`` (TLS, flood limits, the call admission, the tolerant registration),
    not started, and the port it listens on (0: it cannot), on ``listen`` (default ``config.listen``). Called on the
    event loop that will serve it. The benchmark measures the transport alone through it (a servicer of fixed answers)."""
    if admission is None:
        admission = CallAdmission(call_limits(config), config.request_message_timeout, StructuredLog())
    options = [
        # No SO_REUSEPORT: a second service on the same port must fail to start, not share it silently.
        ("grpc.so_reuseport", 0),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_allowed_incoming_connections", config.max_connections),
        ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
        ("grpc.server_handshake_timeout_ms", HANDSHAKE_TIMEOUT_MS),
        ("grpc.max_connection_idle_ms", int(config.connection_idle_timeout * 1000)),
        ("grpc.max_connection_age_ms", MAX_CONNECTION_AGE_MS),
        ("grpc.max_connection_age_grace_ms", MAX_CONNECTION_AGE_GRACE_MS),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.http2.max_ping_strikes", 2),
        # No bandwidth-delay probing: its pings buy window growth for bulk streams and cost CPU on every connection of a
        # service whose messages are a few kB (bench/join_service.py, 64 clients: 3 to 8 % less service CPU per join).
        ("grpc.http2.bdp_probe", 0),
    ]
    # gRPC's own cap is the backstop behind the admission's, which refuses a call at its headers: calls being refused
    # hold gRPC's places for an instant.
    server = grpc_aio.server(options=options, maximum_concurrent_rpcs=2 * config.max_concurrent_rpcs)
    pb2_grpc.add_JoinServiceServicer_to_server(servicer, AdmittedRegistration(server, admission))
    return server, server.add_secure_port(
        listen or config.listen, grpc.ssl_server_credentials([(tls_key_pem, tls_cert_pem)])
    )


def call_limits(config: ServiceConfig) -> CallLimits:
    return CallLimits(config.max_calls_per_client, config.max_calls_per_network, config.max_concurrent_rpcs)


class JoinService:
    """The gRPC server (grpc.aio on an event loop thread of its own) around a TicketIssuer, with a draining shutdown and
    the background tasks that retire used tokens and mirror the cluster's disk bindings (both driven by the API's
    watches).

    ``start``, ``shutdown`` and ``stop_now`` are called from ordinary threads (main(), tests, the benchmark).
    """

    def __init__(
        self,
        issuer: TicketIssuer,
        policy: PolicyWatcher,
        tls_cert_pem: bytes,
        tls_key_pem: bytes,
        config: ServiceConfig,
        log: StructuredLog,
        drain_delay: float = DRAIN_DELAY,
    ):
        if GRPC_IMPORT_ERROR is not None:
            raise ConfigError(f"grpcio and protobuf are required for the join service: {GRPC_IMPORT_ERROR}")
        self.issuer = issuer
        self.listen = config.listen
        self.config = config
        self.draining = threading.Event()
        self._log = log
        self._drain_delay = drain_delay
        self._policy = policy
        self._disk_bindings = issuer.disk_bindings
        ek_ca_pem = b"".join(certificate.public_bytes(serialization.Encoding.PEM) for certificate in issuer.ek_cas)
        self.workers = WorkerPool(
            self.config.worker_processes,
            issuer.crypto,
            (issuer.pki_dir, ek_ca_pem, issuer.cluster_id, issuer.verifier_id),
            log,
        )
        self.nonce_limiter = PeerLimiter(
            self.config.nonce_rate, self.config.nonce_burst, ipv6_prefix=self.config.client_ipv6_prefix
        )
        self.ticket_limiter = PeerLimiter(
            self.config.ticket_rate, self.config.ticket_burst, ipv6_prefix=self.config.client_ipv6_prefix
        )
        self.health_limiter = PeerLimiter(
            self.config.health_rate, self.config.health_burst, ipv6_prefix=self.config.client_ipv6_prefix
        )
        self.gate: ConnectionGate | None = None
        self.judge, self.enforcer = attestation_parts(issuer, config, log)
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._background: list[asyncio.Task] = []
        self._stopped = False
        self._server = None
        try:
            self.port = self._loop.run_until_complete(self._bind(tls_cert_pem, tls_key_pem))
        except RuntimeError as exc:
            self._loop.close()
            raise ConfigError(f"cannot listen on {self.listen}: {exc}") from None
        if not self.port:
            self._loop.close()
            raise ConfigError(f"cannot listen on {self.listen} (address in use or not local)")

    async def _bind(self, tls_cert_pem: bytes, tls_key_pem: bytes) -> int:
        """gRPC on a loopback port of its own, the gate on the service's address in front of it; the gate's port."""
        config = self.config
        self.gate = ConnectionGate(
            0,
            self._log,
            config.max_connections_per_client,
            config.max_connections,
            config.client_ipv6_prefix,
            config.handshake_timeout,
            config.first_rpc_timeout,
            per_network=config.max_connections_per_network,
            idle_timeout=config.connection_idle_timeout + IDLE_GRACE,
        )
        self.calls = CallAdmission(call_limits(config), config.request_message_timeout, self._log, self.gate)
        servicer = JoinServicer(
            self.issuer,
            self._log,
            self.draining,
            self.workers,
            self.nonce_limiter,
            self.ticket_limiter,
            self._policy,
            self.judge,
            self.gate,
            self.health_limiter,
        )
        self._server, upstream_port = grpc_server(
            config, servicer, tls_cert_pem, tls_key_pem, listen="127.0.0.1:0", admission=self.calls
        )
        if not upstream_port:
            return 0
        self.gate.upstream_port = upstream_port
        host, port = config.listen.rsplit(":", 1)
        try:
            return await self.gate.start(host, int(port))
        except OSError as exc:
            raise RuntimeError(exc.strerror or str(exc)) from None

    def on_loop(self, coroutine):
        """Run ``coroutine`` on the service's event loop (from another thread) and return its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def start(self) -> "JoinService":
        self._thread = threading.Thread(target=self._loop.run_forever, name="joinservice-loop", daemon=True)
        self._thread.start()
        self.on_loop(self.workers.start())
        self.on_loop(self._server.start())
        self.on_loop(self._start_background())
        self._log.info(
            "start",
            result="serving",
            listen=self.listen,
            port=self.port,
            verifier_id=self.issuer.verifier_id,
            cluster_id=self.issuer.cluster_id.hex(),
            enrolled=len(self.issuer.registry.enrolment.value.by_ek),
            pool_workers=self.config.pool_workers,
            worker_processes=self.workers.processes,
        )
        return self

    async def _start_background(self) -> None:
        self._background = [
            asyncio.ensure_future(self._retire_used_tokens()),
            asyncio.ensure_future(self._mirror_disk_bindings()),
            asyncio.ensure_future(self.enforcer.run()),
        ]
        self.judge.records.follow(lambda: None, self._log_failure("attestation-sync", "failed"))

    def _wake(self, event: asyncio.Event) -> Callable[[], None]:
        """A callback for a watch's thread that sets ``event`` on the service's loop."""

        def wake() -> None:
            try:
                self._loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # the service stopped
                pass

        return wake

    def _log_failure(self, event: str, result: str) -> Callable[[str], None]:
        return lambda message: self._log.warning(event, result=result, msg=message)

    async def _retire_used_tokens(self) -> None:
        """Delete each bootstrap token once the watch sees its node's kubelet registered; forget those past expiry."""
        minter, live = self.issuer.token_minter, self.issuer.live_tokens
        changed = asyncio.Event()
        minter.follow(self._wake(changed), self._log_failure("token", "unchecked"))
        try:
            for token in await minter.live():
                live.setdefault(token.token_id, token)
        except TokenMintError as exc:
            self._log.warning("token", result="not-adopted", msg=str(exc))
        while True:
            # A change the watch saw, or time to drop expired tokens and try a failed retirement again.
            try:
                await asyncio.wait_for(changed.wait(), RETIRE_RECHECK)
            except asyncio.TimeoutError:
                pass
            changed.clear()
            expired = datetime.datetime.now(datetime.timezone.utc) - TOKEN_TTL
            for token_id in [t.token_id for t in live.values() if t.issued < expired]:
                del live[token_id]
            if not live:
                continue
            for token_id in minter.registered(list(live.values())):
                try:
                    await minter.retire(token_id)
                except TokenMintError as exc:
                    self._log.warning("token", result="not-retired", token_id=token_id, msg=str(exc))
                    continue
                token = live.pop(token_id, None)
                self._log.info(
                    "token",
                    result="retired",
                    token_id=token_id,
                    node_name=token.node_name if token else None,
                    msg="the node's kubelet registered: its bootstrap token is deleted",
                )

    async def _mirror_disk_bindings(self) -> None:
        """Copy the cluster's disk bindings into this control plane's bindings file, at start and on every change the
        watch sees."""
        changed = asyncio.Event()
        failing = [False]

        def failed(message: str) -> None:
            failing[0] = True
            self._log.warning("bindings-sync", result="failed", msg=message)

        self._disk_bindings.follow(self._wake(changed), failed)
        while True:
            await changed.wait()
            changed.clear()
            bindings = self._disk_bindings.watched()
            try:
                mirrored = self.issuer.registry.mirror.replace(bindings)
            except OSError as exc:
                self._log.warning("bindings-sync", result="failed", msg=f"cannot write the bindings mirror: {exc}")
                failing[0] = True
                continue
            if mirrored or failing[0]:
                self._log.info("bindings-sync", result="mirrored", bindings=len(bindings))
            failing[0] = False

    def shutdown(self, grace: float) -> None:
        """Health says NOT_SERVING and new RPCs are refused; joins in flight get ``grace`` seconds to finish."""
        started = time.monotonic()
        self.draining.set()
        self._log.info("shutdown", result="draining", grace_s=grace)
        time.sleep(self._drain_delay)
        self._stop(grace)
        self._log.info("shutdown", result="stopped", duration_ms=_elapsed_ms(started))

    def stop_now(self) -> None:
        """Stop without grace, cancelling RPCs in flight (tests: a crashed service)."""
        self.draining.set()
        self._stop(None)

    def _stop(self, grace: float | None) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._thread is not None:
            self.on_loop(self.gate.stop_accepting())
            self.on_loop(self._server.stop(grace))
            self.on_loop(self.gate.close())
            self.on_loop(_cancel_remaining_tasks())
            self.on_loop(self.workers.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()
        self.workers.join()
        self._disk_bindings.api.close()


async def _cancel_remaining_tasks() -> None:
    """RPCs the server cancelled may still be unwinding (an awaited registration), and the background tasks run: let them
    finish before the loop closes."""
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=5)


def _ek_cas(config: ServiceConfig, policy: PolicyWatcher) -> list:
    if config.ek_ca_file:
        try:
            with open(config.ek_ca_file, "rb") as handle:
                return load_ca_certificates(handle.read())
        except OSError as exc:
            raise ConfigError(f"cannot read EK CA file {config.ek_ca_file}: {exc.strerror}") from None
        except VerificationError as exc:
            raise ConfigError(f"EK CA file {config.ek_ca_file}: {exc}") from None
    if policy.policy.ak_trust_level >= 2:
        raise ConfigError(
            f"measurement policy {config.policy_file} requires EK certificates (ak_trust: ek-certificate) "
            "but the configuration names no ek_ca_file"
        )
    return []


def build_issuer(
    config: ServiceConfig,
    log: StructuredLog,
    token_minter: TokenMinter | None = None,
    nonces: MacNonces | None = None,
    policy: PolicyWatcher | None = None,
    api: ClusterApi | None = None,
) -> TicketIssuer:
    """The issuer, its files checked first; its one API client is ``api`` or made from ``config.admin_kubeconfig``
    (``issuer.disk_bindings.api``, which the caller closes). ``token_minter`` replaces the API for tokens (the load
    suite records them instead)."""
    if seal.CRYPTOGRAPHY_IMPORT_ERROR is not None:
        raise ConfigError(f"cryptography >= 47 is required for the join service: {seal.CRYPTOGRAPHY_IMPORT_ERROR}")
    secrets = load_root_secrets(config.secrets_file)
    policy = policy or PolicyWatcher(config.policy_file, log, interval=config.policy_check_interval)
    ek_cas = _ek_cas(config, policy)
    try:
        pki = ClusterPki.load(config.pki_dir)
    except PkiError as exc:
        raise ConfigError(str(exc)) from None
    enrolment = EnrolmentWatcher(config.enrolment_file, log, interval=config.policy_check_interval)
    registry = NodeRegistry(
        enrolment, BindingMirror(config.bindings_file), ek_cas, config.pool_name_prefix if config.pool_workers else None
    )
    if api is None:
        try:
            api = ClusterApi.from_kubeconfig(config.admin_kubeconfig, pool_size=config.max_registrations)
        except RuntimeError as exc:
            raise ConfigError(str(exc)) from None
    return TicketIssuer(
        secrets,
        pki,
        policy.current,
        ek_cas,
        token_minter or ApiTokenMinter(api),
        nonces or MacNonces(ttl=config.nonce_ttl),
        registry,
        ApiDiskBindings(api),
        config.api_server_endpoint,
        config.kubernetes_version,
        config.verifier_id,
        max_registrations=config.max_registrations,
    )


def build_service(
    config: ServiceConfig,
    log: StructuredLog,
    token_minter: TokenMinter | None = None,
    nonces: MacNonces | None = None,
    drain_delay: float = DRAIN_DELAY,
    api: ClusterApi | None = None,
) -> JoinService:
    """The service around ``build_issuer``'s issuer; stopping it closes the API client."""
    policy = PolicyWatcher(config.policy_file, log, interval=config.policy_check_interval)
    issuer = build_issuer(config, log, token_minter, nonces, policy, api)
    try:
        try:
            with open(config.tls_cert, "rb") as handle:
                cert_pem = handle.read()
        except OSError as exc:
            raise ConfigError(f"cannot read TLS certificate {config.tls_cert}: {exc.strerror}") from None
        key_pem = read_private_file(config.tls_key, "TLS key")
        return JoinService(issuer, policy, cert_pem, key_pem, config, log, drain_delay)
    except BaseException:
        issuer.disk_bindings.api.close()
        raise


def main(argv: list[str] | None = None, token_minter: TokenMinter | None = None, api: ClusterApi | None = None) -> int:
    """The daemon; ``token_minter`` and ``api`` replace the cluster's API (the load suite records tokens instead)."""
    parser = argparse.ArgumentParser(prog="joinservice", description="confidential.kubernetes join service")
    parser.add_argument("--config", required=True, help="service configuration file (YAML or JSON)")
    args = parser.parse_args(argv)
    log = StructuredLog()
    try:
        config = load_config(args.config)
        service = build_service(config, log, token_minter, api=api).start()
    except ConfigError as exc:
        log.error("start", result="failed", msg=str(exc))
        return 2
    stop = threading.Event()

    def request_stop(signum, frame):  # pylint: disable=unused-argument
        log.info("signal", signal=signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    while not stop.wait(1.0):
        pass
    service.shutdown(config.grace_period)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
