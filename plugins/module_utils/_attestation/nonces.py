# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Verifier nonces: 32 random bytes, single use, expiring (60 s by default), bounded in number.

One store, two places to keep the nonces: in memory, or - the controller's tasks - in a 0600 ledger file shared by
processes (flock), which keeps single use across runs. (The join service, whose GetNonce anyone can call, keeps no
issued nonce at all: ``_join/nonces.py``.) Either way entries are kept in the
order they were issued, so expiry drops a prefix and no call looks at every entry: in memory issuing and consuming
cost O(1) amortised; in the ledger (fixed-size records) issuing costs a binary search and an append, consuming one
byte search through the file (C speed) and a one-byte write. A consumed nonce is remembered until two lifetimes
after its issue, so a replay is reported as such rather than as unknown. The number of remembered nonces is capped:
beyond it ``issue`` refuses with NonceLimitError until some expire.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections import OrderedDict

from .verifier import VerificationError

NONCE_BYTES = 32
DEFAULT_TTL = 60.0
# In memory: about 200 bytes each, so the cap is some 20 MB; 100,000 joins a minute is far beyond any cluster.
MAX_OUTSTANDING = 100_000
# In the ledger: 850 kB of records at most.
MAX_LEDGER_ENTRIES = 10_000
# A ledger record: "<nonce hex> <issue time, 17 characters> <i|u>\n".
RECORD_BYTES = 2 * NONCE_BYTES + 1 + 17 + 1 + 1 + 1
_ISSUED = slice(2 * NONCE_BYTES + 1, 2 * NONCE_BYTES + 18)
_STATE = RECORD_BYTES - 2
# Expired records are cut from the ledger once they are this many and at least as many as the live ones.
COMPACT_AFTER = 256


class NonceLimitError(RuntimeError):
    """Too many nonces are remembered (a GetNonce flood, or far more attestations than the verifier can serve)."""


class NonceStore:
    """Issued nonces in memory (join service) or in a 0600 ledger file (controller tasks)."""

    def __init__(
        self, ttl: float = DEFAULT_TTL, path: str | None = None, clock=time.time, max_outstanding: int | None = None
    ):
        self.ttl = ttl
        self.path = path
        self.max_outstanding = max_outstanding or (MAX_OUTSTANDING if path is None else MAX_LEDGER_ENTRIES)
        self._clock = clock
        self._lock = threading.Lock()
        self._memory = _MemoryNonces()

    def issue(self) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        now = self._clock()
        with self._lock, self._nonces() as nonces:
            remembered = nonces.expire(now - 2 * self.ttl)
            if remembered >= self.max_outstanding:
                raise NonceLimitError(
                    f"{remembered} nonces issued in the last {2 * self.ttl:g} s are remembered "
                    f"(limit {self.max_outstanding}); retry in a few seconds"
                )
            nonces.add(nonce.hex(), now)
        return nonce

    def consume(self, nonce: bytes) -> None:
        if not isinstance(nonce, bytes) or len(nonce) != NONCE_BYTES:
            raise VerificationError("nonce-unknown", f"nonce must be {NONCE_BYTES} bytes")
        now = self._clock()
        with self._lock, self._nonces() as nonces:
            nonces.expire(now - 2 * self.ttl)
            entry = nonces.mark_used(nonce.hex())
        if entry is None:
            raise VerificationError("nonce-unknown", "nonce was not issued by this verifier (or has long expired)")
        issued, used = entry
        if used:
            raise VerificationError("nonce-reused", "nonce was already used: replayed evidence")
        if now - issued > self.ttl:
            raise VerificationError(
                "nonce-stale", f"nonce expired {now - issued - self.ttl:.1f} s ago (lifetime {self.ttl:g} s)"
            )

    def remembered(self) -> int:
        """Nonces remembered now (issued within the last two lifetimes)."""
        with self._lock, self._nonces() as nonces:
            return nonces.expire(self._clock() - 2 * self.ttl)

    def _nonces(self):
        return _LedgerFile(self.path) if self.path is not None else self._memory


