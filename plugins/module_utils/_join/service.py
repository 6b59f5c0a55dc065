# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The join service daemon: gRPC over TLS on a control-plane node.

Run: python -m ansible_collections.confidential.kubernetes.plugins.module_utils._join.service --config FILE
SIGTERM/SIGINT drain it: Health turns NOT_SERVING, new RPCs get UNAVAILABLE, joins in flight finish, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import threading
import time

from . import joinservice_pb2 as pb2
from . import joinservice_pb2_grpc as pb2_grpc

try:
    import grpc
    from google.protobuf.message import DecodeError
    from grpc import aio as grpc_aio
except ImportError as exc:  # reported by main() and build_service()
    GRPC_IMPORT_ERROR: ImportError | None = exc
else:
    GRPC_IMPORT_ERROR = pb2.IMPORT_ERROR or pb2_grpc.IMPORT_ERROR

from .._attestation.nonces import NonceLimitError, NonceStore
from .._attestation.verifier import VerificationError, load_ca_certificates
from .._crypto import seal
from .._kubeadm import scrub
from .config import ConfigError, PolicyWatcher, ServiceConfig, load_config, load_root_secrets, read_private_file
from .issuance import IssuedTicket, JoinRequest, Refusal, RejoinRequest, TicketIssuer
from .log import StructuredLog
from .pki import ClusterPki, PkiError
from .tokens import KubectlTokenMinter, TokenMinter

SERVING = "SERVING"
NOT_SERVING = "NOT_SERVING"
REASON_METADATA = "confidential-kubernetes-reason"
MAX_MESSAGE_BYTES = 256 * 1024
MAX_DETAILS = 1024
DRAIN_DELAY = 1.0


class Undecodable:
    """A request body that is not the RPC's protobuf message; the servicer refuses it as malformed."""

    def __init__(self, message_type: str, error: str):
        self.message_type = message_type
        self.error = error

    def __str__(self) -> str:
        return f"the request is not a valid {self.message_type} message ({self.error})"


def _tolerant(deserializer):
    def deserialize(raw: bytes):
        try:
            return deserializer(raw)
        except DecodeError as exc:
            return Undecodable(getattr(deserializer, "__self__", object).__name__, str(exc))
    return deserialize


class _TolerantRegistration:
    """Registers the generated handlers with deserializers that hand an undecodable body to the servicer.

    Without this grpc answers such a body with UNKNOWN "Unexpected DecodeError", unlogged; the servicer turns
    it into INVALID_ARGUMENT with reason 'malformed', like every other refusal.
    """

    def __init__(self, server):
        self._server = server

    def add_generic_rpc_handlers(self, handlers) -> None:
        """The generated code also registers the same methods below; those are the ones served."""

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        tolerant = {name: handler._replace(request_deserializer=_tolerant(handler.request_deserializer)) for name, handler in handlers.items()}
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, tolerant),))
        self._server.add_registered_method_handlers(service, tolerant)


