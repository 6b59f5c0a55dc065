"""Fixtures of the security suites: the unit tests' swtpm instances and join harness, and the attack ledger."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import support  # noqa: E402

_unit = support.unit_conftest()
manufactured_tpms = _unit.manufactured_tpms
swtpm = _unit.swtpm
other_swtpm = _unit.other_swtpm
foreign_swtpm = _unit.foreign_swtpm
start_swtpm = _unit.start_swtpm
kube_control_plane = _unit.kube_control_plane
containerd = _unit.containerd

from join_harness import JoinLab  # noqa: E402


@pytest.fixture
def join_lab(tmp_path, swtpm):  # pylint: disable=redefined-outer-name
    lab = JoinLab(tmp_path, swtpm)
    yield lab
    lab.close()


class AttackLedger:
    """What each attack got: the test records it before asserting, the summary line adds it up (and the flood's figures)."""

    def __init__(self):
        self.secrets: dict[str, int] = {}
        self.outcomes: dict[str, bool] = {}
        self.flood: dict = {}


_LEDGER = AttackLedger()


class Attack:
    def __init__(self, nodeid: str):
        self.nodeid = nodeid
        _LEDGER.secrets[nodeid] = 0

    def obtained(self, what: str, count: int) -> None:
        """Record ``count`` secrets the attacker got (tokens minted for it, payloads it decrypted); the test asserts zero."""
        _LEDGER.secrets[self.nodeid] += count
        assert count == 0, f"the attacker obtained {count} {what}"


@pytest.fixture
def attack(request):
    return Attack(request.node.nodeid)


@pytest.fixture
def flood_figures():
    """Where the flood attack leaves its figures for the summary."""
    return _LEDGER.flood


def pytest_runtest_logreport(report):
    if report.when == "call" and report.nodeid in _LEDGER.secrets:
        _LEDGER.outcomes[report.nodeid] = report.passed


def pytest_terminal_summary(terminalreporter):
    if not _LEDGER.secrets:
        return
    refused = sum(_LEDGER.outcomes.values())
    terminalreporter.write_line(
        f"protocol attacks: {len(_LEDGER.secrets)} attacks, {refused} refused, "
        f"{sum(_LEDGER.secrets.values())} secrets obtained"
    )
    flood = dict(_LEDGER.flood)
    for source, figures in sorted(flood.pop("connections", {}).items()):
        terminalreporter.write_line(
            f"connection flood: {figures['connects']} connects from {source} in {figures['seconds']} s "
            f"(refused: {figures['refused']}); {figures['joins']} genuine joins meanwhile, "
            f"p50 {figures['p50_ms']} ms, p99 {figures['p99_ms']} ms"
        )
    for name, figures in sorted(flood.pop("step1", {}).items()):
        terminalreporter.write_line(f"{name}: {figures}")
    if flood:
        terminalreporter.write_line(
            f"flood: {flood['calls']} GetNonce from one client absorbed at {flood['per_second']}/s "
            f"({flood['seconds']} s; {flood['outcomes']}); {flood['joins']}/20 genuine joins meanwhile, "
            f"p50 {flood['p50_ms']} ms, max {flood['max_ms']} ms"
        )
