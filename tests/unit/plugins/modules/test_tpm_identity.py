"""tpm_identity against a real swtpm: the EK identity, and the state disk's LUKS UUID read in the same call."""
from __future__ import annotations

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from ansible_collections.confidential.kubernetes.plugins.modules import tpm_identity


class Outcome(Exception):
    pass


@pytest.fixture(autouse=True)
def outcome(monkeypatch):
    """exit_json/fail_json raise the result instead of printing it and exiting."""
    def exit_json(module, **kwargs):
        raise Outcome(dict(kwargs, failed=False))

    def fail_json(module, msg, **kwargs):
        raise Outcome(dict(kwargs, msg=msg, failed=True))

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)


def run_module(args: dict) -> dict:
    with patch_module_args(args), pytest.raises(Outcome) as raised:
        tpm_identity.main()
    return raised.value.args[0]


def test_no_disk_no_uuid_and_a_blank_disk_is_no_luks(swtpm, tmp_path):
    plain = run_module({"tcti": swtpm.tcti})
    assert not plain["failed"] and len(plain["ek"]) == 64 and plain["disk_uuid"] is None
    blank = tmp_path / "blank.img"
    blank.write_bytes(bytes(1024 * 1024))
    with_disk = run_module({"tcti": swtpm.tcti, "state_disk": str(blank)})
    assert not with_disk["failed"] and with_disk["ek"] == plain["ek"] and with_disk["disk_uuid"] is None


def test_a_missing_disk_fails_naming_it(swtpm, tmp_path):
    missing = tmp_path / "no-such-disk.img"
    result = run_module({"tcti": swtpm.tcti, "state_disk": str(missing)})
    assert result["failed"] and str(missing) in result["msg"] and "luksUUID" in result["msg"]
