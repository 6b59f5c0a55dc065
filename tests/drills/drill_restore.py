# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""etcd lost: snapshot (backup.yml), delete 200 ConfigMaps, refuse a flipped, a truncated and another cluster's snapshot
with nothing changed, wipe etcd's data on every control plane, restore.yml, and count the 200 back."""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import time
from pathlib import Path

from drilllab import collection_root

NAMESPACE = "drill-restore"
COUNT = 200
ETCDCTL = (
    "ETCDCTL_API=3 etcdctl --endpoints=https://127.0.0.1:2379 --cacert=/etc/kubernetes/pki/etcd/ca.crt "
    "--cert=/etc/kubernetes/pki/etcd/healthcheck-client.crt "
    "--key=/etc/kubernetes/pki/etcd/healthcheck-client.key --command-timeout=10s"
)
# Names that sort before any real snapshot, so that "latest" never picks them.
BAD = {
    "flipped": "etcd-20000101T000001Z",
    "truncated": "etcd-20000101T000002Z",
    "other-cluster": "etcd-20000101T000003Z",
}
# The header (61 bytes) and the first chunk's stored nonce (12 bytes) come before its ciphertext.
FIRST_CHUNK_CIPHERTEXT = 61 + 12
REFUSAL = {"flipped": "fails authentication", "truncated": "truncated", "other-cluster": "not of this cluster"}


def _configmaps(count: int) -> bytes:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    items = [namespace] + [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "data": {"n": str(n)},
            "metadata": {"name": f"cm-{n:03d}", "namespace": NAMESPACE, "labels": {"drill": "restore"}},
        }
        for n in range(count)
    ]
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items}).encode()


def _count(lab) -> int:
    """The drill's ConfigMaps (the namespace also holds kube-root-ca.crt, which the controller-manager adds)."""
    names = lab.kubectl("get", "configmaps", "-n", NAMESPACE, "-o", "name").split()
    return len([name for name in names if name.startswith("configmap/cm-")])


def _etcd_identity(lab, node: str) -> str:
    """The etcd cluster and member IDs the node's member serves, and its data directory's inode."""
    lines = lab.ssh(node, f"{ETCDCTL} endpoint status -w json; stat -c %i /var/lib/etcd/member").stdout.split()
    header = json.loads(lines[0])[0]["Status"]["header"]
    return f"{header['cluster_id']}/{header['member_id']}/{lines[-1].decode()}"


def _other_clusters_snapshot(directory: Path) -> None:
    """A genuine snapshot of another cluster: other root secrets, the collection's own format, a matching manifest."""
    sys.path.insert(0, str(collection_root().parents[2]))
    # pylint: disable=import-outside-toplevel
    from ansible_collections.confidential.kubernetes.plugins.module_utils._backup import snapshot
    from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import RootSecrets

    other = RootSecrets(os.urandom(32), os.urandom(32), os.urandom(32))
    plaintext = os.urandom(100_000)
    sink = io.BytesIO()
    snapshot.encrypt(
        snapshot.backup_key(other.master_key, other.master_salt),
        other.cluster_id(),
        io.BytesIO(plaintext),
        len(plaintext),
        sink,
    )
    (directory / "etcd.cksnap").write_bytes(sink.getvalue())
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest.update(
        cluster_id=other.cluster_id().hex(),
        size=len(sink.getvalue()),
        sha256=hashlib.sha256(sink.getvalue()).hexdigest(),
    )
    (directory / "manifest.json").write_text(json.dumps(manifest))


def _make_bad_snapshots(good: Path) -> None:
    data = (good / "etcd.cksnap").read_bytes()
    for kind, name in BAD.items():
        directory = good.parent / name
        directory.mkdir(mode=0o700)
        (directory / "manifest.json").write_text((good / "manifest.json").read_text())
        if kind == "flipped":
            inside = FIRST_CHUNK_CIPHERTEXT + 100
            (directory / "etcd.cksnap").write_bytes(data[:inside] + bytes([data[inside] ^ 0x01]) + data[inside + 1 :])
        elif kind == "truncated":
            (directory / "etcd.cksnap").write_bytes(data[: len(data) - 4096])
        else:
            _other_clusters_snapshot(directory)


