"""Controller-side actions of the registry and of secret hygiene: node_enrolment merges under a lock, tpm_evidence
censors a credential activation's result, seal_init_secrets uses its nonce through the default ledger."""

from __future__ import annotations

import json
import os
import threading
from types import SimpleNamespace

from ansible.parsing.dataloader import DataLoader

from ansible_collections.confidential.kubernetes.plugins.module_utils._join.registry import (
    Enrolment,
    merge_enrolment,
    parse_enrolment,
)

DISK = "0d3b1c4e-9f2a-4e57-8a61-2f4c9b7d5e13"


def _action(module_class, args: dict, check_mode: bool = False, action: str = "confidential.kubernetes.node_enrolment"):
    task = SimpleNamespace(args=args, async_val=0, check_mode=check_mode, diff=False, action=action, no_log=False)
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir=None), has_native_async=False)
    return module_class(task, connection, None, DataLoader(), None, None)


def _enrol(path, nodes, check_mode=False):
    from ansible_collections.confidential.kubernetes.plugins.action.node_enrolment import ActionModule

    return _action(ActionModule, {"enrolment_file": str(path), "nodes": nodes}, check_mode).run(task_vars={})


def test_enrolment_merges_replaces_by_ek_or_name_and_writes_0600(tmp_path):
    path = tmp_path / "secrets" / "node-enrolment.json"
    first = _enrol(
        path,
        [
            {"ek": "a" * 64, "node_name": "cp-0", "control_plane": True, "disk_uuid": DISK.upper()},
            {"ek": "b" * 64, "node_name": "worker-1"},
        ],
    )
    assert first["changed"] and os.stat(path).st_mode & 0o777 == 0o600
    assert first["nodes"]["cp-0"] == {"ek": "a" * 64, "control_plane": True, "disk_uuid": DISK}
    # A re-run with the same nodes changes nothing for a node with its disk; worker-1 (no disk yet) gets a new enrolment ID.
    assert not _enrol(path, [{"ek": "a" * 64, "node_name": "cp-0", "control_plane": True, "disk_uuid": DISK}])[
        "changed"
    ]
    before = parse_enrolment(path.read_bytes(), "x").by_ek["b" * 64].enrolment_id
    assert _enrol(path, [{"ek": "b" * 64, "node_name": "worker-1"}])["changed"]
    assert parse_enrolment(path.read_bytes(), "x").by_ek["b" * 64].enrolment_id not in ("", before)
    # worker-1's TPM was replaced: the new EK takes the name, the old entry goes.
    replaced = _enrol(path, [{"ek": "c" * 64, "node_name": "worker-1"}])
    assert sorted(replaced["nodes"]) == ["cp-0", "worker-1"] and replaced["nodes"]["worker-1"]["ek"] == "c" * 64


def test_enrolment_in_check_mode_writes_nothing_and_bad_input_changes_nothing(tmp_path):
    path = tmp_path / "node-enrolment.json"
    assert _enrol(path, [{"ek": "a" * 64, "node_name": "cp-0"}], check_mode=True)["changed"] and not path.exists()
    _enrol(path, [{"ek": "a" * 64, "node_name": "cp-0"}])
    content = path.read_bytes()
    failed = _enrol(path, [{"ek": "a" * 64, "node_name": "Not_A_Name"}])
    assert failed["failed"] and "not a DNS-1123" in failed["msg"] and "nothing was changed" in failed["msg"]
    assert path.read_bytes() == content


