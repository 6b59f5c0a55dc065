"""Init and join racing for one node's lock: two real processes against one real swtpm, many trials.

  python tests/security/race.py [--trials N]      (default RACE_TRIALS or 200)

Each trial starts a fresh swtpm (PCR 15 zero) and forks two processes that start together:
  init  the init path's node-lock step as init_ticket runs it: take the ephemeral key, open the sealed
        init secrets, derive the cluster ID, NodeLock.take, then keep the root secrets (its next write)
  join  the join path as join_ticket runs it: NodeJoin.state (a node that is not fresh stops there), then
        applying the ticket (NodeLock.take first, then the state disk, the kubelet certificate, the token
        file and the join record)
They hold tickets of two different clusters. Checked per trial: exactly one wins; the loser raised
NodeLockError and wrote nothing; PCR 15 equals one extend of the winner's mark from zero
(SHA-256(0^32 || SHA-256(cluster_id)), so it was extended exactly once); the lock record names the winner.
The join path's state-disk step is a recording stand-in (cryptsetup per trial would take minutes);
everything else, the node lock above all, is the collection's own code.
"""

from __future__ import annotations

import argparse
import base64
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import support  # noqa: E402

support.unit_conftest()

from ansible_collections.confidential.kubernetes.plugins.module_utils import _ticket  # noqa: E402
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.issuer import Tpm  # noqa: E402
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import node_lock_mark  # noqa: E402
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto import derive, seal  # noqa: E402
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import RootSecrets  # noqa: E402
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.protocol import JoinTicket  # noqa: E402
from ansible_collections.confidential.kubernetes.plugins.module_utils._nodelock import NodeLock, NodeLockError  # noqa: E402
from ansible_collections.confidential.kubernetes.plugins.module_utils._ticket import TicketError  # noqa: E402
from ansible_collections.confidential.kubernetes.plugins.module_utils._ticket import join as join_ticket  # noqa: E402

VERIFIER_ID = "confidential.kubernetes/controller"
DISK_UUID = "0d3b1c4e-9f2a-4e57-8a61-2f4c9b7d5e13"


def _reporting(side: str, contender):
    """A contender that crashes is reported as such (and fails the trial) instead of leaving the parent waiting."""

    def run(*args) -> None:
        try:
            contender(*args)
        except Exception as exc:  # noqa: BLE001 - whatever it was, the trial reports it
            args[-1].put((side, "crashed", f"{type(exc).__name__}: {exc}"))

    return run


def _init_contender(trial: Path, tcti: str, sealed: bytes, nonce: bytes, start, results) -> None:
    """init_ticket's steps up to and including its first write after the lock."""
    key = _ticket.take_ephemeral_key(str(trial / "init-ephemeral.key"), False)
    payload = _ticket.open_sealed(key, base64.b64encode(sealed).decode(), "init", nonce.hex(), VERIFIER_ID)
    secrets = _ticket.root_secrets(payload, "sealed init secrets")
    cluster_id = secrets.cluster_id()
    start.wait(10)
    try:
        NodeLock.for_tcti(tcti, str(trial / "nodelock.json")).take(cluster_id)
    except NodeLockError as exc:
        results.put(("init", "lost", str(exc)))
        return
    _ticket.keep_root_secrets(str(trial / "init" / "cluster-secrets.json"), secrets, False)
    results.put(("init", "won", cluster_id.hex()))


def _join_contender(trial: Path, tcti: str, payload: dict, start, results) -> None:
    """join_ticket's steps (NodeJoin.state, then applying the ticket) with the node's files under the trial directory."""
    root = trial / "join"

    def key_state_disk(options, disk_key, check_mode):
        _ticket.write_if_changed(str(root / "state-disk-keyed"), disk_key, 0o600, check_mode)
        return {"changed": True, "uuid": DISK_UUID}

    join_ticket.key_state_disk = key_state_disk
    settings = join_ticket.JoinSettings(
        endpoints=[],
        cluster_ca="",
        node_name="worker-1",
        state_disk={"device": str(root / "disk")},
        token_file=str(root / "join-token"),
        lock_record=str(trial / "nodelock.json"),
        join_record=str(root / "join.json"),
        secrets_file=str(root / "cluster-secrets.json"),
    )
    node = join_ticket.NodeJoin(settings, NodeLock.for_tcti(tcti, settings.lock_record), root=str(root))
    start.wait(10)
    try:
        # join_ticket's first step: a node that is not fresh (here: locked by init) does not even ask for a ticket.
        if node.state() != join_ticket.FRESH:
            results.put(("join", "lost", f"the node is {node.state()}, not fresh, when the join looks"))
            return
        node._apply_join_ticket(payload, b"-----BEGIN PRIVATE KEY-----\n")  # pylint: disable=protected-access
    except (NodeLockError, TicketError) as exc:
        results.put(("join", "lost", str(exc)))
        return
    results.put(("join", "won", _ticket.cluster_id_of(payload).hex()))


def _join_payload() -> JoinTicket:
    """A join ticket of an existing cluster (what the join service seals; only its shape matters here)."""
    master_key, master_salt, measurement_salt = os.urandom(32), os.urandom(32), os.urandom(32)
    measurement_secret = derive.measurement_secret(master_key, master_salt)

    def b64(raw: bytes) -> str:
        return base64.b64encode(raw).decode()

    document = {
        "version": 1,
        "node_name": "worker-1",
        "control_plane": False,
        "cluster_id": derive.cluster_id(measurement_secret, measurement_salt).hex(),
        "measurement_secret": b64(measurement_secret),
        "measurement_salt": b64(measurement_salt),
        "state_disk_key": b64(derive.state_disk_key(master_key, master_salt, DISK_UUID)),
        "api_server_endpoint": "10.0.0.10:6443",
        "bootstrap_token": "abcdef.0123456789abcdef",
        "ca_cert_hashes": ["sha256:" + "00" * 32],
        "ca_crt": "-----BEGIN CERTIFICATE-----\n",
        "kubelet_client_crt": "-----BEGIN CERTIFICATE-----\n",
        "control_plane_files": {},
        "kubernetes_version": "",
    }
    return JoinTicket.from_bytes(json.dumps(document).encode())


