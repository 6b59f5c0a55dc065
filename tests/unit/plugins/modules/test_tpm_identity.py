"""tpm_identity against a real swtpm: the EK identity, and the state disk's LUKS UUID read in the same call."""

from __future__ import annotations

from ansible_collections.confidential.kubernetes.plugins.modules import tpm_identity
from module_runner import module_outcome, run_main  # noqa: F401  # pylint: disable=unused-import


def run_module(args: dict) -> dict:
    return run_main(tpm_identity.main, args)


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