def _wipe_etcd(lab, node: str) -> None:
    """etcd's data lost: stop the member, delete its data directory, start it again (it comes up empty or fails)."""
    lab.ssh(
        node,
        "set -e; mv /etc/kubernetes/manifests/etcd.yaml /root/etcd.yaml.drill; "
        "for i in $(seq 60); do ss -ltn | grep -q ':2379 ' || break; sleep 1; done; "
        "! ss -ltn | grep -q ':2379 '; rm -rf /var/lib/etcd; "
        "mv /root/etcd.yaml.drill /etc/kubernetes/manifests/etcd.yaml",
    )


def drill(lab) -> dict:
    first = lab.control_planes()[0]
    backups = lab.inventory.parent / "backups"
    lab.ssh(first, "kubectl --kubeconfig=/etc/kubernetes/admin.conf apply -f - >/dev/null", stdin=_configmaps(COUNT))
    assert _count(lab) == COUNT, f"created {_count(lab)} of {COUNT} ConfigMaps"

    started = time.monotonic()
    lab.playbook("backup")
    backup_seconds = time.monotonic() - started
    good = backups / sorted(p.name for p in backups.iterdir() if p.name.startswith("etcd-2"))[-1]
    manifest = json.loads((good / "manifest.json").read_text())
    cluster_id = manifest["cluster_id"]
    assert manifest["total_keys"] > COUNT, f"the snapshot holds {manifest['total_keys']} keys, fewer than {COUNT}"
    lab.log(f"snapshot {good.name}: revision {manifest['revision']}, {manifest['size']} bytes, {backup_seconds:.1f} s")

    lab.kubectl("delete", "configmaps", "-l", "drill=restore", "-n", NAMESPACE)
    assert _count(lab) == 0, "the ConfigMaps were not deleted"

    _make_bad_snapshots(good)
    identities = {node: _etcd_identity(lab, node) for node in lab.control_planes()}
    try:
        for kind, name in BAD.items():
            run = lab.playbook(
                "restore", "-e", f"confirm_restore={cluster_id}", "-e", f"restore_snapshot={name}", check=False
            )
            assert run.rc != 0, f"restore.yml accepted the {kind} snapshot"
            assert REFUSAL[kind] in run.output, (
                f"{kind} snapshot: refusal does not say {REFUSAL[kind]!r}:\n{run.last_failure()}"
            )
            assert run.changed == 0, f"{kind} snapshot: restore.yml changed {run.changed} things before refusing"
            after = {node: _etcd_identity(lab, node) for node in lab.control_planes()}
            assert after == identities, f"{kind} snapshot: etcd changed although refused: {identities} -> {after}"
            assert _count(lab) == 0, f"{kind} snapshot: ConfigMaps came back although refused"
    finally:
        for name in BAD.values():
            for path in sorted((backups / name).glob("*")):
                path.unlink()
            (backups / name).rmdir()

    unconfirmed = lab.playbook("restore", check=False)
    assert unconfirmed.rc != 0 and "confirm_restore=" in unconfirmed.output, "restore.yml ran without confirmation"

    for node in lab.control_planes():
        _wipe_etcd(lab, node)
    lab.log("etcd data wiped on every control plane")

    started = time.monotonic()
    lab.playbook("restore", "-e", f"confirm_restore={cluster_id}")
    restore_seconds = time.monotonic() - started
    ready_seconds = lab.wait_ready()
    restored = _count(lab)
    assert restored == COUNT, f"{restored}/{COUNT} ConfigMaps after the restore"
    members = json.loads(lab.ssh(first, f"{ETCDCTL} member list -w json").stdout)["members"]
    assert sorted(m["name"] for m in members) == sorted(lab.control_planes()), f"etcd members {members}"
    lab.playbook("verify")
    lab.kubectl("delete", "namespace", NAMESPACE, "--wait=false")
    return {
        "configmaps_restored": f"{restored}/{COUNT}",
        "snapshot_fetch_seconds": round(backup_seconds, 1),
        "snapshot_bytes": manifest["size"],
        "etcd_keys": manifest["total_keys"],
        "restore_seconds": round(restore_seconds, 1),
        "nodes_ready_after_s": round(ready_seconds, 1),
        "refused": ",".join(BAD),
    }
