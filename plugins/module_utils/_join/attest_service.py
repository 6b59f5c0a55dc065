# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""How the join service serves continuous attestation: the parts it builds (``attestation_parts``), the Attest RPC's
work (``attest_work``), and the quarantine its registry honours (a quarantined EK gets no ticket)."""

from __future__ import annotations

import os
import secrets
import socket

from .attest import FAILED
from .attest_handler import AttestJudge
from .attest_state import ApiAttestationRecords, NodeActions, QuarantineMirror
from .crypto import Refusal
from .enforcement import Enforcer, LeaseElection


def holder_identity() -> str:
    """This service's name in the Lease: a restarted service is another holder (it takes over once the Lease lapses)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


def attestation_parts(issuer, config, log) -> tuple[AttestJudge, Enforcer]:
    """The judge of the Attest RPC and the enforcement loop, over the issuer's one API client; the issuer refuses
    every quarantined EK from now on (the mirror's, until the records' watch has listed them)."""
    api = issuer.disk_bindings.api
    records = ApiAttestationRecords(api, QuarantineMirror(config.quarantine_file))
    nodes = NodeActions(api)
    interval = config.attestation_interval
    grace = config.attestation_grace or 3 * interval
    enforcer = Enforcer(
        records,
        nodes,
        LeaseElection(api, holder_identity(), max(2 * interval, 1.0)),
        interval,
        grace,
        config.attestation_failure_action,
        log,
    )
    judge = AttestJudge(issuer, records, nodes, interval, on_failure=enforcer.wake.set)
    issuer.quarantined = records.quarantined
    return judge, enforcer


async def attest_work(judge: AttestJudge, workers, request) -> None:
    """Check the nonce, verify in a worker, judge and record; a failed verdict is answered as a refusal with its reason
    (after it is recorded)."""
    check = judge.check(request.evidence, request.nonce)
    record = await judge.judge(check, await workers.attest(check))
    if record.result == FAILED:
        raise Refusal.of(
            record.reason, f"node {record.node_name} failed attestation: {record.message}", record.mismatches
        )