def _written(directory: Path) -> list[str]:
    return (
        sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file()) if directory.exists() else []
    )


class Trial:
    def __init__(self, number: int, tcti: str, workdir: Path):
        self.number = number
        self.tcti = tcti
        self.dir = workdir / f"trial-{number}"
        self.dir.mkdir(parents=True)

    def run(self, context) -> dict:
        key = seal.EphemeralKey.generate(seal.X25519 if self.number % 2 else seal.MLKEM768_X25519)
        (self.dir / "init-ephemeral.key").write_bytes(key.private_bytes())
        nonce = os.urandom(32)
        secrets = RootSecrets(os.urandom(32), os.urandom(32), os.urandom(32))
        sealed = seal.seal(
            json.dumps(dict(secrets.to_document(), cluster_config={})).encode(),
            key.public_bytes(),
            "init",
            nonce,
            VERIFIER_ID,
        )
        payload = _join_payload()
        start, results = context.Event(), context.Queue()
        processes = [
            context.Process(
                target=_reporting("init", _init_contender), args=(self.dir, self.tcti, sealed, nonce, start, results)
            ),
            context.Process(
                target=_reporting("join", _join_contender), args=(self.dir, self.tcti, payload, start, results)
            ),
        ]
        # Alternate who is started first, so that neither side has a head start over the trials.
        for process in processes if self.number % 2 else reversed(processes):
            process.start()
        start.set()
        outcomes = {}
        for unused in processes:
            side, result, detail = results.get(timeout=60)
            outcomes[side] = (result, detail)
        for process in processes:
            process.join(30)
        with Tpm(self.tcti) as tpm:
            pcr15 = tpm.read_pcrs("sha256", (15,))[15]
        record_path = self.dir / "nodelock.json"
        record = json.loads(record_path.read_text()) if record_path.exists() else {}
        return {
            "outcomes": outcomes,
            "pcr15": pcr15,
            "record": record,
            "exit_codes": [p.exitcode for p in processes],
            "written": {side: _written(self.dir / side) for side in ("init", "join")},
            "clusters": {"init": secrets.cluster_id().hex(), "join": payload.cluster_id.hex()},
        }


def check(result: dict) -> list[str]:
    """Every way the trial broke the node lock's promise."""
    problems = []
    outcomes = result["outcomes"]
    winners = [side for side, (outcome, unused) in outcomes.items() if outcome == "won"]
    if result["exit_codes"] != [0, 0]:
        problems.append(f"a contender crashed: exit codes {result['exit_codes']}")
    crashed = [f"{side}: {detail}" for side, (outcome, detail) in outcomes.items() if outcome == "crashed"]
    if crashed:
        problems.append(f"crashed: {'; '.join(crashed)}")
    if len(winners) != 1:
        return problems + [f"{len(winners)} winners: {outcomes}"]
    winner = winners[0]
    loser = "join" if winner == "init" else "init"
    cluster_id = bytes.fromhex(result["clusters"][winner])
    if result["pcr15"] != node_lock_mark(cluster_id):
        problems.append(f"PCR 15 is {result['pcr15'].hex()}, not exactly one extend of the winner's mark")
    if result["record"].get("cluster_id") != cluster_id.hex():
        problems.append(f"lock record names {result['record'].get('cluster_id')}, not the winner {cluster_id.hex()}")
    # NodeLock.take's refusal, or NodeJoin.state's for a node init has locked.
    if not any(
        words in outcomes[loser][1]
        for words in ("already locked for cluster", "but has not joined: a join failed after")
    ):
        problems.append(f"the loser stopped for another reason: {outcomes[loser][1]}")
    if result["written"][loser]:
        problems.append(f"the loser ({loser}) wrote {result['written'][loser]}")
    if not result["written"][winner]:
        problems.append(f"the winner ({winner}) wrote nothing after taking the lock")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=int(os.environ.get("RACE_TRIALS", "200")))
    args = parser.parse_args(argv)
    started = time.monotonic()
    tpms = support.ManufacturedTpms(("lab",))
    workdir = Path(tempfile.mkdtemp(prefix="ck-race-"))
    context = multiprocessing.get_context("fork")
    single = double = 0
    wins = {"init": 0, "join": 0}
    failures = []
    try:
        for number in range(args.trials):
            instance = tpms.start("lab")
            try:
                result = Trial(number, instance.tcti, workdir).run(context)
            finally:
                instance.stop()
            problems = check(result)
            winners = [side for side, (outcome, unused) in result["outcomes"].items() if outcome == "won"]
            single += len(winners) == 1 and not problems
            double += result["pcr15"] != bytes(32) and all(
                result["pcr15"] != node_lock_mark(bytes.fromhex(c)) for c in result["clusters"].values()
            )
            for side in winners:
                wins[side] += 1
            if problems:
                failures.append((number, problems))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(tpms.dir, ignore_errors=True)
    sys.stdout.write(
        f"race: {args.trials} trials, {single} single winners, {double} double extends "
        f"(init won {wins['init']}, join won {wins['join']}), {time.monotonic() - started:.1f} s\n"
    )
    for number, problems in failures[:10]:
        sys.stdout.write(f"  trial {number}: {'; '.join(problems)}\n")
    return 0 if single == args.trials and not double else 1


if __name__ == "__main__":
    raise SystemExit(main())
