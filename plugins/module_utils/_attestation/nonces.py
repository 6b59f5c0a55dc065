# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Verifier nonces: 32 random bytes, single use, expiring (60 s by default)."""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from contextlib import contextmanager

from .verifier import VerificationError

NONCE_BYTES = 32
DEFAULT_TTL = 60.0


class NonceStore:
    """Issued nonces in memory (join service) or in a 0600 ledger file (controller tasks).

    A consumed nonce is remembered until it would have expired, so a replay is
    reported as such rather than as unknown.
    """

    def __init__(self, ttl: float = DEFAULT_TTL, path: str | None = None, clock=time.time):
        self.ttl = ttl
        self.path = path
        self._clock = clock
        self._lock = threading.Lock()
        self._memory: dict[str, dict] = {}

    def issue(self) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        with self._ledger() as ledger:
            ledger[nonce.hex()] = {"issued": self._clock(), "used": False}
        return nonce

    def consume(self, nonce: bytes) -> None:
        if not isinstance(nonce, bytes) or len(nonce) != NONCE_BYTES:
            raise VerificationError("nonce-unknown", f"nonce must be {NONCE_BYTES} bytes")
        now = self._clock()
        with self._ledger() as ledger:
            entry = ledger.get(nonce.hex())
            used = entry is not None and entry["used"]
            if entry is not None:
                entry["used"] = True
        if entry is None:
            raise VerificationError("nonce-unknown", "nonce was not issued by this verifier (or has long expired)")
        if used:
            raise VerificationError("nonce-reused", "nonce was already used: replayed evidence")
        if now - entry["issued"] > self.ttl:
            raise VerificationError("nonce-stale", f"nonce expired {now - entry['issued'] - self.ttl:.1f} s ago (lifetime {self.ttl:g} s)")

    def _expire(self, ledger: dict[str, dict]) -> None:
        horizon = self._clock() - self.ttl
        for key in [k for k, v in ledger.items() if v["issued"] < horizon - self.ttl]:
            del ledger[key]

    @contextmanager
    def _ledger(self):
        with self._lock:
            if self.path is None:
                self._expire(self._memory)
                yield self._memory
                return
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            with os.fdopen(fd, "r+") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
                text = handle.read()
                try:
                    ledger = json.loads(text) if text else {}
                except ValueError:
                    ledger = {}
                self._expire(ledger)
                yield ledger
                handle.seek(0)
                handle.truncate()
                json.dump(ledger, handle)
                handle.flush()
                os.fsync(handle.fileno())
