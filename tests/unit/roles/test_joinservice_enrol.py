"""The joinservice role's enrol entry point, run by ansible-playbook against this host (local connection) with two real
swtpms and a real LUKS state disk on a file: each host's EK, name, role and disk end up in the enrolment file."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.issuer import Tpm
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.registry import parse_enrolment
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.request import ek_identity

DISK = "0d3b1c4e-9f2a-4e57-8a61-2f4c9b7d5e13"


def _identity(tcti: str) -> str:
    with Tpm(tcti) as tpm:
        certificate, handle, ek_public = tpm.endorsement_key()
        tpm.flush(handle)
    return ek_identity(ek_public)


def _enrol_play(entry: str = "enrol") -> dict:
    return {
        "name": f"Enrol ({entry})",
        "hosts": "cluster",
        "gather_facts": False,
        "tasks": [
            {
                "name": "Enrol the node",
                "ansible.builtin.include_role": {"name": "confidential.kubernetes.joinservice", "tasks_from": entry},
            }
        ],
    }


def _playbook(tmp_path, swtpm, other_swtpm, plays: list | None = None) -> subprocess.CompletedProcess:
    disk = tmp_path / "state-disk.img"
    with open(disk, "wb") as handle:
        handle.truncate(32 * 1024 * 1024)
    subprocess.run(
        [
            "cryptsetup",
            "luksFormat",
            "--batch-mode",
            "--type",
            "luks2",
            "--pbkdf-memory",
            "32768",
            "--pbkdf-force-iterations",
            "4",
            "--uuid",
            DISK,
            "--key-file=-",
            str(disk),
        ],
        input=b"k" * 32,
        check=True,
        capture_output=True,
    )
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {
        "all": {
            "children": {
                "cluster": {
                    "children": {
                        "control_plane": {
                            "hosts": {
                                "cp-0": dict(
                                    host,
                                    confidential_tpm_tcti=swtpm.tcti,
                                    confidential_state_disk={"device": str(disk)},
                                )
                            }
                        },
                        "workers": {
                            "hosts": {
                                "worker-0": dict(
                                    host,
                                    confidential_tpm_tcti=other_swtpm.tcti,
                                    confidential_state_disk={"device": str(tmp_path / "blank.img")},
                                )
                            }
                        },
                    }
                }
            }
        }
    }
    (tmp_path / "blank.img").write_bytes(bytes(1024 * 1024))
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "enrol.yml").write_text(yaml.safe_dump(plays or [_enrol_play()]))
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=":".join(p for p in sys.path if p.endswith("collections")),
        ANSIBLE_FORCE_COLOR="0",
    )
    return subprocess.run(
        [
            os.path.join(os.path.dirname(sys.executable), "ansible-playbook"),
            "-i",
            str(tmp_path / "inventory.yml"),
            str(tmp_path / "enrol.yml"),
            "-e",
            f"joinservice_enrolment_file={tmp_path}/secrets/node-enrolment.json",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


def test_enrol_records_each_hosts_ek_name_role_and_disk(tmp_path, swtpm, other_swtpm):
    result = _playbook(tmp_path, swtpm, other_swtpm)
    assert result.returncode == 0, result.stdout + result.stderr
    enrolment_file = tmp_path / "secrets" / "node-enrolment.json"
    assert os.stat(enrolment_file).st_mode & 0o777 == 0o600
    enrolled = parse_enrolment(enrolment_file.read_bytes(), "test").by_name
    control_plane, worker = enrolled["cp-0"], enrolled["worker-0"]
    assert (control_plane.ek, control_plane.control_plane, control_plane.disk_uuid) == (
        _identity(swtpm.tcti),
        True,
        DISK,
    )
    assert control_plane.ek_certificate is not None
    # The worker's disk is not LUKS yet: no disk, a fresh enrolment ID (bindings of an earlier life no longer count).
    assert (worker.ek, worker.control_plane, worker.disk_uuid) == (
        _identity(other_swtpm.tcti),
        False,
        None,
    ) and worker.enrolment_id
    # A re-run changes nothing for the control plane; the worker, not joined yet, is enrolled afresh.
    again = _playbook(tmp_path, swtpm, other_swtpm)
    assert again.returncode == 0, again.stdout
    after = parse_enrolment(enrolment_file.read_bytes(), "test").by_name
    assert after["cp-0"] == control_plane and after["worker-0"].enrolment_id != worker.enrolment_id
    assert json.loads(enrolment_file.read_text())["version"] == 1


def test_a_host_read_earlier_in_the_run_with_its_luks_disk_is_not_read_again(tmp_path, swtpm, other_swtpm):
    """site.yml's order: the init play records the first control plane (main entry point, its disk LUKS by then) and
    the enrol play reuses that record instead of reading the TPM again. A host read without a LUKS disk is read every
    time: a control plane that joined in between has one now, and a record without it would enrol it afresh."""
    result = _playbook(
        tmp_path, swtpm, other_swtpm, [_enrol_play("enrol_record"), _enrol_play(), _enrol_play("enrol_record")]
    )
    assert result.returncode == 0, result.stdout + result.stderr
    reads = [
        block
        for block in result.stdout.split("TASK [")[1:]
        if block.startswith("confidential.kubernetes.joinservice : Read the TPM's identity")
    ]
    assert [("ok: [cp-0]" in block, "skipping: [cp-0]" in block, "ok: [worker-0]" in block) for block in reads] == [
        (True, False, True),
        (False, True, True),
        (False, True, True),
    ], result.stdout
    enrolled = parse_enrolment((tmp_path / "secrets" / "node-enrolment.json").read_bytes(), "test").by_name
    assert (enrolled["cp-0"].ek, enrolled["cp-0"].disk_uuid) == (_identity(swtpm.tcti), DISK)
    assert (enrolled["worker-0"].ek, enrolled["worker-0"].disk_uuid) == (_identity(other_swtpm.tcti), None)


def test_a_node_that_joined_since_its_read_keeps_its_enrolment(tmp_path, swtpm, other_swtpm):
    """The enrol play reads a fresh control plane without a disk; it joins (its disk becomes LUKS, bound by the join
    service under its enrolment ID); the main entry point then reads it again and the enrolment keeps that ID. Reusing
    the record read before the join would enrol it afresh and orphan the disk binding."""
    blank = tmp_path / "blank.img"
    joined = {
        "name": "The worker's disk becomes LUKS, as in its join",
        "hosts": "worker-0",
        "gather_facts": False,
        "tasks": [
            {
                "name": "Format",
                "ansible.builtin.command": {
                    "argv": [
                        "cryptsetup",
                        "luksFormat",
                        "--batch-mode",
                        "--type",
                        "luks2",
                        "--pbkdf-memory",
                        "32768",
                        "--pbkdf-force-iterations",
                        "4",
                        "--key-file=-",
                        str(blank),
                    ],
                    "stdin": "k" * 32,
                },
            }
        ],
    }
    result = _playbook(tmp_path, swtpm, other_swtpm, [_enrol_play(), joined, _enrol_play("enrol_record")])
    assert result.returncode == 0, result.stdout + result.stderr
    enrolment = tmp_path / "secrets" / "node-enrolment.json"
    last_merge = result.stdout.split("Enrol the hosts of this batch in the controller's enrolment file")[-1]
    assert "ok: [cp-0]" in last_merge.split("TASK [")[0], last_merge  # the merge changed nothing: same enrolment ID
    assert parse_enrolment(enrolment.read_bytes(), "test").by_name["worker-0"].disk_uuid is None
