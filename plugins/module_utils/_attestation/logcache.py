# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The verifier's cache of parsed and replayed event logs: one slot per node, bounded in slots and in bytes.

A node sends the same firmware log at every attestation, so parsing and replaying it once per node saves most of the
cost of verifying its evidence. The slot's key is the name of the attestation key whose signature over the quote
has just been checked, so a node can fill only its own slot: a node that sends a new log (or many) replaces its own
entry and nobody else's. A new node takes a free slot, else the slot of a node that has not attested for
``idle_seconds``; when every slot (or the byte budget) is held by nodes that attest, the new node's log is verified
uncached and no live node loses its entry. The entry is served only for the exact bytes it was made from.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Callable, Generic, TypeVar

MAX_SLOTS = 1024
MAX_BYTES = 32 * 1024 * 1024  # of raw logs held (a parsed log holds slices of its raw bytes: about twice that)
IDLE_SECONDS = 3600.0

T = TypeVar("T")


class LogCache(Generic[T]):
    """Node key -> (raw log, value made from it); ``get(key, raw, make)`` returns ``make(raw)``, cached per node."""

    def __init__(
        self,
        max_slots: int = MAX_SLOTS,
        max_bytes: int = MAX_BYTES,
        idle_seconds: float = IDLE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ):
        if max_slots < 1 or max_bytes < 1 or idle_seconds < 0:
            raise ValueError("LogCache needs max_slots >= 1, max_bytes >= 1 and idle_seconds >= 0")
        self.max_slots = max_slots
        self.max_bytes = max_bytes
        self.idle_seconds = idle_seconds
        self._clock = clock
        # key -> (raw, value, last use); least recently used first
        self._slots: OrderedDict[bytes, tuple[bytes, T, float]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # the join service verifies in threads; make() runs outside it

    def __len__(self) -> int:
        return len(self._slots)

    @property
    def bytes(self) -> int:
        return self._bytes

    def __contains__(self, key: bytes) -> bool:
        return key in self._slots

    def clear(self) -> None:
        with self._lock:
            self._slots.clear()
            self._bytes = 0

    def get(self, key: bytes, raw: bytes, make: Callable[[bytes], T]) -> T:
        slots = self._slots
        with self._lock:
            entry = slots.get(key)
            if entry is not None and entry[0] == raw:
                slots[key] = (raw, entry[1], self._clock())
                slots.move_to_end(key)
                return entry[1]
        value = make(raw)  # raises for a malformed log: nothing is stored, the node's old entry stays
        with self._lock:
            now = self._clock()
            entry = slots.pop(key, None)  # this node's log changed: its own slot is the one replaced
            if entry is not None:
                self._bytes -= len(entry[0])
            if self._make_room(len(raw), now):
                slots[key] = (raw, value, now)
                self._bytes += len(raw)
        return value

    def _make_room(self, size: int, now: float) -> bool:
        """Free a slot and ``size`` bytes by dropping idle nodes' entries, oldest first; False if that is not enough."""
        if size > self.max_bytes:
            return False
        slots = self._slots
        while len(slots) >= self.max_slots or self._bytes + size > self.max_bytes:
            oldest = next(iter(slots))
            raw, _value, last_use = slots[oldest]
            if now - last_use < self.idle_seconds:
                return False
            del slots[oldest]
            self._bytes -= len(raw)
        return True