class JoinServicer:
    """The RPC handlers: translate requests for the issuer, refusals into gRPC statuses, and log every outcome.

    They run on the service's event loop: the CPU-bound part of a join (verify, sign, seal) runs there one request
    at a time, which is what the interpreter lock allows anyway; the token registration (a kubectl subprocess) is
    awaited, so slow registrations overlap with each other and with the next requests.
    """

    def __init__(self, issuer: TicketIssuer, log: StructuredLog, draining: threading.Event):
        self._issuer = issuer
        self._log = log
        self._draining = draining

    async def _refuse_while_draining(self, context) -> None:
        if self._draining.is_set():
            await context.abort(grpc.StatusCode.UNAVAILABLE, "draining: the join service is shutting down; try another endpoint")

    async def _refuse_undecodable(self, context, request, event: str) -> None:
        if isinstance(request, Undecodable):
            message = bounded(str(request))
            self._log.warning(event, result="refused", code="INVALID_ARGUMENT", reason="malformed", msg=message, peer=context.peer())
            context.set_trailing_metadata(((REASON_METADATA, "malformed"),))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed: {message}")

    async def GetNonce(self, request, context):  # noqa: N802 - gRPC method name
        await self._refuse_undecodable(context, request, "nonce")
        await self._refuse_while_draining(context)
        try:
            nonce = self._issuer.issue_nonce()
        except NonceLimitError as exc:
            self._log.warning("nonce", result="refused", reason="nonce-limit", msg=str(exc), peer=context.peer())
            context.set_trailing_metadata(((REASON_METADATA, "nonce-limit"),))
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"nonce-limit: {exc}")
            raise
        return pb2.GetNonceResponse(nonce=nonce, verifier_id=self._issuer.verifier_id)

    async def IssueJoinTicket(self, request, context):  # noqa: N802 - gRPC method name
        await self._refuse_undecodable(context, request, "join")
        await self._refuse_while_draining(context)
        join = JoinRequest(request.evidence, request.nonce, request.node_name, request.control_plane, request.kubelet_csr, request.disk_uuid)

        async def issue() -> IssuedTicket:
            prepared = self._issuer.prepare_join(join)
            # The control-plane slot stays taken until the response is sent (or the RPC is cancelled).
            context.add_done_callback(lambda unused_context: prepared.release())
            await self._issuer.register_token(prepared)
            return self._issuer.finish(prepared)

        ticket = await self._issue(context, "join", request.node_name, issue(), control_plane=request.control_plane)
        return pb2.IssueJoinTicketResponse(sealed_ticket=ticket.sealed_ticket, credential_blob=ticket.credential_blob,
                                           credential_encrypted_seed=ticket.credential_encrypted_seed)

    async def IssueRejoinTicket(self, request, context):  # noqa: N802 - gRPC method name
        await self._refuse_undecodable(context, request, "rejoin")
        await self._refuse_while_draining(context)
        rejoin = RejoinRequest(request.evidence, request.nonce, request.node_name, request.disk_uuid)

        async def issue() -> IssuedTicket:
            return self._issuer.issue_rejoin_ticket(rejoin)

        ticket = await self._issue(context, "rejoin", request.node_name, issue())
        return pb2.IssueRejoinTicketResponse(sealed_ticket=ticket.sealed_ticket, credential_blob=ticket.credential_blob,
                                             credential_encrypted_seed=ticket.credential_encrypted_seed)

    async def Health(self, request, context):  # noqa: N802 - gRPC method name
        await self._refuse_undecodable(context, request, "health")
        return pb2.HealthResponse(status=NOT_SERVING if self._draining.is_set() else SERVING)

    async def _issue(self, context, event: str, node_name: str, work, **fields: object) -> IssuedTicket:
        started = time.monotonic()
        fields.update(node_name=node_name[:253], peer=context.peer())
        try:
            ticket = await work
        except Refusal as refusal:
            message = bounded(str(refusal))
            self._log.warning(event, result="refused", code=refusal.code, reason=refusal.reason, msg=message,
                              mismatches=refusal.mismatches, duration_ms=_elapsed_ms(started), **fields)
            context.set_trailing_metadata(((REASON_METADATA, refusal.reason),))
            await context.abort(getattr(grpc.StatusCode, refusal.code), f"{refusal.reason}: {message}")
            raise
        except Exception as exc:  # noqa: BLE001 - the log gets the failure, the client a generic status
            self._log.error(event, result="error", reason="internal", error=type(exc).__name__, msg=scrub(str(exc)),
                            duration_ms=_elapsed_ms(started), **fields)
            context.set_trailing_metadata(((REASON_METADATA, "internal"),))
            await context.abort(grpc.StatusCode.INTERNAL, "internal: the join service failed on this request; its log says why")
            raise
        self._log.info(event, result="issued", ak_trust_level=ticket.ak_trust_level, warnings=ticket.warnings,
                       duration_ms=_elapsed_ms(started), **fields)
        return ticket


def bounded(message: str) -> str:
    """A refusal message short enough for a gRPC status (clients drop metadata over 16 KiB) and a log line.

    Messages quote what the node sent (a node name, a field of the evidence), which an attacker can make huge.
    """
    if len(message) <= MAX_DETAILS:
        return message
    return f"{message[:MAX_DETAILS]}... ({len(message) - MAX_DETAILS} more characters)"


def _elapsed_ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)


