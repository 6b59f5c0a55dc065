"""Load suite of the join service: many joins by concurrent clients, with a service restart and a measurement-policy
change in the middle, valid and tampered nodes mixed.

Run: .venv/bin/python tests/load/join_load.py [--joins N] [--clients C]   (defaults: CK_LOAD_JOINS or 2000, CK_LOAD_CLIENTS or 64)

What runs, all real: the join service as a process of its own (tests/load/recording_service.py: the daemon's own
main() with a token minter that records tokens to a file), gRPC over TLS on 127.0.0.1, one swtpm per client (a
node's own TPM; every join quotes fresh evidence over the service's nonce), and the node's own client
(``request_ticket``, with its retries and backoff). One client in 16 is a tampered node: its swtpm has PCR 8, a
policy PCR, extended, so every one of its joins must be refused (``pcr-policy``).
After a third of the joins the policy file is rewritten with a valid change (PCR 7 added, a second allowed value for
PCR 9) that the running service must pick up; after two thirds the service gets SIGTERM (it drains: joins in flight
finish, new RPCs get UNAVAILABLE), exits, and a new process starts on the same port, where nonces of the old one
are unknown. Clients ride both out by retrying.
Checks: every valid join ends with a ticket that opens (0 lost, 0 valid refused), every tampered join is refused,
no token is minted twice, every delivered ticket carries a minted token and every minted token was delivered, both
service processes exit 0, the policy reload is in the service log. Prints the summary line and exits 1 on a failure.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import collections
import dataclasses
import json
import multiprocessing
import os
import queue
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SERVICE = Path(__file__).resolve().parent / "recording_service.py"
TAMPERED_EVERY = 16
TAMPERED_PCR = 8
CLIENT_PROCESSES = 2
NODE_NAME = "node"
GRACE_PERIOD = 10.0
# The client's retry settings for this run: more attempts and a shorter first backoff than the role's defaults, so a
# restart costs seconds; the logic (which failures retry, exponential backoff with jitter) is the client's own.
ATTEMPTS = 10
BACKOFF = 0.25
MAX_BACKOFF = 4.0


sys.path.insert(0, str(REPO / "tests"))
from testenv import unit_conftest  # noqa: E402

conftest = unit_conftest()
sys.path.insert(0, str(REPO / "tests" / "unit" / "plugins" / "module_utils" / "_join"))

import grpc  # noqa: E402

import join_harness  # noqa: E402
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import issuer  # noqa: E402
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import PcrRule, dump_policy  # noqa: E402
from ansible_collections.confidential.kubernetes.plugins.module_utils._join import joinservice_pb2 as pb2  # noqa: E402
from ansible_collections.confidential.kubernetes.plugins.module_utils._join import joinservice_pb2_grpc as pb2_grpc  # noqa: E402
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.client import JoinError, request_ticket  # noqa: E402


@dataclasses.dataclass
class Client:
    index: int
    tcti: str
    tampered: bool
    nodes: list[str]

    @property
    def node_name(self) -> str:
        return f"{NODE_NAME}-{self.index}"

    @property
    def disk_uuid(self) -> str:
        return f"00000000-0000-4000-8000-{self.index:012d}"


@dataclasses.dataclass
class Outcome:
    node: str
    tampered: bool
    token: str | None
    code: str | None
    reason: str | None
    exhausted: bool
    retries: int
    seconds: float


def run_clients(endpoint: str, ca_pem: bytes, clients: list[Client], progress, start, results) -> None:
    """One client process: a thread per client, each joining its nodes one after another with the real client."""
    outcomes: list[Outcome] = []
    lock = threading.Lock()

    def node_joins(client: Client) -> None:
        for node in client.nodes:
            retries = []

            def counted_sleep(seconds: float) -> None:
                retries.append(seconds)
                time.sleep(seconds)

            started = time.monotonic()
            token = code = reason = None
            exhausted = False
            try:
                # Every client is a TPM of its own (one EK, as a real node has; the join service keeps one pending
                # challenge per EK and client), enrolled under its own name with its own disk.
                payload = request_ticket(
                    [endpoint],
                    ca_pem,
                    client.tcti,
                    client.node_name,
                    disk_uuid=client.disk_uuid,
                    kubelet_csr_pem=join_harness.make_csr(client.node_name),
                    attempts=ATTEMPTS,
                    backoff=BACKOFF,
                    max_backoff=MAX_BACKOFF,
                    timeout=30,
                    total_timeout=180,
                    sleep=counted_sleep,
                )
                token = payload.bootstrap_token
            except JoinError as exc:
                code, reason = exc.code, exc.reason
                exhausted = str(exc).startswith("no join service issued a ticket")
            except Exception as exc:  # noqa: BLE001 - anything else is a lost join, reported by name
                code, reason, exhausted = "client-error", f"{type(exc).__name__}: {exc}", True
            with lock:
                outcomes.append(
                    Outcome(
                        node, client.tampered, token, code, reason, exhausted, len(retries), time.monotonic() - started
                    )
                )
            progress.put(1)

    threads = [threading.Thread(target=node_joins, args=(client,)) for client in clients]
    progress.put("ready")
    start.wait()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results.put([dataclasses.asdict(outcome) for outcome in outcomes])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServiceProcess:
    """The join service in a process of its own; its JSON log goes to a file."""

    def __init__(self, config: Path, tokens: Path, log: Path, endpoint: str, ca_pem: bytes):
        self.log = log
        with open(log, "wb") as handle:
            self.process = subprocess.Popen(
                [sys.executable, str(SERVICE), "--config", str(config), "--tokens", str(tokens)],
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=handle,
            )
        deadline = time.monotonic() + 60
        with grpc.secure_channel(endpoint, grpc.ssl_channel_credentials(ca_pem)) as channel:
            stub = pb2_grpc.JoinServiceStub(channel)
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(f"join service exited with {self.process.returncode}: {log.read_text()[-2000:]}")
                try:
                    if stub.Health(pb2.HealthRequest(), timeout=2).status == "SERVING":
                        return
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"join service not serving after 60 s: {log.read_text()[-2000:]}")
                time.sleep(0.1)

    def stop(self) -> int:
        """SIGTERM: the service drains and exits; its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=GRACE_PERIOD + 30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return -9

    def events(self) -> list[dict]:
        lines = self.log.read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]


