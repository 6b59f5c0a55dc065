"""The boot-time join unit must reach the TPM, the state disk and /dev/mapper/control on a real host: no option of it
may turn on systemd's device allow-list (the lab's swtpm socket would not show the denial)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
UNIT = REPO / "roles" / "join" / "templates" / "confidential-join.service.j2"
# systemd.exec(5): ProtectClock= implies DeviceAllow=char-rtc r and PrivateDevices= a private /dev; any DeviceAllow=
# with DevicePolicy=auto closes every device not listed; DevicePolicy=closed or strict closes them outright.
CLOSING_OPTIONS = re.compile(
    r"^(ProtectClock|PrivateDevices|DeviceAllow|DevicePolicy)=\s*(?!no\b|false\b|auto\b)", re.M
)


def test_join_unit_keeps_devices_open():
    text = UNIT.read_text()
    assert "[Service]" in text
    assert CLOSING_OPTIONS.findall(text) == []


def test_attest_unit_keeps_the_tpm_open():
    """confidential-attest.service quotes with the TPM at every interval."""
    text = (UNIT.parent / "confidential-attest.service.j2").read_text()
    assert "[Service]" in text
    assert CLOSING_OPTIONS.findall(text) == []


def test_the_check_finds_a_closing_option():
    assert CLOSING_OPTIONS.findall("[Service]\nProtectClock=yes\nPrivateDevices=no\n") == ["ProtectClock"]
