# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node's half of backup and restore: etcdctl (v3 API, 3.4 and later) behind one runner seam, and the steps that
keep a plaintext snapshot on the node only, in a 0700 work directory, deleted once encrypted or restored."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable

from .._crypto.root_secrets import RootSecrets
from .._files import file_sha256
from . import manifest, snapshot

# argv -> (rc, stdout, stderr)
Runner = Callable[[list], "tuple[int, str, str]"]


class EtcdError(RuntimeError):
    """etcdctl failed, or its answer is not what a snapshot or restore needs."""


def run_command(argv: list) -> tuple[int, str, str]:
    completed = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, ETCDCTL_API="3"), check=False)
    return completed.returncode, completed.stdout, completed.stderr


@dataclass(frozen=True)
class SnapshotStatus:
    revision: int
    hash: int
    total_keys: int
    total_size: int


@dataclass(frozen=True)
class Etcdctl:
    """etcdctl against one member, with the client certificate kubeadm gives control planes."""

    binary: str = "etcdctl"
    endpoint: str = "https://127.0.0.1:2379"
    cacert: str = "/etc/kubernetes/pki/etcd/ca.crt"
    cert: str = "/etc/kubernetes/pki/etcd/healthcheck-client.crt"
    key: str = "/etc/kubernetes/pki/etcd/healthcheck-client.key"
    timeout: int = 10
    runner: Runner = field(default=run_command, compare=False)

    def _client_args(self) -> list:
        args = [f"--endpoints={self.endpoint}", f"--command-timeout={self.timeout}s"]
        if self.endpoint.startswith("https://"):
            args += [f"--cacert={self.cacert}", f"--cert={self.cert}", f"--key={self.key}"]
        return args

    def _run(self, args: list, what: str) -> str:
        try:
            rc, out, err = self.runner([self.binary] + args)
        except OSError as exc:
            raise EtcdError(f"{what}: cannot run {self.binary}: {exc.strerror}") from None
        if rc != 0:
            detail = (err.strip().splitlines() or out.strip().splitlines() or [f"exit {rc}"])[-1]
            raise EtcdError(f"{what} failed: {detail}")
        return out

    def health(self) -> None:
        """Raises EtcdError naming why this member does not serve (a quorum read through it fails)."""
        self._run(["endpoint", "health"] + self._client_args(), f"etcd member {self.endpoint}: health check")

    def members(self) -> list:
        out = self._run(["member", "list", "-w", "json"] + self._client_args(), f"etcd member list at {self.endpoint}")
        return [
            dict(name=m.get("name", ""), peer_urls=m.get("peerURLs", []), client_urls=m.get("clientURLs", []))
            for m in json.loads(out).get("members", [])
        ]

    def save(self, path: str) -> None:
        self._run(["snapshot", "save", path] + self._client_args(), f"etcd snapshot from {self.endpoint}")

    def status(self, path: str) -> SnapshotStatus:
        out = self._run(["snapshot", "status", path, "-w", "json"], f"etcd snapshot status of {path}")
        try:
            doc = json.loads(out)
            return SnapshotStatus(int(doc["revision"]), int(doc["hash"]), int(doc["totalKey"]), int(doc["totalSize"]))
        except (ValueError, KeyError, TypeError):
            raise EtcdError(f"etcd snapshot status of {path}: unexpected answer") from None

    def restore(self, path: str, member: "RestoreMember") -> None:
        self._run(
            [
                "snapshot",
                "restore",
                path,
                f"--name={member.name}",
                f"--data-dir={member.data_dir}",
                f"--initial-cluster={member.initial_cluster}",
                f"--initial-cluster-token={member.cluster_token}",
                f"--initial-advertise-peer-urls={member.peer_urls}",
            ],
            f"etcd snapshot restore of {member.name}",
        )


@dataclass(frozen=True)
class RestoreMember:
    """Who this member is in the restored cluster: every member restores the same snapshot with the same
    ``initial_cluster`` (name=peer URL, ...) and token, its own name and peer URLs, into a data directory that
    must not exist yet."""

    name: str
    peer_urls: str
    initial_cluster: str
    cluster_token: str
    data_dir: str

    def check(self) -> None:
        names = dict(item.split("=", 1) for item in self.initial_cluster.split(",") if "=" in item)
        if names.get(self.name) != self.peer_urls:
            raise EtcdError(
                f"etcd restore: member {self.name}={self.peer_urls} is not in the initial cluster "
                f"{self.initial_cluster}"
            )
        if os.path.lexists(self.data_dir):
            raise EtcdError(f"etcd restore: {self.data_dir} exists; restore only into a fresh directory")