def test_concurrent_enrolments_lose_no_node(tmp_path):
    path = str(tmp_path / "node-enrolment.json")
    nodes = [Enrolment(f"{number:064x}", f"worker-{number}", False, None) for number in range(1, 21)]
    threads = [threading.Thread(target=merge_enrolment, args=(path, [node])) for node in nodes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(e.node_name for e in parse_enrolment(open(path, "rb").read(), path).by_ek.values()) == sorted(
        n.node_name for n in nodes
    )


def test_tpm_evidence_censors_a_credential_activation_only(monkeypatch):
    from ansible_collections.confidential.kubernetes.plugins.action.tpm_evidence import ActionModule

    answers = iter([{"changed": False, "activated_secret": "c2VjcmV0"}, {"changed": False, "evidence": {"version": 1}}])
    action = _action(ActionModule, {}, action="confidential.kubernetes.tpm_evidence")
    monkeypatch.setattr(action, "_execute_module", lambda **kwargs: next(answers))
    monkeypatch.setattr(action, "_remove_tmp_path", lambda path: None)
    activated = action.run(task_vars={})
    assert activated["_ansible_no_log"] is True and activated["activated_secret"] == "c2VjcmV0"
    assert "_ansible_no_log" not in action.run(task_vars={})


def test_seal_init_secrets_uses_the_default_ledger(tmp_path, monkeypatch):
    from ansible_collections.confidential.kubernetes.plugins.action import seal_init_secrets
    from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import controller

    monkeypatch.setenv("HOME", str(tmp_path))
    nonce = controller.nonce_store(None).issue()
    policy = tmp_path / "policy.json"
    policy.write_text(
        json.dumps(
            {"version": 1, "hash_algorithm": "sha256", "ak_trust": "pcrs-only", "pcrs": {"4": {"allowed": ["00" * 32]}}}
        )
    )
    args = {
        "evidence": "{}",
        "nonce": nonce.hex(),
        "policy": str(policy),
        "secrets_file": str(tmp_path / "cluster-secrets.json"),
    }
    first = _action(seal_init_secrets.ActionModule, args, action="confidential.kubernetes.seal_init_secrets").run(
        task_vars={}
    )
    again = _action(seal_init_secrets.ActionModule, args, action="confidential.kubernetes.seal_init_secrets").run(
        task_vars={}
    )
    # The first use consumed the nonce (its evidence is malformed); the second is a replay, whatever it carries.
    assert (first["reason"], again["reason"]) == ("malformed", "nonce-reused")
    assert not (tmp_path / "cluster-secrets.json").exists()


def test_unenrolled_nodes_are_removed_and_the_others_stay(tmp_path):
    path = tmp_path / "node-enrolment.json"
    _enrol(
        path,
        [
            {"ek": "a" * 64, "node_name": "cp-0", "control_plane": True, "disk_uuid": DISK},
            {"ek": "b" * 64, "node_name": "worker-1"},
        ],
    )
    from ansible_collections.confidential.kubernetes.plugins.action.node_enrolment import ActionModule

    removed = _action(ActionModule, {"enrolment_file": str(path), "absent": ["worker-1"]}).run(task_vars={})
    assert removed["changed"] and sorted(removed["nodes"]) == ["cp-0"]
    assert not _action(ActionModule, {"enrolment_file": str(path), "absent": ["worker-1"]}).run(task_vars={})["changed"]


def test_a_disk_bound_to_another_ek_is_refused_naming_both_and_nothing_changes(tmp_path):
    """Issue 25: the enrolment used to outrank the disk bindings; a new host enrolled with a bound disk got its key."""
    path = tmp_path / "node-enrolment.json"
    _enrol(
        path,
        [
            {"ek": "a" * 64, "node_name": "cp-0", "control_plane": True, "disk_uuid": DISK},
            {"ek": "b" * 64, "node_name": "worker-1"},
        ],
    )
    content = path.read_bytes()
    other = "5a0c7e21-3b9d-4f16-9c2e-7d81a4f0b362"
    mirror = json.dumps(
        {
            "version": 1,
            "bindings": [
                {
                    "disk_uuid": other,
                    "ek": "b" * 64,
                    "node_name": "worker-1",
                    "enrolment_id": "",
                    "bound_at": "2026-01-01T00:00:00Z",
                }
            ],
        }
    )
    from ansible_collections.confidential.kubernetes.plugins.action.node_enrolment import ActionModule

    # worker-1's disk is bound in the cluster's API (the services' mirrors), cp-0's in the enrolment file; a new host
    # (another EK) asks for each, once under a new name, once taking the holder's name.
    for node in (
        {"ek": "c" * 64, "node_name": "worker-9", "disk_uuid": other},
        {"ek": "c" * 64, "node_name": "worker-1", "disk_uuid": other},
        {"ek": "c" * 64, "node_name": "cp-0", "control_plane": True, "disk_uuid": DISK},
    ):
        failed = _action(ActionModule, {"enrolment_file": str(path), "nodes": [node], "disk_bindings": [mirror]}).run(
            task_vars={}
        )
        holder = "worker-1 (EK bbbb" if node["disk_uuid"] == other else "cp-0 (EK aaaa"
        assert (
            failed.get("failed") and holder in failed["msg"] and f"node {node['node_name']} (EK cccc" in failed["msg"]
        ), failed
        assert "nothing was changed" in failed["msg"] and path.read_bytes() == content
    # The holder itself, enrolled again with its bound disk, is fine.
    assert (
        not _action(
            ActionModule,
            {
                "enrolment_file": str(path),
                "disk_bindings": [mirror],
                "nodes": [{"ek": "b" * 64, "node_name": "worker-1", "disk_uuid": other}],
            },
        )
        .run(task_vars={})
        .get("failed")
    )
