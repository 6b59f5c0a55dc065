# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The join service's nonces: the attestation NonceStore in memory, bounded and with amortised expiry.

GetNonce is unauthenticated, so the number of outstanding nonces is capped
(each lives for two lifetimes, so that a replay is reported as such); and the
sweep for expired nonces runs at most once a second instead of on every call,
which keeps issuing and consuming O(1) under load.
"""

from __future__ import annotations

import time

from .._attestation.nonces import DEFAULT_TTL, NonceStore

MAX_OUTSTANDING = 100_000
SWEEP_INTERVAL = 1.0


class NonceLimitError(RuntimeError):
    """Too many nonces are outstanding (a GetNonce flood, or far more joining nodes than the service can serve)."""


class ServiceNonceStore(NonceStore):
    def __init__(self, ttl: float = DEFAULT_TTL, clock=time.time, max_outstanding: int = MAX_OUTSTANDING):
        super().__init__(ttl=ttl, clock=clock)
        self.max_outstanding = max_outstanding
        self._swept_at: float | None = None

    def issue(self) -> bytes:
        if len(self._memory) >= self.max_outstanding:
            raise NonceLimitError(f"{len(self._memory)} nonces are outstanding (limit {self.max_outstanding}); retry in a few seconds")
        return super().issue()

    def _expire(self, ledger: dict[str, dict]) -> None:
        now = self._clock()
        if self._swept_at is not None and 0 <= now - self._swept_at < SWEEP_INTERVAL and len(ledger) < self.max_outstanding:
            return
        self._swept_at = now
        super()._expire(ledger)