def _work_dir(path: str) -> str:
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def take_snapshot(
    etcdctl: Etcdctl,
    secrets: RootSecrets,
    work_dir: str,
    dest: str,
    chunk_size: int = snapshot.DEFAULT_CHUNK_SIZE,
    name: str | None = None,
    member: str | None = None,
) -> dict:
    """Save a snapshot from the member, check it, encrypt it to ``dest`` (new, 0600) with its manifest's fields in the
    authenticated header; the plaintext lives only in ``work_dir`` and is deleted whatever happens. ``name`` is the
    snapshot's ``etcd-<UTC time>`` (default now), ``member`` this member's name (default the host name).

    Returns ``manifest`` (its document, as ``manifest.json`` holds it), the figures a report names (revision, sizes,
    SHA-256, ...) and the timings."""
    name = manifest.name_for(time.time()) if name is None else name
    manifest.check_name(name)
    plaintext = os.path.join(_work_dir(work_dir), f"etcd-{_stamp()}-{os.getpid()}.db")
    started = time.monotonic()
    try:
        etcdctl.save(plaintext)
        os.chmod(plaintext, 0o600)
        saved = time.monotonic()
        status = etcdctl.status(plaintext)
        info = snapshot.encrypt_file(
            snapshot.backup_key(secrets.master_key, secrets.master_salt),
            secrets.cluster_id(),
            plaintext,
            dest,
            chunk_size,
            manifest.provenance(name, status.revision, status.total_keys, status.hash, member or socket.gethostname()),
        )
    finally:
        if os.path.lexists(plaintext):
            os.unlink(plaintext)
        if os.path.lexists(plaintext + ".part"):
            os.unlink(plaintext + ".part")
    document = manifest.from_info(info, info.ciphertext_size, file_sha256(dest)).to_document()
    reported = ("cluster_id", "revision", "etcd_hash", "total_keys", "snapshot_size", "size", "sha256")
    return dict(
        {name: document[name] for name in reported},
        manifest=document,
        save_seconds=round(saved - started, 3),
        encrypt_seconds=round(time.monotonic() - saved, 3),
    )


def restore_snapshot(
    etcdctl: Etcdctl,
    secrets: RootSecrets,
    src: str,
    work_dir: str,
    member: RestoreMember,
    expected_revision: int | None = None,
    check_only: bool = False,
) -> dict:
    """Authenticate and decrypt ``src`` into ``work_dir``, check it with etcdctl, and restore it into the member's
    fresh data directory. Nothing is written outside ``work_dir`` unless every chunk verified; the plaintext is
    deleted whatever happens. With ``check_only`` the file is only authenticated (no plaintext at all)."""
    key = snapshot.backup_key(secrets.master_key, secrets.master_salt)
    if check_only:
        info = snapshot.verify_file(key, secrets.cluster_id(), src)
        return dict(cluster_id=info.cluster_id, snapshot_size=info.plaintext_size)
    member.check()
    plaintext = os.path.join(_work_dir(work_dir), f"restore-{_stamp()}-{os.getpid()}.db")
    try:
        info = snapshot.decrypt_file(key, secrets.cluster_id(), src, plaintext)
        status = etcdctl.status(plaintext)
        if expected_revision is not None and status.revision != expected_revision:
            raise EtcdError(
                f"etcd restore: the snapshot holds revision {status.revision}, its manifest says {expected_revision}"
            )
        try:
            etcdctl.restore(plaintext, member)
        except EtcdError:
            if os.path.isdir(member.data_dir):
                shutil.rmtree(member.data_dir)
            raise
        os.chmod(member.data_dir, 0o700)
    finally:
        if os.path.lexists(plaintext):
            os.unlink(plaintext)
    return dict(
        cluster_id=info.cluster_id,
        revision=status.revision,
        snapshot_size=info.plaintext_size,
        data_dir=member.data_dir,
    )
