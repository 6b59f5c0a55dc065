"""state_disk's main(): the argument spec and its glue to the logic, on real cryptsetup and a sparse file."""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import shutil
import subprocess

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.derive import state_disk_key
from ansible_collections.confidential.kubernetes.plugins.modules import state_disk

MASTER_KEY = bytes(range(0x40, 0x60))
MASTER_SALT = bytes(range(0x60, 0x80))

pytestmark = pytest.mark.skipif(
    not shutil.which("cryptsetup", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin"),
    reason="cryptsetup (cryptsetup-bin) is not installed",
)


class AnsibleExitJson(Exception):
    pass


class AnsibleFailJson(Exception):
    pass


@pytest.fixture(autouse=True)
def module_exits(monkeypatch):
    """exit_json/fail_json raise instead of printing and exiting; the module's no_log values ride along."""

    def exit_json(module, **kwargs):
        raise AnsibleExitJson({**kwargs, "__no_log_values": set(module.no_log_values)})

    def fail_json(module, msg, **kwargs):
        raise AnsibleFailJson({"msg": msg, **kwargs})

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)


def run_module(args: dict, outcome=AnsibleExitJson) -> dict:
    with patch_module_args(args), pytest.raises(outcome) as raised:
        state_disk.main()
    return raised.value.args[0]


def digest(path: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


@pytest.fixture
def args(tmp_path) -> dict:
    device = tmp_path / "state-disk.img"
    with open(device, "wb") as handle:
        handle.truncate(32 * 1024 * 1024)
    return {
        "device": str(device),
        "initial_key_path": str(tmp_path / "run" / "state-disk-initial.key"),
        "pbkdf_memory": 32768,
        "pbkdf_iterations": 4,
    }


def test_format_then_rekey_then_nothing_to_do(args, tmp_path):
    checked = run_module({**args, "uuid_only": True, "_ansible_check_mode": True})
    assert checked["changed"] is True and checked["uuid"] is None

    formatted = run_module({**args, "uuid_only": True})
    assert formatted["changed"] is True and formatted["keyslots"] == 1 and formatted["keyed"] is None
    key = state_disk_key(MASTER_KEY, MASTER_SALT, formatted["uuid"])
    disk_key = base64.b64encode(key).decode()

    rekeyed = run_module({**args, "disk_key": disk_key})
    assert rekeyed["changed"] is True and rekeyed["keyed"] is True and rekeyed["keyslots"] == 1
    assert rekeyed["uuid"] == formatted["uuid"] and rekeyed["mapped"] is False
    assert disk_key in rekeyed["__no_log_values"], "disk_key must be marked no_log"
    assert (
        subprocess.run(
            ["cryptsetup", "open", "--test-passphrase", "--key-file=-", args["device"]],
            input=key,
            check=False,
            capture_output=True,
        ).returncode
        == 0
    )

    key_file = tmp_path / "disk.key"
    key_file.write_bytes(key)
    key_file.chmod(0o600)
    again = run_module({**args, "disk_key_file": str(key_file)})
    assert again["changed"] is False and again["keyed"] is True


def test_disk_of_another_cluster_fails_and_is_left_alone(args):
    formatted = run_module({**args, "uuid_only": True})
    other_cluster_key = state_disk_key(bytes(32), bytes(32), formatted["uuid"])
    os.unlink(args["initial_key_path"])
    before = digest(args["device"])

    failed = run_module({**args, "disk_key": base64.b64encode(other_cluster_key).decode()}, AnsibleFailJson)

    assert "opens neither with the given disk key" in failed["msg"] and formatted["uuid"] in failed["msg"]
    assert digest(args["device"]) == before


def test_opened_without_device_mapper_fails_plainly_after_keying(args):
    formatted = run_module({**args, "uuid_only": True})
    key = state_disk_key(MASTER_KEY, MASTER_SALT, formatted["uuid"])
    if state_disk.StateDisk(args["device"]).mapping_available:
        pytest.skip("this host has device-mapper")
    failed = run_module({**args, "state": "opened", "disk_key": base64.b64encode(key).decode()}, AnsibleFailJson)
    assert failed["msg"].startswith("device-mapper is not available on this host (no ")
    assert "the state disk is formatted and keyed but cannot be mapped" in failed["msg"]
    assert failed["changed"] is True and failed["keyed"] is True and failed["mapping_available"] is False


@pytest.mark.parametrize(
    "case,expected",
    [
        ("missing device", "device {tmp}/absent.img does not exist"),
        ("directory device", "device {tmp} is a directory"),
        ("missing key file", "cannot read disk_key_file {tmp}/absent.key"),
        ("world-readable key file", "disk_key_file {tmp}/disk.key has mode 0644"),
        ("key file of 31 bytes", "disk_key_file {tmp}/disk.key holds 31 bytes"),
        ("disk_key of 16 bytes", "disk_key decodes to 16 bytes"),
        ("both keys", "parameters are mutually exclusive: disk_key|disk_key_file"),
        ("uuid_only with a key", "parameters are mutually exclusive: uuid_only|disk_key"),
        ("no key", "state=formatted needs the disk key"),
    ],
)
def test_bad_input_is_a_clear_error_and_changes_nothing(args, tmp_path, case, expected):
    key_file = tmp_path / "disk.key"
    key_file.write_bytes(secrets.token_bytes(31 if case == "key file of 31 bytes" else 32))
    key_file.chmod(0o644 if case == "world-readable key file" else 0o600)
    disk_key = base64.b64encode(secrets.token_bytes(16 if case == "disk_key of 16 bytes" else 32)).decode()
    request = {
        "missing device": {"device": str(tmp_path / "absent.img"), "uuid_only": True},
        "directory device": {"device": str(tmp_path), "uuid_only": True},
        "missing key file": {"disk_key_file": str(tmp_path / "absent.key")},
        "world-readable key file": {"disk_key_file": str(key_file)},
        "key file of 31 bytes": {"disk_key_file": str(key_file)},
        "disk_key of 16 bytes": {"disk_key": disk_key},
        "both keys": {"disk_key": disk_key, "disk_key_file": str(key_file)},
        "uuid_only with a key": {"uuid_only": True, "disk_key": disk_key},
        "no key": {},
    }[case]
    before = digest(args["device"])

    failed = run_module({**args, **request}, AnsibleFailJson)

    assert expected.format(tmp=tmp_path) in failed["msg"]
    assert disk_key not in failed["msg"]
    assert digest(args["device"]) == before
    assert not os.path.exists(args["initial_key_path"])
