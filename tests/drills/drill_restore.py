# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""etcd lost: snapshot (backup.yml), delete 200 ConfigMaps, refuse a flipped, a truncated and another cluster's snapshot
with nothing changed, wipe etcd's data on every control plane, restore.yml, and count the 200 back; a Secret is held
encrypted at rest (aescbc, the derived key) by every member before the backup and after the restore."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import secrets
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
# The format-2 header (123 bytes and the member's name) and the first chunk's stored nonce (12 bytes) come before its
# ciphertext; a lab node's name is short, so the flip lands in the first chunk's ciphertext.
FIRST_CHUNK_CIPHERTEXT = 123 + 32 + 12
# A Secret with a value known here: etcd holds it encrypted (the API servers' EncryptionConfiguration), before the
# backup and after the restore, on every member.
SECRET = "drill-at-rest"
AT_REST_PREFIX = b"k8s:enc:aescbc:v1:key-etcdSecrets"
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


def _secret(marker: str) -> bytes:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET, "namespace": NAMESPACE},
            "stringData": {"password": marker},
        }
    ).encode()


def _check_at_rest(lab, marker: str) -> None:
    """Every member holds the Secret behind the aescbc prefix without its value, and the API reads the value back."""
    for node in lab.control_planes():
        stored = lab.ssh(node, f"{ETCDCTL} get /registry/secrets/{NAMESPACE}/{SECRET} --print-value-only").stdout
        assert stored.startswith(AT_REST_PREFIX), f"{node}: etcd holds the Secret as {stored[:40]!r}"
        assert marker.encode() not in stored, f"{node}: etcd holds the Secret's value in plaintext"
    read = lab.ssh(
        lab.control_planes()[0],
        "kubectl --kubeconfig=/etc/kubernetes/admin.conf get secret -n "
        f"{NAMESPACE} {SECRET} -o jsonpath='{{.data.password}}'",
    ).stdout
    assert base64.b64decode(read) == marker.encode(), "the API does not read the Secret back"


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
    """etcd's data lost: stop the member, delete what its data directory holds (the directory stays, as the state
    disk's mount point does), start it again (it comes up empty or fails)."""
    lab.ssh(
        node,
        "set -e; mv /etc/kubernetes/manifests/etcd.yaml /root/etcd.yaml.drill; "
        "for i in $(seq 60); do ss -ltn | grep -q ':2379 ' || break; sleep 1; done; "
        "! ss -ltn | grep -q ':2379 '; find /var/lib/etcd -mindepth 1 -delete; "
        "mv /root/etcd.yaml.drill /etc/kubernetes/manifests/etcd.yaml",
    )


def _data_dir(lab, node: str) -> tuple[str, list[str]]:
    """The etcd data directory's inode (a mount point on a real control plane: it must never move) and the entries
    beside it and under it that a restore may leave."""
    inode, *entries = (
        lab.ssh(node, "stat -c %i /var/lib/etcd; ls -d /var/lib/etcd.* /var/lib/etcd/* 2>/dev/null || true")
        .stdout.decode()
        .split()
    )
    return inode, entries


def drill(lab) -> dict:
    first = lab.control_planes()[0]
    backups = lab.inventory.parent / "backups"
    lab.ssh(first, "kubectl --kubeconfig=/etc/kubernetes/admin.conf apply -f - >/dev/null", stdin=_configmaps(COUNT))
    assert _count(lab) == COUNT, f"created {_count(lab)} of {COUNT} ConfigMaps"
    marker = "drill-" + secrets.token_hex(16)
    lab.ssh(first, "kubectl --kubeconfig=/etc/kubernetes/admin.conf apply -f - >/dev/null", stdin=_secret(marker))
    _check_at_rest(lab, marker)

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
    data_dirs = {node: _data_dir(lab, node)[0] for node in lab.control_planes()}

    started = time.monotonic()
    lab.playbook("restore", "-e", f"confirm_restore={cluster_id}")
    restore_seconds = time.monotonic() - started
    ready_seconds = lab.wait_ready()
    restored = _count(lab)
    assert restored == COUNT, f"{restored}/{COUNT} ConfigMaps after the restore"
    _check_at_rest(lab, marker)
    for node, inode in data_dirs.items():
        # Restored under the data directory and swapped in entry by entry: nothing beside it on the root disk, the
        # directory (the state disk's mount point on a real node) never renamed, the old member's data kept under it.
        after, entries = _data_dir(lab, node)
        assert after == inode, (
            f"{node}: /var/lib/etcd was replaced (inode {inode} -> {after}): a mount point would not move"
        )
        assert not [entry for entry in entries if entry.startswith("/var/lib/etcd.")], f"{node}: beside it: {entries}"
        kept = [entry.rsplit("/", 1)[1] for entry in entries if entry.startswith("/var/lib/etcd/")]
        assert "member" in kept and any(name.startswith("before-restore-") for name in kept), f"{node}: {kept}"
        assert not [name for name in kept if name.startswith("restored-")], (
            f"{node}: a restore directory is left: {kept}"
        )
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