def tamper(swtpm) -> None:
    with issuer.Tpm(swtpm.tcti) as tpm:
        tpm.pcr_event(TAMPERED_PCR, b"confidential.kubernetes load suite: a modified boot component")


def changed_policy(policy):
    """A valid change: PCR 7 enforced at its present value and a second allowed value for PCR 9 (an update being rolled
    out). Valid nodes are still admitted, the tampered ones (PCR 8) still refused."""
    rules = dict(policy.rules)
    rules[7] = PcrRule(7, (bytes(32),))
    rules[9] = PcrRule(9, rules[9].allowed + (bytes.fromhex("9f" * 32),))
    return dataclasses.replace(policy, rules=rules)


def write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".new")
    temporary.write_text(text)
    os.replace(temporary, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--joins", type=int, default=int(os.environ.get("CK_LOAD_JOINS", "2000")))
    parser.add_argument("--clients", type=int, default=int(os.environ.get("CK_LOAD_CLIENTS", "64")))
    parser.add_argument(
        "--ak-trust",
        choices=("pcrs-only", "ek-certificate"),
        default=os.environ.get("CK_LOAD_AK_TRUST", "pcrs-only"),
        help="the policy's AK trust: ek-certificate adds the EK chain check and a credential activation per join",
    )
    args = parser.parse_args()
    if args.clients < TAMPERED_EVERY or args.joins < 3 * args.clients:
        parser.error(f"need at least {TAMPERED_EVERY} clients and 3 joins per client")
    # A killed run still stops its swtpm and service processes (the finally below).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    work = Path(tempfile.mkdtemp(prefix="ck-load-"))
    swtpms: list = []
    services: list[ServiceProcess] = []
    processes: list = []
    try:
        # One manufactured TPM (its own EK and EK certificate) per client: the first makes the EK CA, the rest two at
        # a time.
        manufactured = [conftest.ManufacturedTpm(work / "tpm-0", work / "ek-ca")]
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            manufactured += pool.map(
                lambda i: conftest.ManufacturedTpm(work / f"tpm-{i}", work / "ek-ca"), range(1, args.clients)
            )
        swtpms = [conftest.SwtpmInstance(tpm) for tpm in manufactured]
        lab = join_harness.JoinLab(work / "node", swtpms[-1])
        policy = lab.write_policy(args.ak_trust)
        clients = [Client(i, swtpms[i].tcti, i % TAMPERED_EVERY == 0, []) for i in range(args.clients)]
        for client in clients:
            lab.enrol(client.tcti, client.node_name)
        for client in clients:
            if client.tampered:
                tamper(swtpms[client.index])
        for number in range(args.joins):
            client = clients[number % args.clients]
            client.nodes.append(f"{'tampered' if client.tampered else 'node'}-{client.index}-{len(client.nodes)}")
        port = free_port()
        endpoint = f"127.0.0.1:{port}"
        config = work / "joinservice.json"
        # All clients share 127.0.0.1, where a real cluster's nodes are as many addresses: the per-peer limits are lifted
        # (rates; connections and waiting challenges per client address up to the global caps, which stay). With one
        # address's caps, a restart that has every client reconnect at once refused a client until its attempts ran out.
        settings = lab.config(
            port,
            grace_period=GRACE_PERIOD,
            policy_check_interval=0.5,
            nonce_rate=1e6,
            nonce_burst=1e6,
            ticket_rate=1e6,
            ticket_burst=1e6,
        )
        config.write_text(
            json.dumps(
                dataclasses.asdict(
                    dataclasses.replace(
                        settings,
                        max_connections_per_client=settings.max_connections,
                        max_connections_per_network=settings.max_connections,
                        max_calls_per_client=settings.max_concurrent_rpcs,
                        max_calls_per_network=settings.max_concurrent_rpcs,
                    )
                )
            )
        )
        tokens = work / "tokens"
        services.append(ServiceProcess(config, tokens, work / "service-1.log", endpoint, lab.ca_pem))

        context = multiprocessing.get_context("spawn")
        progress, results, start = context.Queue(), context.Queue(), context.Event()
        processes = [
            context.Process(
                target=run_clients, args=(endpoint, lab.ca_pem, clients[i::CLIENT_PROCESSES], progress, start, results)
            )
            for i in range(CLIENT_PROCESSES)
        ]
        for process in processes:
            process.start()
        ready = 0
        while ready < CLIENT_PROCESSES:
            ready += progress.get(timeout=120) == "ready"
        started = time.monotonic()
        start.set()
        done, policy_changed_at, restart = 0, None, None
        while done < args.joins:
            try:
                done += progress.get(timeout=300)
            except queue.Empty:
                raise RuntimeError(f"no join finished within 300 s ({done} of {args.joins} done)") from None
            if policy_changed_at is None and done >= args.joins // 3:
                write_atomically(lab.policy_file, dump_policy(changed_policy(policy)))
                policy_changed_at = done
            if restart is None and done >= 2 * args.joins // 3:
                stopping = time.monotonic()
                first_exit = services[0].stop()
                stopped = time.monotonic()
                services.append(ServiceProcess(config, tokens, work / "service-2.log", endpoint, lab.ca_pem))
                restart = (done, first_exit, stopped - stopping, time.monotonic() - stopped)
        duration = time.monotonic() - started
        outcomes = [Outcome(**o) for _p in processes for o in results.get(timeout=120)]
        for process in processes:
            process.join(timeout=60)
        second_exit = services[-1].stop()
        failed = report(args, outcomes, tokens, services, restart, second_exit, policy_changed_at, duration)
        if failed:
            print(f"service logs and minted tokens kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
        return failed
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
        for service in services:
            if service.process.poll() is None:
                service.process.kill()
                service.process.wait()
        for instance in swtpms:
            instance.stop()


def report(
    args,
    outcomes: list[Outcome],
    tokens: Path,
    services: list[ServiceProcess],
    restart,
    second_exit: int,
    policy_changed_at: int | None,
    duration: float,
) -> int:
    failures = []
    valid = [o for o in outcomes if not o.tampered]
    tampered = [o for o in outcomes if o.tampered]
    lost = [o for o in outcomes if o.token is None and (o.exhausted or o.code is None)]
    valid_refused = [o for o in valid if o.token is None and not o.exhausted and o.code is not None]
    tampered_refused = [o for o in tampered if o.token is None and o.reason == "pcr-policy"]
    tampered_admitted = [o for o in tampered if o.token is not None]
    minted = collections.Counter(line.split()[0] for line in tokens.read_text().splitlines())
    duplicates = sum(count - 1 for count in minted.values() if count > 1)
    delivered = collections.Counter(o.token for o in outcomes if o.token is not None)
    unminted = set(delivered) - set(minted)
    undelivered = set(minted) - set(delivered)
    events = [e for service in services for e in service.events()]
    reloads = [e for e in events if e["event"] == "policy-reload" and e.get("result") == "loaded"]
    starts = [e for e in events if e["event"] == "start" and e.get("result") == "serving"]
    refusals = collections.Counter(e.get("reason") for e in events if e.get("result") == "refused")

    checks = [
        (len(outcomes) == args.joins, f"{len(outcomes)} outcomes for {args.joins} joins"),
        (not lost, f"{len(lost)} lost, e.g. {[(o.node, o.code, o.reason) for o in lost[:3]]}"),
        (
            not valid_refused,
            f"{len(valid_refused)} valid refused, e.g. {[(o.node, o.code, o.reason) for o in valid_refused[:3]]}",
        ),
        (
            len(tampered_refused) == len(tampered),
            f"{len(tampered) - len(tampered_refused)} tampered joins not refused as pcr-policy",
        ),
        (not tampered_admitted, f"{len(tampered_admitted)} tampered nodes got a ticket"),
        (duplicates == 0, f"{duplicates} duplicate tokens minted"),
        (all(count == 1 for count in delivered.values()), "a token was delivered to two joins"),
        (not unminted, f"{len(unminted)} delivered tokens were never minted"),
        (not undelivered, f"{len(undelivered)} minted tokens were never delivered"),
        (
            restart is not None and restart[1] == 0 and second_exit == 0,
            f"service exit codes {restart and restart[1]}, {second_exit}",
        ),
        (len(starts) == 2, f"{len(starts)} service starts logged, expected 2"),
        (any(7 in e.get("pcrs", []) for e in reloads), f"no policy reload with PCR 7 logged ({reloads})"),
        (
            not refusals.keys() & {"client-connection-limit", "busy"},
            f"a cap of this run refused joins: {dict(refusals)}",
        ),
    ]
    failures = [message for ok, message in checks if not ok]
    seconds = sorted(o.seconds for o in valid if o.token)
    retried = sum(1 for o in outcomes if o.retries)
    print(
        f"join service under load: {args.clients} clients ({args.clients // TAMPERED_EVERY} tampered) in {CLIENT_PROCESSES} processes, "
        f"one swtpm each, ak_trust {args.ak_trust}, {os.cpu_count()} CPU(s), grpcio {grpc.__version__}"
    )
    print(
        f"policy changed after {policy_changed_at} joins; restart after {restart[0] if restart else '-'} joins: "
        f"drain and exit {restart[2]:.1f} s, new process serving {restart[3]:.1f} s later"
        if restart
        else "no restart happened"
    )
    print(
        f"tickets {len(seconds)}, {len(seconds) / duration:.1f}/s; join latency with retries p50 {statistics.median(seconds) * 1000:.0f} ms, "
        f"p99 {seconds[int(len(seconds) * 0.99)] * 1000:.0f} ms, max {seconds[-1] * 1000:.0f} ms; {retried} joins retried"
        if seconds
        else "no tickets"
    )
    print(f"service refusals by reason: {dict(sorted(refusals.items(), key=str))}")
    print(
        f"load: {len(outcomes)} joins, {args.clients} clients, {len(starts) - 1} restart, {len(reloads)} policy change: "
        f"{len(lost)} lost, {duplicates} duplicate tokens, {len(valid_refused)} valid refused, "
        f"{len(tampered_refused)}/{len(tampered)} tampered refused, {duration:.1f} s"
    )
    for message in failures:
        print(f"FAILED: {message}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
