# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's directory of encrypted etcd snapshots: ``<backup dir>/etcd-<UTC time>/`` each holding
``etcd.cksnap`` and ``manifest.json``. Storing checks what was fetched and keeps the last N; choosing a snapshot for
a restore checks its manifest, its SHA-256, its cluster and every chunk before any node is touched."""

from __future__ import annotations

import json
import os
import re
import shutil

from ansible_collections.confidential.kubernetes.plugins.module_utils._backup import snapshot
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import RootSecrets
from ansible_collections.confidential.kubernetes.plugins.module_utils._files import file_sha256, write_file_atomically

SNAPSHOT_FILE = "etcd.cksnap"
MANIFEST_FILE = "manifest.json"
MANIFEST_VERSION = 1
NAME = re.compile(r"^etcd-\d{8}T\d{6}Z$")
MANIFEST_FIELDS = ("cluster_id", "time", "revision", "member", "size", "sha256")
INTEGER_FIELDS = ("revision", "size", "snapshot_size", "total_keys", "etcd_hash")


class BackupError(RuntimeError):
    """A snapshot directory is missing, malformed or does not match its manifest."""


def snapshot_dirs(backup_dir: str) -> list[str]:
    """The snapshot directory names, oldest first (the names sort by time)."""
    if not os.path.isdir(backup_dir):
        return []
    return sorted(
        name for name in os.listdir(backup_dir) if NAME.match(name) and os.path.isdir(os.path.join(backup_dir, name))
    )


def store(backup_dir: str, name: str, manifest: dict, keep: int) -> dict:
    """Check the fetched ciphertext against what the node reported, write its manifest, and remove all but the
    newest ``keep`` snapshot directories. Returns the manifest and what was pruned."""
    if not NAME.match(name):
        raise BackupError(f"snapshot name {name!r} is not etcd-<YYYYmmddTHHMMSSZ>")
    if keep < 1:
        raise BackupError(f"keep must be at least 1, got {keep}")
    missing = [field for field in MANIFEST_FIELDS if manifest.get(field) in (None, "")]
    if missing:
        raise BackupError(f"snapshot manifest lacks {', '.join(missing)}")
    try:
        manifest = dict(manifest, **{key: int(manifest[key]) for key in INTEGER_FIELDS if key in manifest})
    except (TypeError, ValueError):
        raise BackupError(f"snapshot manifest: {', '.join(INTEGER_FIELDS)} must be integers") from None
    directory = os.path.join(backup_dir, name)
    path = os.path.join(directory, SNAPSHOT_FILE)
    if not os.path.isfile(path):
        raise BackupError(f"{path} was not fetched")
    actual = file_sha256(path)
    if actual != manifest["sha256"] or os.path.getsize(path) != manifest["size"]:
        raise BackupError(
            f"{path}: the fetched file (sha256 {actual}) is not the one the node wrote (sha256 {manifest['sha256']})"
        )
    os.chmod(directory, 0o700)
    os.chmod(path, 0o600)
    document = dict(version=MANIFEST_VERSION, name=name, **{key: manifest[key] for key in sorted(manifest)})
    write_file_atomically(
        os.path.join(directory, MANIFEST_FILE), (json.dumps(document, indent=2, sort_keys=True) + "\n").encode(), 0o600
    )
    names = snapshot_dirs(backup_dir)
    pruned = [old for old in names[:-keep] if old != name]
    for old in pruned:
        shutil.rmtree(os.path.join(backup_dir, old))
    return dict(manifest=document, path=path, pruned=pruned, kept=[n for n in names if n not in pruned])


def choose(backup_dir: str, wanted: str) -> str:
    """The snapshot directory for ``wanted``: ``latest``, a name ``etcd-<time>``, or a path to such a directory."""
    if wanted == "latest":
        names = snapshot_dirs(backup_dir)
        if not names:
            raise BackupError(f"no etcd snapshot in {backup_dir} (run playbook backup.yml first)")
        return os.path.join(backup_dir, names[-1])
    directory = wanted if os.sep in wanted else os.path.join(backup_dir, wanted)
    if os.path.isfile(directory):
        directory = os.path.dirname(directory)
    if not os.path.isdir(directory):
        raise BackupError(
            f"no etcd snapshot {wanted!r} (looked for {directory}); "
            f"there are: {', '.join(snapshot_dirs(backup_dir)) or 'none'}"
        )
    return directory


def verify(directory: str, secrets: RootSecrets) -> dict:
    """Check a snapshot directory for a restore: manifest, size and SHA-256, cluster, and every chunk.

    Raises BackupError for a bad manifest or a file that does not match it, snapshot.SnapshotError (a subclass per
    fault) for the file itself. Writes nothing.
    """
    manifest_path = os.path.join(directory, MANIFEST_FILE)
    path = os.path.join(directory, SNAPSHOT_FILE)
    try:
        with open(manifest_path, "rb") as handle:
            manifest = json.loads(handle.read(1 << 16))
    except FileNotFoundError:
        raise BackupError(f"{manifest_path} is missing: not a snapshot written by backup.yml") from None
    except ValueError:
        raise BackupError(f"{manifest_path} is not JSON") from None
    if not isinstance(manifest, dict) or manifest.get("version") != MANIFEST_VERSION:
        raise BackupError(f"{manifest_path}: not a version {MANIFEST_VERSION} snapshot manifest")
    missing = [field for field in MANIFEST_FIELDS if field not in manifest]
    if missing:
        raise BackupError(f"{manifest_path} lacks {', '.join(missing)}")
    cluster = secrets.cluster_id()
    if manifest["cluster_id"] != cluster.hex():
        raise snapshot.WrongClusterError(
            f"{path}: snapshot of cluster {manifest['cluster_id']}, not of this cluster {cluster.hex()}"
        )
    if not os.path.isfile(path):
        raise BackupError(f"{path} is missing")
    size = os.path.getsize(path)
    # The chunks' own checks name a fault precisely; the manifest's size and digest then catch anything else.
    info = snapshot.verify_file(snapshot.backup_key(secrets.master_key, secrets.master_salt), cluster, path)
    if size != manifest["size"] or file_sha256(path) != manifest["sha256"]:
        raise BackupError(f"{path} authenticates but is not the file its manifest describes (size or sha256)")
    return dict(manifest, path=path, directory=directory, snapshot_size=info.plaintext_size)
