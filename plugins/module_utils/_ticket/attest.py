# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node's continuous attestation (DESIGN section 8): every ``interval`` seconds (jittered), one attestation at the
join services of the boot-time join's configuration, tried in order until one answers.

Run: python -m ansible_collections.confidential.kubernetes.plugins.module_utils._ticket.attest --config FILE
[--interval 60] [--jitter 0.1] (a service of its own beside ``confidential-join.service``).

Each round gets a nonce, quotes with the AK proven at the node's join (``_join.attest_client``), attaches the
firmware event log where the node has one, and logs one JSON line: ``passed``, or ``refused`` with the service's
reason (a failed verdict included; the service records and enforces it, the loop only goes on), or ``unreachable``
when no endpoint answered. It never stops by itself on a refusal: a node that is failed must keep saying so, and one
that passes again must be seen passing. Nothing secret is in the configuration or the log.
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Callable

from .._attestation.evidence import EvidenceError
from .._attestation.issuer import TpmError
from .._attestation.node import read_event_log
from .._join.attest_client import attest_once
from .._join.client import JoinError
from .._join.log import StructuredLog
from .boot import DEFAULT_CONFIG, EXIT_CONFIG, BootConfig, BootConfigError, load_config

DEFAULT_INTERVAL = 60.0
DEFAULT_JITTER = 0.1
PASSED = "passed"
REFUSED = "refused"
UNREACHABLE = "unreachable"


def attest_round(config: BootConfig, log: StructuredLog, attest: Callable = attest_once) -> str:
    """One attestation: the first endpoint that answers judges it. ``passed``, ``refused`` or ``unreachable``."""
    settings = config.settings
    ca_pem = settings.cluster_ca.encode()
    try:
        event_log = read_event_log(None)
    except EvidenceError as exc:
        log.warning("attest", result="no-event-log", msg=str(exc))
        event_log = None
    failures = []
    for endpoint in settings.endpoints:
        started = time.monotonic()
        try:
            attest(endpoint, ca_pem, settings.tcti, event_log=event_log, timeout=settings.timeout)
        except JoinError as exc:
            if exc.retryable and exc.reason not in ("attest-too-soon",):
                failures.append(f"{endpoint}: {exc}")
                continue
            log.warning("attest", result=REFUSED, reason=exc.reason, endpoint=endpoint, msg=str(exc))
            return REFUSED
        except TpmError as exc:
            log.error("attest", result="tpm-failed", msg=str(exc))
            return REFUSED
        log.info("attest", result=PASSED, endpoint=endpoint, duration_ms=round((time.monotonic() - started) * 1000, 1))
        return PASSED
    log.warning("attest", result=UNREACHABLE, msg="; ".join(failures)[:2000])
    return UNREACHABLE


def next_delay(interval: float, jitter: float, draw: Callable[[], float] = random.random) -> float:
    """``interval`` give or take ``jitter`` of it, so that nodes booted together do not attest in step."""
    return interval * (1 + jitter * (2 * draw() - 1))


def run(
    config: BootConfig,
    log: StructuredLog,
    interval: float = DEFAULT_INTERVAL,
    jitter: float = DEFAULT_JITTER,
    rounds: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
    attest: Callable = attest_once,
) -> list[str]:
    """Attest every ``interval`` seconds (forever, or ``rounds`` times); the results."""
    results: list[str] = []
    while rounds is None or len(results) < rounds:
        results.append(attest_round(config, log, attest))
        if rounds is None or len(results) < rounds:
            sleep(next_delay(interval, jitter))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="confidential-attest", description="confidential.kubernetes: attest this node continuously"
    )
    parser.add_argument("--config", default=DEFAULT_CONFIG, help=f"the join configuration (default {DEFAULT_CONFIG})")
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL, help="seconds between attestations")
    parser.add_argument("--jitter", type=float, default=DEFAULT_JITTER, help="fraction of the interval drawn at random")
    args = parser.parse_args(argv)
    log = StructuredLog()
    if args.interval <= 0 or not 0 <= args.jitter < 1:
        log.error("config", result="failed", msg="--interval must be positive and --jitter in [0, 1)")
        return EXIT_CONFIG
    try:
        config = load_config(args.config)
    except BootConfigError as exc:
        log.error("config", result="failed", msg=str(exc))
        return EXIT_CONFIG
    run(config, log, args.interval, args.jitter)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
