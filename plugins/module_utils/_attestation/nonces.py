# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Verifier nonces: 32 random bytes, single use, expiring (60 s by default), bounded in number.

One store serves both users: the join service keeps its nonces in memory, the
controller's tasks in a 0600 ledger file shared by processes (flock), which
keeps single use across runs. Entries are kept in the order they were issued,
so expiry drops them from the front: issuing and consuming cost O(1) amortised
instead of a scan of every entry. A consumed nonce is remembered until two
lifetimes after its issue, so a replay is reported as such rather than as
unknown. Since GetNonce is unauthenticated, the number of remembered nonces is
capped: beyond it ``issue`` refuses with NonceLimitError until some expire.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager

from .verifier import VerificationError

NONCE_BYTES = 32
DEFAULT_TTL = 60.0
# In memory: about 200 bytes each, so the cap is some 20 MB; 100,000 joins a minute is far beyond any cluster.
MAX_OUTSTANDING = 100_000
# In the ledger every call reads and rewrites the file, so its cap is lower (about 1 MB of JSON).
MAX_LEDGER_ENTRIES = 10_000


class NonceLimitError(RuntimeError):
    """Too many nonces are remembered (a GetNonce flood, or far more attestations than the verifier can serve)."""


class NonceStore:
    """Issued nonces in memory (join service) or in a 0600 ledger file (controller tasks)."""

    def __init__(self, ttl: float = DEFAULT_TTL, path: str | None = None, clock=time.time, max_outstanding: int | None = None):
        self.ttl = ttl
        self.path = path
        self.max_outstanding = max_outstanding or (MAX_OUTSTANDING if path is None else MAX_LEDGER_ENTRIES)
        self._clock = clock
        self._lock = threading.Lock()
        # nonce hex -> {"issued": time, "used": bool}, oldest first (the ledger file's format too).
        self._memory: OrderedDict[str, dict] = OrderedDict()

    def issue(self) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        now = self._clock()
        with self._ledger(now) as ledger:
            if len(ledger) >= self.max_outstanding:
                raise NonceLimitError(f"{len(ledger)} nonces issued in the last {2 * self.ttl:g} s are remembered "
                                      f"(limit {self.max_outstanding}); retry in a few seconds")
            ledger[nonce.hex()] = {"issued": now, "used": False}
        return nonce

    def consume(self, nonce: bytes) -> None:
        if not isinstance(nonce, bytes) or len(nonce) != NONCE_BYTES:
            raise VerificationError("nonce-unknown", f"nonce must be {NONCE_BYTES} bytes")
        now = self._clock()
        with self._ledger(now) as ledger:
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

    def remembered(self) -> int:
        """Nonces remembered now (issued within the last two lifetimes)."""
        with self._ledger(self._clock()) as ledger:
            return len(ledger)

    def _expire(self, ledger: OrderedDict[str, dict], now: float) -> None:
        """Forget, from the oldest on, nonces issued more than two lifetimes ago (a clock step back only delays this)."""
        horizon = now - 2 * self.ttl
        while ledger:
            oldest = next(iter(ledger.values()))
            if oldest["issued"] >= horizon:
                return
            ledger.popitem(last=False)

    @contextmanager
    def _ledger(self, now: float):
        with self._lock:
            if self.path is None:
                self._expire(self._memory, now)
                yield self._memory
                return
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            with os.fdopen(fd, "r+") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
                ledger = _parse_ledger(handle.read())
                self._expire(ledger, now)
                yield ledger
                handle.seek(0)
                handle.truncate()
                json.dump(ledger, handle, separators=(",", ":"))
                handle.flush()
                os.fsync(handle.fileno())


def _parse_ledger(text: str) -> OrderedDict[str, dict]:
    """The ledger's entries in file order; an unreadable ledger starts empty (its nonces are then refused as unknown)."""
    try:
        document = json.loads(text, object_pairs_hook=OrderedDict) if text else OrderedDict()
    except ValueError:
        return OrderedDict()
    if not isinstance(document, dict):
        return OrderedDict()
    return OrderedDict((key, entry) for key, entry in document.items()
                       if isinstance(entry, dict) and isinstance(entry.get("issued"), (int, float)) and isinstance(entry.get("used"), bool))
