# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The join service's nonces: stateless until used, so an unauthenticated GetNonce flood costs no memory.

    nonce = issued (8 bytes, big-endian milliseconds since the epoch) || 8 random bytes
            || first 16 bytes of HMAC-SHA256(key, "confidential.kubernetes/join-nonce/v1" || issued || random)

The key is drawn at start and never leaves the process: a nonce is valid only at the service that issued it, and a
restart invalidates every outstanding one (the node simply asks again). Checking a nonce costs one HMAC. Only used
nonces are remembered, until they expire; they are used once their evidence has verified, so the remembered set grows
with genuine joins only, never with a flood of nonces or of garbage requests.
"""

from __future__ import annotations

import hashlib
import hmac
import heapq
import os
import struct
import threading
import time

from .._attestation.nonces import NONCE_BYTES, NonceLimitError
from .._attestation.verifier import VerificationError

LABEL = b"confidential.kubernetes/join-nonce/v1"
MAC_BYTES = 16
DEFAULT_TTL = 60.0
# Verified joins within one nonce lifetime; far beyond what TPMs can quote.
MAX_USED = 100_000


class MacNonces:
    """Issue, check and use stateless nonces (thread-safe; ``clock`` is a seam for tests)."""

    def __init__(self, ttl: float = DEFAULT_TTL, clock=time.time, max_used: int = MAX_USED):
        self.ttl = ttl
        self.max_used = max_used
        self._clock = clock
        self._key = os.urandom(32)
        self._lock = threading.Lock()
        self._used: dict[bytes, float] = {}
        self._expiry: list[tuple[float, bytes]] = []

    def _mac(self, head: bytes) -> bytes:
        return hmac.new(self._key, LABEL + head, hashlib.sha256).digest()[:MAC_BYTES]

    def issue(self) -> bytes:
        head = struct.pack(">Q", int(self._clock() * 1000)) + os.urandom(8)
        return head + self._mac(head)

    def check(self, nonce: bytes) -> float:
        """Raise VerificationError unless the nonce is this service's, fresh and unused; returns when it expires."""
        if not isinstance(nonce, bytes) or len(nonce) != NONCE_BYTES:
            raise VerificationError("nonce-unknown", f"nonce must be {NONCE_BYTES} bytes")
        head, mac = nonce[:-MAC_BYTES], nonce[-MAC_BYTES:]
        if not hmac.compare_digest(self._mac(head), mac):
            raise VerificationError(
                "nonce-unknown", "nonce was not issued by this join service (or it restarted since)"
            )
        issued = struct.unpack(">Q", head[:8])[0] / 1000
        age = self._clock() - issued
        if age > self.ttl:
            raise VerificationError(
                "nonce-stale", f"nonce expired {age - self.ttl:.1f} s ago (lifetime {self.ttl:g} s)"
            )
        if nonce in self._used:
            raise VerificationError("nonce-reused", "nonce was already used: replayed evidence")
        return issued + self.ttl

    def consume(self, nonce: bytes) -> None:
        """Check and mark used, at most once for a nonce however many requests race with it."""
        with self._lock:
            expires = self.check(nonce)
            self._forget_expired()
            if len(self._used) >= self.max_used:
                raise NonceLimitError(
                    f"{len(self._used)} used nonces are remembered (limit {self.max_used}); retry in a few seconds"
                )
            self._used[nonce] = expires
            heapq.heappush(self._expiry, (expires, nonce))

    def used(self) -> int:
        """Used nonces remembered now."""
        with self._lock:
            self._forget_expired()
            return len(self._used)

    def _forget_expired(self) -> None:
        now = self._clock()
        while self._expiry and self._expiry[0][0] < now:
            del self._used[heapq.heappop(self._expiry)[1]]
