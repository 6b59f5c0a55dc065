# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The join service's call admission: every call from its headers on is given a place among the calls in progress of
its client, its network and the server, and must send its request message in time; the handlers are registered behind
it, with the tolerant request decoding (``tolerant.py``)."""

from __future__ import annotations

import asyncio
import time

try:
    import grpc
except ImportError:  # reported by the service (service.GRPC_IMPORT_ERROR)
    pass

from .gate import ConnectionGate
from .limits import IPV6_PREFIX, CallLimits, peer_key
from .log import StructuredLog
from .protocol import REASON_METADATA
from .tolerant import _tolerant

# A refused flood is logged once in this many seconds, not once per call.
FLOOD_LOG_INTERVAL = 10.0


class CallAdmission:
    """Every call from its headers on: a place among the calls in progress of its client, its network and the server
    (``CallLimits``), then its request message within ``message_timeout``, and only then the handler.

    gRPC runs a unary handler once the request message has arrived, and counts the call against
    ``maximum_concurrent_rpcs`` from its headers: streams that send headers and never a body held every place, unseen by
    the gate and the rate limits. So each method is served as request-streaming (the same bytes on the wire; the client
    still makes a unary call): the call is admitted, or refused at once, when its headers arrive, and cancelled when its
    message does not follow in time. Until the message arrives the call is no RPC for the gate (``first_rpc_timeout``).
    """

    def __init__(
        self, limits: CallLimits, message_timeout: float, log: StructuredLog, gate: ConnectionGate | None = None
    ):
        self.limits = limits
        self.message_timeout = message_timeout
        self.gate = gate
        self._log = log
        self._logged = float("-inf")

    def wrap(self, behaviour):
        async def handle(request_iterator, context):
            grpc_peer = context.peer()
            peer = self.gate.call_started(grpc_peer) if self.gate is not None else grpc_peer
            try:
                client = peer_key(peer, self.gate.ipv6_prefix if self.gate is not None else IPV6_PREFIX)
                refused = self.limits.acquire(client)
                if refused is not None:
                    await self._refuse(context, peer, refused)
                try:
                    request = await self._message(request_iterator, context)
                    return await behaviour(request, context)
                finally:
                    self.limits.release(client)
            finally:
                if self.gate is not None:
                    self.gate.call_ended(grpc_peer)

        return handle

    async def _message(self, request_iterator, context):
        """The call's one request message, or the call aborted when it does not come within ``message_timeout`` (a
        timer that cancels this task: no task of its own per call, as ``asyncio.wait_for`` would make)."""
        task = asyncio.current_task()
        late = []

        def cancel() -> None:
            late.append(True)
            task.cancel()

        timer = asyncio.get_running_loop().call_later(self.message_timeout, cancel)
        try:
            return await request_iterator.__anext__()
        except asyncio.CancelledError:
            if not late:
                raise
        except StopAsyncIteration:
            context.set_trailing_metadata(((REASON_METADATA, "malformed"),))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "malformed: the call carried no request")
        finally:
            timer.cancel()
        self.limits.refused["request-timeout"] += 1
        context.set_trailing_metadata(((REASON_METADATA, "request-timeout"),))
        await context.abort(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"request-timeout: no request message within {self.message_timeout:g} s of the call's headers",
        )

    async def _refuse(self, context, peer: str, refused: str) -> None:
        limit = {"client": "this address", "network": "this address's network (/24, IPv6 /48)", "total": "all clients"}
        cap = {"client": self.limits.per_client, "network": self.limits.per_network, "total": self.limits.total}
        now = time.monotonic()
        if now - self._logged >= FLOOD_LOG_INTERVAL:
            self._logged = now
            self._log.warning(
                "call",
                result="refused",
                reason="calls-limit",
                limit=refused,
                peer=peer,
                in_progress=self.limits.in_progress(),
                refused_total=dict(self.limits.refused),
            )
        context.set_trailing_metadata(((REASON_METADATA, "calls-limit"),))
        await context.abort(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"calls-limit: {cap[refused]} calls of {limit[refused]} are in progress; retry later",
        )


class AdmittedRegistration:
    """Registers the generated handlers, each behind the ``CallAdmission`` and with a deserializer that hands an
    undecodable body to the servicer.

    Without the deserializer grpc answers such a body with UNKNOWN "Unexpected DecodeError", unlogged; the servicer
    turns it into INVALID_ARGUMENT with reason 'malformed', like every other refusal.
    """

    def __init__(self, server, admission: CallAdmission):
        self._server = server
        self._admission = admission

    def add_generic_rpc_handlers(self, handlers) -> None:
        """The generated code also registers the same methods below; those are the ones served."""

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        tolerant = {
            name: grpc.stream_unary_rpc_method_handler(
                self._admission.wrap(handler.unary_unary),
                request_deserializer=_tolerant(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
            for name, handler in handlers.items()
        }
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, tolerant),))
        self._server.add_registered_method_handlers(service, tolerant)