class _MemoryNonces:
    """nonce hex -> {"issued": time, "used": bool}, oldest first."""

    def __init__(self):
        self.entries: OrderedDict[str, dict] = OrderedDict()

    def __enter__(self) -> "_MemoryNonces":
        return self

    def __exit__(self, *exc_info) -> None:
        return None

    def expire(self, horizon: float) -> int:
        """Forget nonces issued before ``horizon``, oldest first (a clock step back only delays this); the number left."""
        entries = self.entries
        while entries:
            if next(iter(entries.values()))["issued"] >= horizon:
                break
            entries.popitem(last=False)
        return len(entries)

    def add(self, nonce_hex: str, issued: float) -> None:
        self.entries[nonce_hex] = {"issued": issued, "used": False}

    def mark_used(self, nonce_hex: str) -> tuple[float, bool] | None:
        """(issue time, whether it was used before), or None for a nonce not remembered."""
        entry = self.entries.get(nonce_hex)
        if entry is None:
            return None
        used, entry["used"] = entry["used"], True
        return entry["issued"], used


class _LedgerFile:
    """The ledger, locked while open: fixed-size text records in issue order (issue times never decrease).

    An unreadable ledger starts empty, which refuses its nonces as unknown.
    """

    def __init__(self, path: str):
        self.path = path
        self._fd = -1
        self._first = 0

    def __enter__(self) -> "_LedgerFile":
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            size = os.fstat(self._fd).st_size
            if size % RECORD_BYTES:
                # A record cut short by a crash while appending.
                os.ftruncate(self._fd, size - size % RECORD_BYTES)
        except BaseException:
            os.close(self._fd)
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        os.close(self._fd)

    def _count(self) -> int:
        return os.fstat(self._fd).st_size // RECORD_BYTES

    def _issued(self, index: int) -> float:
        record = os.pread(self._fd, RECORD_BYTES, index * RECORD_BYTES)
        try:
            return float(record[_ISSUED])
        except ValueError:
            raise _CorruptLedger() from None

    def expire(self, horizon: float) -> int:
        """Find the first record issued at or after ``horizon`` (binary search); cut the expired prefix when it has grown."""
        try:
            count = self._count()
            low, high = 0, count
            while low < high:
                middle = (low + high) // 2
                if self._issued(middle) < horizon:
                    low = middle + 1
                else:
                    high = middle
        except _CorruptLedger:
            self._rewrite(b"")
            return 0
        self._first = low
        live = count - low
        if low >= COMPACT_AFTER and low >= live:
            self._rewrite(os.pread(self._fd, live * RECORD_BYTES, low * RECORD_BYTES))
        return live

    def add(self, nonce_hex: str, issued: float) -> None:
        count = self._count()
        if count:
            # Issue times never decrease, so the binary search holds even if the clock steps back.
            try:
                issued = max(issued, self._issued(count - 1))
            except _CorruptLedger:
                self._rewrite(b"")
                count = 0
        os.pwrite(self._fd, _record(nonce_hex, issued, False), count * RECORD_BYTES)
        os.fsync(self._fd)

    def mark_used(self, nonce_hex: str) -> tuple[float, bool] | None:
        start = self._first * RECORD_BYTES
        records = os.pread(self._fd, os.fstat(self._fd).st_size - start, start)
        # A hex nonce cannot match across fields (they are separated by spaces), so a match starts a record.
        at = records.find(nonce_hex.encode())
        if at < 0 or at % RECORD_BYTES:
            return None
        record = records[at : at + RECORD_BYTES]
        try:
            issued = float(record[_ISSUED])
        except ValueError:
            return None
        used = record[_STATE : _STATE + 1] == b"u"
        if not used:
            os.pwrite(self._fd, b"u", start + at + _STATE)
            os.fsync(self._fd)
        return issued, used

    def _rewrite(self, records: bytes) -> None:
        os.pwrite(self._fd, records, 0)
        os.ftruncate(self._fd, len(records))
        os.fsync(self._fd)
        self._first = 0


class _CorruptLedger(Exception):
    pass


def _record(nonce_hex: str, issued: float, used: bool) -> bytes:
    return f"{nonce_hex.lower()} {issued:017.6f} {'u' if used else 'i'}\n".encode()