class JoinService:
    """The gRPC server (grpc.aio on an event loop thread of its own) around a TicketIssuer, with a draining shutdown.

    ``start``, ``shutdown`` and ``stop_now`` are called from ordinary threads (main(), tests, the benchmark).
    """

    def __init__(self, issuer: TicketIssuer, tls_cert_pem: bytes, tls_key_pem: bytes, listen: str, log: StructuredLog,
                 drain_delay: float = DRAIN_DELAY):
        if GRPC_IMPORT_ERROR is not None:
            raise ConfigError(f"grpcio and protobuf are required for the join service: {GRPC_IMPORT_ERROR}")
        self.issuer = issuer
        self.listen = listen
        self.draining = threading.Event()
        self._log = log
        self._drain_delay = drain_delay
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._server = None
        credentials = grpc.ssl_server_credentials([(tls_key_pem, tls_cert_pem)])
        try:
            self.port = self._loop.run_until_complete(self._bind(credentials))
        except RuntimeError as exc:
            self._loop.close()
            raise ConfigError(f"cannot listen on {listen}: {exc}") from None
        if not self.port:
            self._loop.close()
            raise ConfigError(f"cannot listen on {listen} (address in use or not local)")

    async def _bind(self, credentials) -> int:
        # No SO_REUSEPORT: a second service on the same port must fail to start, not share it silently.
        self._server = grpc_aio.server(options=[("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)])
        pb2_grpc.add_JoinServiceServicer_to_server(JoinServicer(self.issuer, self._log, self.draining), _TolerantRegistration(self._server))
        return self._server.add_secure_port(self.listen, credentials)

    def _on_loop(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def start(self) -> "JoinService":
        self._thread = threading.Thread(target=self._loop.run_forever, name="joinservice-loop", daemon=True)
        self._thread.start()
        self._on_loop(self._server.start())
        self._log.info("start", result="serving", listen=self.listen, port=self.port, verifier_id=self.issuer.verifier_id,
                       cluster_id=self.issuer.cluster_id.hex())
        return self

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
            self._on_loop(self._server.stop(grace))
            self._on_loop(_cancel_remaining_tasks())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()


async def _cancel_remaining_tasks() -> None:
    """RPCs the server cancelled may still be unwinding (an awaited registration): let them finish before the loop closes."""
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=5)


def build_issuer(config: ServiceConfig, log: StructuredLog, token_minter: TokenMinter | None = None,
                 nonces: NonceStore | None = None) -> TicketIssuer:
    if seal.CRYPTOGRAPHY_IMPORT_ERROR is not None:
        raise ConfigError(f"cryptography >= 47 is required for the join service: {seal.CRYPTOGRAPHY_IMPORT_ERROR}")
    secrets = load_root_secrets(config.secrets_file)
    policy = PolicyWatcher(config.policy_file, log, interval=config.policy_check_interval)
    ek_cas = []
    if config.ek_ca_file:
        try:
            with open(config.ek_ca_file, "rb") as handle:
                ek_cas = load_ca_certificates(handle.read())
        except OSError as exc:
            raise ConfigError(f"cannot read EK CA file {config.ek_ca_file}: {exc.strerror}") from None
        except VerificationError as exc:
            raise ConfigError(f"EK CA file {config.ek_ca_file}: {exc}") from None
    elif policy.policy.ak_trust_level >= 2:
        raise ConfigError(f"measurement policy {config.policy_file} requires EK certificates (ak_trust: ek-certificate) "
                          "but the configuration names no ek_ca_file")
    try:
        pki = ClusterPki.load(config.pki_dir)
    except PkiError as exc:
        raise ConfigError(str(exc)) from None
    minter = token_minter or KubectlTokenMinter(config.admin_kubeconfig, config.kubectl_binary)
    return TicketIssuer(secrets, pki, policy.current, ek_cas, minter, nonces or NonceStore(ttl=config.nonce_ttl),
                        config.api_server_endpoint, config.kubernetes_version, config.verifier_id, max_registrations=config.max_registrations)


def build_service(config: ServiceConfig, log: StructuredLog, token_minter: TokenMinter | None = None,
                  nonces: NonceStore | None = None, drain_delay: float = DRAIN_DELAY) -> JoinService:
    issuer = build_issuer(config, log, token_minter, nonces)
    try:
        with open(config.tls_cert, "rb") as handle:
            cert_pem = handle.read()
    except OSError as exc:
        raise ConfigError(f"cannot read TLS certificate {config.tls_cert}: {exc.strerror}") from None
    key_pem = read_private_file(config.tls_key, "TLS key")
    return JoinService(issuer, cert_pem, key_pem, config.listen, log, drain_delay)


def main(argv: list[str] | None = None, token_minter: TokenMinter | None = None) -> int:
    """The daemon; ``token_minter`` replaces kubeadm (the load suite records tokens instead)."""
    parser = argparse.ArgumentParser(prog="joinservice", description="confidential.kubernetes join service")
    parser.add_argument("--config", required=True, help="service configuration file (YAML or JSON)")
    args = parser.parse_args(argv)
    log = StructuredLog()
    try:
        config = load_config(args.config)
        service = build_service(config, log, token_minter).start()
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
