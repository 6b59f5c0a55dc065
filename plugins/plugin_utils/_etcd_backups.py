# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's directory of encrypted etcd snapshots: ``<backup dir>/etcd-<UTC time>/`` each holding
``etcd.cksnap`` and ``manifest.json`` (the manifest and its authentication: ``module_utils/_backup/manifest.py``).
Storing checks what was fetched and keeps the last N of this cluster's snapshots; choosing one for a restore checks
it whole and refuses one older than the newest without ``allow_older``, before any node is touched."""

from __future__ import annotations

import os

from ansible_collections.confidential.kubernetes.plugins.module_utils._backup import manifest, snapshot
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import RootSecrets
from ansible_collections.confidential.kubernetes.plugins.module_utils._files import file_sha256

BackupError = manifest.ManifestError


def _key(secrets: RootSecrets) -> bytes:
    return snapshot.backup_key(secrets.master_key, secrets.master_salt)


def store(backup_dir: str, fetched: str, reported: dict, keep: int, secrets: RootSecrets) -> dict:
    """File the ciphertext fetched to ``fetched`` as ``<backup_dir>/<its name>/etcd.cksnap``: it must be the file the
    node reported (size, SHA-256) and authenticate with this cluster's key, and the manifest the node reported must be
    what its header says. Then ``manifest.json`` is written and all but the newest ``keep`` authenticated snapshots of
    this cluster are removed. A refused file stays where it was fetched, and nothing is filed."""
    if keep < 1:
        raise BackupError(f"keep must be at least 1, got {keep}")
    node = manifest.Manifest.from_document(reported, "the manifest the node reported")
    manifest.check_name(node.name)
    if os.path.islink(fetched) or not os.path.isfile(fetched):
        raise BackupError(f"{fetched} was not fetched (or is not a regular file)")
    actual = file_sha256(fetched)
    if actual != node.sha256 or os.path.getsize(fetched) != node.size:
        raise BackupError(
            f"{fetched}: the fetched file (sha256 {actual}) is not the one the node wrote (sha256 {node.sha256})"
        )
    cluster = secrets.cluster_id()
    genuine = manifest.from_info(snapshot.verify_file(_key(secrets), cluster, fetched), node.size, actual)
    if genuine != node:
        raise BackupError(f"{fetched}: the node's manifest is not what the snapshot's authenticated header says")
    directory = os.path.join(backup_dir, genuine.name)
    os.mkdir(directory, 0o700)
    path = os.path.join(directory, manifest.SNAPSHOT_FILE)
    os.chmod(fetched, 0o600)
    os.rename(fetched, path)
    manifest.write(directory, genuine)
    kept = manifest.prune(backup_dir, keep, _key(secrets), cluster, genuine.name)
    return dict(kept, manifest=genuine.to_document(), path=path)


def _directory(backup_dir: str, wanted: str) -> str:
    """The directory ``wanted`` names: an ``etcd-<time>`` in ``backup_dir``, or a path to such a directory (or to
    its ``etcd.cksnap``)."""
    if os.sep not in wanted:
        manifest.check_name(wanted)
        return os.path.join(backup_dir, wanted)
    directory = os.path.dirname(wanted) if os.path.isfile(wanted) else wanted
    manifest.check_name(os.path.basename(os.path.normpath(directory)))
    return directory


def select(backup_dir: str, wanted: str, secrets: RootSecrets, allow_older: bool = False) -> dict:
    """The snapshot a restore uses, checked whole: ``latest`` is the newest authenticated snapshot of this cluster,
    refused while a newer-named directory does not authenticate (anything planted is never chosen, and a damaged
    newest never makes an older one "latest"); one older than the newest is refused unless ``allow_older``.

    Raises BackupError (ManifestError) or snapshot.SnapshotError (a subclass per fault). Writes nothing.
    """
    key, cluster = _key(secrets), secrets.cluster_id()
    found = manifest.listing(backup_dir, key, cluster)
    newest = found.newest
    if wanted == "latest":
        if newest is None:
            if found.format1:
                raise BackupError(
                    f"no authenticated snapshot in {backup_dir}; a snapshot of format 1 (written before the manifest "
                    f"was authenticated) restores only by name, with restore_force_older: "
                    f"{', '.join(old.name for old in found.format1)}"
                )
            refused = "".join(f"; {name} refused: {why}" for name, why in sorted(found.unauthenticated.items()))
            raise BackupError(f"no etcd snapshot in {backup_dir} (run playbook backup.yml first){refused}")
        # A newer-named directory that does not authenticate may be the real newest snapshot, damaged: "latest"
        # never falls back past it to an older one.
        newer = {name: why for name, why in found.unauthenticated.items() if name > newest.name}
        newer.update(
            {old.name: "format 1: its time is not authenticated" for old in found.format1 if old.name > newest.name}
        )
        if newer:
            raise BackupError(
                f"the newest authenticated snapshot is {newest.name}, but newer-named "
                f"{', '.join(f'{name} ({why})' for name, why in sorted(newer.items()))} does not authenticate: "
                "remove what backup did not write, or name the snapshot to restore (restore_snapshot)"
            )
        directory = os.path.join(backup_dir, newest.name)
    else:
        directory = _directory(backup_dir, wanted)
        if not os.path.isdir(directory):
            raise BackupError(
                f"no etcd snapshot {wanted!r} (looked for {directory}); "
                f"there are: {', '.join(found_manifest.name for found_manifest in found.snapshots) or 'none'}"
            )
    chosen = manifest.read(directory, key, cluster)
    older = None
    if not chosen.authenticated:
        older = "its time and revision are not authenticated (format 1)"
    elif newest is not None and (chosen.time, chosen.revision) < (newest.time, newest.revision):
        older = f"it is older than the newest snapshot {newest.name} (etcd revision {newest.revision})"
    if older and not allow_older:
        raise BackupError(
            f"refusing {chosen.name} (taken {chosen.time}, etcd revision {chosen.revision}): {older}; restoring it "
            "loses what was written after it. Set restore_force_older=true to restore it anyway"
        )
    return dict(
        chosen.to_document(),
        path=os.path.join(directory, manifest.SNAPSHOT_FILE),
        directory=directory,
        authenticated=chosen.authenticated,
        older=older or "",
        newest=newest.name if newest else "",
        unauthenticated=found.unauthenticated,
    )
