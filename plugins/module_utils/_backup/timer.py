# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The snapshot timer's program (``confidential-etcd-backup.service``, run without Ansible on a control plane):
take an encrypted snapshot of the local member exactly as the etcd_snapshot module does (key derived on the node
from its own 0600 copy of the root secrets), keep it as ``<dir>/etcd-<UTC time>/`` with ``etcd.cksnap`` and
``manifest.json`` (the controller's layout, so a directory copied into ``backups/`` restores as it is), and remove
all but the newest ``--keep`` of this cluster's authenticated snapshots (nothing else in the directory is removed).

    python -m ansible_collections.confidential.kubernetes.plugins.module_utils._backup.timer --dir DIR --keep N
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import time

from .._join.config import ConfigError, load_root_secrets
from . import manifest, snapshot
from .etcd import EtcdError, Etcdctl, take_snapshot


class TimerError(RuntimeError):
    """The snapshot could not be taken or kept; the message names why."""


def run(
    etcdctl: Etcdctl,
    secrets_file: str,
    directory: str,
    keep: int,
    work_dir: str,
    member: str,
    chunk_size: int = snapshot.DEFAULT_CHUNK_SIZE,
    now: float | None = None,
) -> dict:
    """One snapshot into ``directory``, then the newest ``keep`` kept. A failed run leaves the kept ones as they were
    (its partial directory is removed, and so is any a crashed run left)."""
    if keep < 1:
        raise TimerError(f"--keep must be at least 1, got {keep}")
    try:
        secrets = load_root_secrets(secrets_file)
    except ConfigError as exc:
        raise TimerError(str(exc)) from None
    name = manifest.name_for(time.time() if now is None else now)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    final = os.path.join(directory, name)
    if os.path.lexists(final):
        raise TimerError(f"{final} exists already (two snapshots in one second)")
    partial = os.path.join(directory, f".{name}.part")
    try:
        os.mkdir(partial, 0o700)
        result = take_snapshot(
            etcdctl, secrets, work_dir, os.path.join(partial, manifest.SNAPSHOT_FILE), chunk_size, name, member
        )
        manifest.write(partial, manifest.Manifest.from_document(result["manifest"], name))
        os.rename(partial, final)
    except EtcdError as exc:
        raise TimerError(str(exc)) from None
    finally:
        if os.path.lexists(partial):
            shutil.rmtree(partial)
    stale = [entry for entry in os.listdir(directory) if manifest.PARTIAL.fullmatch(entry)]
    for entry in stale:
        shutil.rmtree(os.path.join(directory, entry))
    kept = manifest.prune(
        directory, keep, snapshot.backup_key(secrets.master_key, secrets.master_salt), secrets.cluster_id(), name
    )
    return dict(
        snapshot=final,
        revision=result["revision"],
        size=result["size"],
        save_seconds=result["save_seconds"],
        encrypt_seconds=result["encrypt_seconds"],
        kept=kept["kept"],
        pruned=kept["pruned"],
        unauthenticated=sorted(kept["unauthenticated"]),
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="confidential-etcd-backup", description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--dir", required=True, help="where the snapshots are kept (on the state disk)")
    parser.add_argument("--keep", type=int, default=7, help="how many snapshots to keep (the newest)")
    parser.add_argument("--etcdctl", default="etcdctl")
    parser.add_argument("--endpoint", default="https://127.0.0.1:2379")
    parser.add_argument("--cacert", default="/etc/kubernetes/pki/etcd/ca.crt")
    parser.add_argument("--cert", default="/etc/kubernetes/pki/etcd/healthcheck-client.crt")
    parser.add_argument("--key", default="/etc/kubernetes/pki/etcd/healthcheck-client.key", help="a path")
    parser.add_argument("--secrets-file", default="/etc/confidential-kubernetes/cluster-secrets.json")
    parser.add_argument(
        "--work-dir",
        default="/run/confidential-kubernetes/etcd-backup-timer",
        help="0700 directory (tmpfs) for the plaintext while it is encrypted",
    )
    parser.add_argument("--chunk-size", type=int, default=snapshot.DEFAULT_CHUNK_SIZE)
    parser.add_argument("--member", default=socket.gethostname(), help="the member's name in the manifest")
    parser.add_argument("--timeout", type=int, default=60, help="seconds an etcdctl call may take")
    return parser


def main(argv: list | None = None) -> int:
    args = _parser().parse_args(argv)
    client = Etcdctl(
        binary=args.etcdctl,
        endpoint=args.endpoint,
        cacert=args.cacert,
        cert=args.cert,
        key=args.key,
        timeout=args.timeout,
    )
    try:
        result = run(client, args.secrets_file, args.dir, args.keep, args.work_dir, args.member, args.chunk_size)
    except (TimerError, OSError, ValueError) as exc:
        # One line for the journal; the message names a path or etcd's answer, never a secret.
        sys.stderr.write(f"confidential-etcd-backup: {exc}\n")
        return 1
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
