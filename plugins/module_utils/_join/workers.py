# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where the join service runs the CPU-bound steps of a join (``JoinCrypto.check``, ``JoinCrypto.seal_ticket``).

``worker_processes: N`` (N >= 1) runs them in N worker processes; ``worker_processes: 0`` runs them on the event loop's
own thread. Processes rather than threads: the steps are Python around OpenSSL and hold the interpreter lock most of
the time, so threads would share one core. Each worker is spawned (no fork of a process running gRPC) with one end of a
socket pair, and loads the cluster CA itself from ``pki_dir``: the key is in no message, argument or log line. The
event loop writes each job (a length-prefixed pickle of what the request brought) to the worker with the fewest jobs in
flight and reads the answers as the socket becomes readable: no helper thread and no lock shared between processes
stand between a request and its worker. A worker holds the cluster CA and the EK CAs, never the root secrets or the
nonce key; it ignores SIGTERM and SIGINT (the service drains, then closes the sockets, and a worker exits when its
socket closes). A worker that dies fails the jobs it held (the requests get INTERNAL) and is replaced by the next job.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import pickle
import signal
import socket
import struct

from .._attestation.verifier import load_ca_certificates
from .crypto import AttestCheck, Attested, CheckRequest, Checked, JoinCrypto, SealRequest
from .log import StructuredLog
from .pki import ClusterPki

_LENGTH = struct.Struct(">I")
STOP_TIMEOUT = 5.0


class WorkerDied(RuntimeError):
    """The worker process running a job exited before it answered."""


def _frame(message: object) -> bytes:
    body = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(body)) + body


class WorkerPool:
    """The CPU-bound steps, in ``processes`` worker processes or (0) in the calling thread.

    ``start``, ``check``, ``seal_ticket`` and ``close`` run on the service's event loop; ``join`` once it has stopped.
    """

    def __init__(self, processes: int, crypto: JoinCrypto, worker_args: tuple, log: StructuredLog):
        self.processes = processes
        self._crypto = crypto
        self._worker_args = worker_args
        self._log = log
        self._workers: list[_Worker] = []
        self._jobs = itertools.count()
        self._closing = False

    async def start(self) -> None:
        """Every worker now rather than at the first joins."""
        while len(self._workers) < self.processes:
            await self._spawn()

    async def check(self, request: CheckRequest) -> Checked:
        if not self.processes:
            return self._crypto.check(request)
        return await self._run("check", request)

    async def attest(self, request: AttestCheck) -> Attested:
        if not self.processes:
            return self._crypto.attest(request)
        return await self._run("attest", request)

    async def seal_ticket(self, request: SealRequest) -> bytes:
        if not self.processes:
            return self._crypto.seal_ticket(request)
        return await self._run("seal_ticket", request)

    async def _run(self, step: str, request: object):
        while len(self._workers) < self.processes and not self._closing:
            await self._spawn()
        if not self._workers:
            raise WorkerDied("the join service is stopping: no worker process takes new jobs")
        worker = min(self._workers, key=lambda candidate: len(candidate.jobs))
        return await worker.submit(next(self._jobs), step, request)

    async def _spawn(self) -> None:
        ours, theirs = socket.socketpair()
        process = multiprocessing.get_context("spawn").Process(
            target=serve, args=(theirs, *self._worker_args), daemon=True, name="joinservice-worker"
        )
        try:
            process.start()
        finally:
            theirs.close()
        worker = _Worker(self, process)
        await asyncio.get_running_loop().connect_accepted_socket(lambda: worker, ours)
        if not worker.lost:
            self._workers.append(worker)

    def _lost(self, worker: "_Worker") -> None:
        if self._closing:
            return
        if worker in self._workers:
            self._workers.remove(worker)
        if worker.process.is_alive():
            worker.process.kill()
        self._log.error(
            "workers",
            result="restarted",
            pid=worker.process.pid,
            jobs_failed=worker.failed,
            msg="a worker process died; the next job starts another",
        )

    def pids(self) -> list[int]:
        """The worker processes running now (the benchmark adds up their CPU time)."""
        return [worker.process.pid for worker in self._workers]

    async def close(self) -> None:
        """No new jobs; each worker's socket is closed, so it exits once its job is done (``join`` waits for that)."""
        self._closing = True
        for worker in list(self._workers):
            worker.close()

    def join(self) -> None:
        for worker in list(self._workers):
            worker.process.join(STOP_TIMEOUT)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
        self._workers.clear()


class _Worker(asyncio.Protocol):
    """The service's end of one worker's socket: jobs written, answers read and matched to their futures."""

    def __init__(self, pool: WorkerPool, process):
        self.process = process
        self.jobs: dict[int, asyncio.Future] = {}
        self.failed = 0
        self.lost = False
        self._pool = pool
        self._transport: asyncio.Transport | None = None
        self._received = bytearray()

    def connection_made(self, transport) -> None:
        self._transport = transport

    def submit(self, job: int, step: str, request: object) -> asyncio.Future:
        frame = _frame((job, step, request))
        future = asyncio.get_running_loop().create_future()
        self.jobs[job] = future
        self._transport.write(frame)
        return future

    def data_received(self, data: bytes) -> None:
        received = self._received
        received += data
        while len(received) >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(received)
            end = _LENGTH.size + length
            if len(received) < end:
                return
            job, ok, value = pickle.loads(received[_LENGTH.size : end])
            del received[:end]
            future = self.jobs.pop(job, None)
            # A job whose request was cancelled meanwhile is dropped.
            if future is not None and not future.done():
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        for future in self.jobs.values():
            if not future.done():
                self.failed += 1
                future.set_exception(WorkerDied(f"worker process {self.process.pid} exited before it answered"))
        self.jobs.clear()
        self._pool._lost(self)  # pylint: disable=protected-access

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


def serve(connection: socket.socket, pki_dir: str, ek_ca_pem: bytes, cluster_id: bytes, verifier_id: str) -> None:
    """A worker process: it reads the cluster CA itself, then answers jobs until the service closes its socket."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    crypto = JoinCrypto(
        ClusterPki.load(pki_dir), load_ca_certificates(ek_ca_pem) if ek_ca_pem else [], cluster_id, verifier_id
    )
    steps = {"check": crypto.check, "seal_ticket": crypto.seal_ticket, "attest": crypto.attest}
    jobs = connection.makefile("rb")
    while True:
        head = jobs.read(_LENGTH.size)
        if len(head) < _LENGTH.size:
            return
        job, step, request = pickle.loads(jobs.read(_LENGTH.unpack(head)[0]))
        try:
            answer = _frame((job, True, steps[step](request)))
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the request that caused it
            try:
                answer = _frame((job, False, exc))
            except Exception:  # noqa: BLE001 - an exception that does not pickle goes back as its text
                answer = _frame((job, False, RuntimeError(f"{type(exc).__name__}: {exc}")))
        connection.sendall(answer)
