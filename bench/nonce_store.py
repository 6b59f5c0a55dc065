"""Benchmark of the nonce store: microseconds per issue + consume with 1,000 and with 100,000 nonces remembered (in
memory, as the join service keeps them), in the steady state where each new nonce lets an old one expire; and
milliseconds per issue + consume on a controller ledger file of 1,000 and of 10,000 (its cap) entries.

Run: .venv/bin/python bench/nonce_store.py [--operations N] [--figures FILE]
Target: the cost per operation does not grow with the number remembered (100,000 within 2x of 1,000).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TTL = 60.0
LEDGER_OPERATIONS = 200


sys.path.insert(0, str(REPO / "tests"))
from testenv import unit_conftest  # noqa: E402

unit_conftest()

import _figures  # noqa: E402
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import nonces  # noqa: E402
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.nonces import (
    MAX_LEDGER_ENTRIES,
    NonceStore,
)  # noqa: E402


class SteppingClock:
    """Advances by ``step`` on every reading: with step = 2 * TTL / n, about n nonces stay remembered."""

    def __init__(self, step: float):
        self.now = 1_000_000.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def filled(remembered: int) -> NonceStore:
    # Two clock readings per issue + consume pair.
    store = NonceStore(ttl=TTL, clock=SteppingClock(TTL / remembered), max_outstanding=remembered + 100)
    for _i in range(remembered):
        store.consume(store.issue())
    return store


def filled_ledger(remembered: int, path: str) -> NonceStore:
    """A ledger file holding what ``filled`` remembers (written at once: filling it call by call takes minutes)."""
    memory = filled(remembered)
    with open(path, "wb") as handle:
        handle.writelines(
            nonces._record(key, entry["issued"], entry["used"]) for key, entry in memory._memory.entries.items()
        )
    return NonceStore(ttl=TTL, path=path, clock=memory._clock, max_outstanding=remembered + 100)


def per_operation(store: NonceStore, operations: int) -> float:
    """Median seconds of one issue + consume over batches of 100 (the clock reads are part of it, as in the service)."""
    batches = []
    gc.disable()
    try:
        for _batch in range(max(1, operations // 100)):
            started = time.perf_counter()
            for _i in range(100):
                store.consume(store.issue())
            batches.append((time.perf_counter() - started) / 100)
    finally:
        gc.enable()
    return statistics.median(batches)


def per_ledger_operation(store: NonceStore, operations: int) -> float:
    times = []
    for _i in range(operations):
        started = time.perf_counter()
        store.consume(store.issue())
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--operations", type=int, default=50_000, help="issue + consume pairs timed per size (default 50,000)"
    )
    _figures.add_option(parser)
    args = parser.parse_args()
    memory = {}
    for remembered in (1_000, 100_000):
        store = filled(remembered)
        memory[remembered] = per_operation(store, args.operations)
        assert abs(store.remembered() - remembered) <= 2, store.remembered()
    ledger = {}
    with tempfile.TemporaryDirectory(prefix="ck-bench-nonces-") as workdir:
        for remembered in (1_000, MAX_LEDGER_ENTRIES):
            store = filled_ledger(remembered, f"{workdir}/ledger-{remembered}.json")
            ledger[remembered] = per_ledger_operation(store, LEDGER_OPERATIONS)
    ratio = memory[100_000] / memory[1_000]
    print("nonce store: issue + consume, steady state (each new nonce lets an old one expire)")
    print(f"{'store':<28} {'remembered':>10} {'per operation':>14}")
    for remembered, seconds in memory.items():
        print(f"{'in memory (join service)':<28} {remembered:>10,} {seconds * 1e6:>11.1f} us")
    for remembered, seconds in ledger.items():
        print(f"{'ledger file (controller)':<28} {remembered:>10,} {seconds * 1e3:>11.2f} ms")
    print(f"100,000 / 1,000 remembered = {ratio:.2f}x   (target <= 2x, O(1): {'met' if ratio <= 2 else 'MISSED'})")
    _figures.write(
        args.figures,
        [
            _figures.figure("nonce_store", "issue + consume, 1,000 remembered", round(memory[1_000] * 1e6, 1), "us"),
            _figures.figure(
                "nonce_store", "issue + consume, 100,000 remembered", round(memory[100_000] * 1e6, 1), "us"
            ),
            _figures.figure("nonce_store", "100,000 / 1,000 remembered", round(ratio, 2), "x", "<= 2x", ratio <= 2),
            _figures.figure(
                "nonce_store",
                f"ledger issue + consume, {MAX_LEDGER_ENTRIES:,} entries (cap)",
                round(ledger[MAX_LEDGER_ENTRIES] * 1e3, 2),
                "ms",
            ),
        ],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
