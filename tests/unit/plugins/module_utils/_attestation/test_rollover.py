# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Measurement rollover: the policy merge and retire (policy.py), and the steps on a policy file (rollover.py),
including the measurement_rollover module run in-process."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import (
    MeasurementPolicy,
    PcrRule,
    PolicyError,
    add_golden_values,
    load_policy,
    pcr_values_from_document,
    retire_values,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.rollover import (
    PolicyRollover,
    RolloverError,
    policy_text,
)
from ansible_collections.confidential.kubernetes.plugins.modules import measurement_rollover
from tests.unit.plugins.modules.module_runner import (  # noqa: F401  # pylint: disable=unused-import
    module_outcome,
    run_main,
)


def digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


FIRMWARE = digest("firmware")
KERNEL = digest("kernel 6.1")
CMDLINE_OLD = digest("console=ttyS0")
CMDLINE_NEW = digest("console=ttyS0 lockdown=integrity")
CMDLINE_HAND = digest("hand-added during an earlier roll-out")
IMAGE_OLD = digest("image 1")
IMAGE_NEW = digest("image 2")


def policy(rules: dict[int, tuple[bytes, ...]], warn_only: tuple[int, ...] = (), ak_trust: str = "ek-certificate"):
    return MeasurementPolicy("sha256", {i: PcrRule(i, v, i in warn_only) for i, v in rules.items()}, ak_trust)


OLD = policy({4: (KERNEL,), 8: (CMDLINE_OLD,), 9: (IMAGE_OLD,)}, warn_only=(9,), ak_trust="pcrs-only")
GOLDEN = policy({0: (FIRMWARE,), 4: (KERNEL,), 8: (CMDLINE_NEW,), 9: (IMAGE_NEW,)})


def pcrs(kernel=KERNEL, cmdline=CMDLINE_OLD, image=IMAGE_OLD) -> dict[int, bytes]:
    return {4: kernel, 8: cmdline, 9: image}


# ---- the merge and the retire (policy.py) ----


def test_add_allows_the_new_value_after_the_old_and_keeps_everything_else():
    merged = add_golden_values(OLD, GOLDEN)
    assert merged.rules[8].allowed == (CMDLINE_OLD, CMDLINE_NEW)
    assert merged.rules[9].allowed == (IMAGE_OLD, IMAGE_NEW)
    assert merged.rules[4].allowed == (KERNEL,), "an unchanged value is not listed twice"
    assert set(merged.rules) == {4, 8, 9}, "a golden PCR the policy does not check is not added"
    assert merged.rules[9].warn_only and not merged.rules[8].warn_only
    assert merged.ak_trust == "pcrs-only"


def test_add_twice_changes_nothing():
    merged = add_golden_values(OLD, GOLDEN)
    assert add_golden_values(merged, GOLDEN) == merged


def test_add_refuses_golden_values_that_lack_a_checked_pcr():
    with pytest.raises(PolicyError, match=r"lack PCR\(s\) 9"):
        add_golden_values(OLD, policy({4: (KERNEL,), 8: (CMDLINE_NEW,)}))


def test_add_refuses_another_hash_algorithm():
    golden = MeasurementPolicy("sha384", {i: PcrRule(i, (b"\x01" * 48,)) for i in (4, 8, 9)})
    with pytest.raises(PolicyError, match="sha384"):
        add_golden_values(OLD, golden)


def test_retire_drops_only_the_retiring_values():
    merged = add_golden_values(policy({8: (CMDLINE_HAND, CMDLINE_OLD), 9: (IMAGE_OLD,)}), GOLDEN)
    retired = retire_values(merged, {8: (CMDLINE_OLD,), 9: (IMAGE_OLD,)})
    assert retired.rules[8].allowed == (CMDLINE_HAND, CMDLINE_NEW)
    assert retired.rules[9].allowed == (IMAGE_NEW,)


def test_retire_refuses_to_leave_a_pcr_without_values():
    with pytest.raises(PolicyError, match="PCR 8 allowing no value"):
        retire_values(OLD, {8: (CMDLINE_OLD,)})


def test_node_pcr_values_are_checked():
    assert pcr_values_from_document({"8": CMDLINE_NEW.hex(), 9: IMAGE_NEW.hex()}, "n") == {8: CMDLINE_NEW, 9: IMAGE_NEW}
    with pytest.raises(PolicyError, match="n PCR 8"):
        pcr_values_from_document({"8": "abcd"}, "n")
    with pytest.raises(PolicyError, match="not 0..23"):
        pcr_values_from_document({"24": CMDLINE_NEW.hex()}, "n")


# ---- the steps on a policy file (rollover.py) ----


@pytest.fixture
def policy_file(tmp_path):
    path = tmp_path / "measurement-policy.yml"
    path.write_bytes(policy_text(OLD))
    return path


def backups(path) -> list[str]:
    return sorted(name for name in os.listdir(path.parent) if name.startswith(path.name + ".") and name.endswith("~"))


def test_add_keeps_a_backup_records_the_rollover_and_allows_both(policy_file):
    before = policy_file.read_bytes()
    outcome = PolicyRollover(str(policy_file), now=1_800_000_000).add(GOLDEN, "golden-0")
    assert outcome.changed
    assert backups(policy_file) == ["measurement-policy.yml.2027-01-15@08:00:00~"]
    assert (policy_file.parent / backups(policy_file)[0]).read_bytes() == before
    assert load_policy(str(policy_file)).rules[8].allowed == (CMDLINE_OLD, CMDLINE_NEW)
    record = json.loads((policy_file.parent / "measurement-policy.yml.rollover.json").read_text())
    assert record["golden_node"] == "golden-0" and record["retired"] is None
    assert record["retiring"] == {"8": [CMDLINE_OLD.hex()], "9": [IMAGE_OLD.hex()]}
    assert record["new"]["4"] == [KERNEL.hex()]


def test_add_again_changes_nothing(policy_file):
    PolicyRollover(str(policy_file)).add(GOLDEN, "golden-0")
    text = policy_file.read_bytes()
    outcome = PolicyRollover(str(policy_file)).add(GOLDEN, "golden-0")
    assert not outcome.changed
    assert policy_file.read_bytes() == text and len(backups(policy_file)) == 1


def test_add_of_other_values_during_a_rollover_is_refused(policy_file):
    PolicyRollover(str(policy_file)).add(GOLDEN, "golden-0")
    text = policy_file.read_bytes()
    other = policy({4: (KERNEL,), 8: (digest("a third command line"),), 9: (IMAGE_NEW,)})
    with pytest.raises(RolloverError, match="in progress since .* golden-1's differ"):
        PolicyRollover(str(policy_file)).add(other, "golden-1")
    assert policy_file.read_bytes() == text


def test_add_without_a_policy_says_to_enrol_first(tmp_path):
    with pytest.raises(RolloverError, match="enrol one first"):
        PolicyRollover(str(tmp_path / "none.yml")).add(GOLDEN, "golden-0")


def test_add_of_the_values_already_alone_in_the_policy_is_no_rollover(policy_file):
    outcome = PolicyRollover(str(policy_file)).add(OLD, "old-node")
    assert not outcome.changed and backups(policy_file) == []
    assert not (policy_file.parent / "measurement-policy.yml.rollover.json").exists()


def test_check_mode_decides_but_writes_nothing(policy_file):
    before = policy_file.read_bytes()
    outcome = PolicyRollover(str(policy_file), check_mode=True).add(GOLDEN, "golden-0")
    assert outcome.changed and outcome.policy.rules[8].allowed == (CMDLINE_OLD, CMDLINE_NEW)
    assert policy_file.read_bytes() == before and backups(policy_file) == []
    assert not (policy_file.parent / "measurement-policy.yml.rollover.json").exists()


def test_status_names_the_nodes_on_values_that_retire(policy_file):
    PolicyRollover(str(policy_file)).add(GOLDEN, "golden-0")
    nodes = {"cp-0": pcrs(), "worker-0": pcrs(cmdline=CMDLINE_NEW, image=IMAGE_NEW), "worker-1": pcrs(image=IMAGE_NEW)}
    outcome = PolicyRollover(str(policy_file)).status(nodes)
    assert outcome.nodes_on_old_values == {"cp-0": [8, 9], "worker-1": [8]}
    assert "cp-0 (PCR 8,9), worker-1 (PCR 8)" in outcome.msg and not outcome.changed


def test_retire_refuses_naming_each_node_on_old_values_and_each_unread_node(policy_file):
    PolicyRollover(str(policy_file)).add(GOLDEN, "golden-0")
    text = policy_file.read_bytes()
    nodes = {"cp-0": pcrs(cmdline=CMDLINE_NEW, image=IMAGE_NEW), "worker-1": pcrs(cmdline=CMDLINE_OLD, image=IMAGE_NEW)}
    with pytest.raises(RolloverError, match=r"still running the old values: worker-1 \(PCR 8\); not read .*: worker-2"):
        PolicyRollover(str(policy_file)).retire(nodes, ["worker-2"])
    assert policy_file.read_bytes() == text and len(backups(policy_file)) == 1


def test_retire_once_every_node_runs_the_new_values_then_again_changes_nothing(policy_file):
    PolicyRollover(str(policy_file), now=1_800_000_000).add(GOLDEN, "golden-0")
    nodes = {"cp-0": pcrs(cmdline=CMDLINE_NEW, image=IMAGE_NEW)}
    outcome = PolicyRollover(str(policy_file), now=1_800_000_100).retire(nodes, [])
    assert outcome.changed
    retired = load_policy(str(policy_file))
    assert retired.rules[8].allowed == (CMDLINE_NEW,) and retired.rules[9].allowed == (IMAGE_NEW,)
    assert retired.rules[9].warn_only and retired.ak_trust == "pcrs-only"
    assert len(backups(policy_file)) == 2
    again = PolicyRollover(str(policy_file)).retire({"cp-0": pcrs()}, ["worker-9"])
    assert not again.changed and "retired at" in again.msg


def test_forced_retire_names_the_nodes_it_leaves_behind(policy_file):
    PolicyRollover(str(policy_file)).add(GOLDEN, "golden-0")
    outcome = PolicyRollover(str(policy_file)).retire({"cp-0": pcrs()}, [], force=True)
    assert outcome.changed and outcome.nodes_on_old_values == {"cp-0": [8, 9]}
    assert load_policy(str(policy_file)).rules[8].allowed == (CMDLINE_NEW,)


def test_retire_without_a_rollover_changes_nothing(policy_file):
    outcome = PolicyRollover(str(policy_file)).retire({"cp-0": pcrs()}, [])
    assert not outcome.changed and "nothing to retire" in outcome.msg


def test_rollback_after_retire_restores_the_exact_policy_from_before(policy_file):
    before = policy_file.read_bytes()
    PolicyRollover(str(policy_file)).add(GOLDEN, "golden-0")
    PolicyRollover(str(policy_file)).retire({}, [])
    retired = policy_file.read_bytes()
    with pytest.raises(RolloverError, match=r"the old values were retired at .* trusts them again \(PCR 8: 1 value"):
        PolicyRollover(str(policy_file)).rollback({"cp-0": pcrs()})
    assert (
        policy_file.read_bytes() == retired and (policy_file.parent / "measurement-policy.yml.rollover.json").exists()
    )
    outcome = PolicyRollover(str(policy_file)).rollback(
        {"worker-0": pcrs(cmdline=CMDLINE_NEW), "cp-0": pcrs()}, force=True
    )
    assert outcome.changed and policy_file.read_bytes() == before
    assert outcome.nodes_not_allowed == {"worker-0": [8]}
    assert not (policy_file.parent / "measurement-policy.yml.rollover.json").exists()
    assert len(backups(policy_file)) == 3, "add, retire and rollback each keep the policy they replace"
    assert not PolicyRollover(str(policy_file)).rollback({}).changed


def test_rollback_before_retire_needs_no_force(policy_file):
    before = policy_file.read_bytes()
    PolicyRollover(str(policy_file)).add(GOLDEN, "golden-0")
    assert PolicyRollover(str(policy_file)).rollback({}).changed and policy_file.read_bytes() == before


def test_rollback_refuses_when_its_backup_is_gone(policy_file):
    outcome = PolicyRollover(str(policy_file)).add(GOLDEN, "golden-0")
    os.unlink(outcome.backup)
    text = policy_file.read_bytes()
    with pytest.raises(RolloverError, match="is gone"):
        PolicyRollover(str(policy_file)).rollback({})
    assert policy_file.read_bytes() == text


# ---- the module ----


def test_module_add_reports_the_digest_and_a_diff(policy_file):
    golden = GOLDEN.to_document()
    result = run_main(
        measurement_rollover.main,
        {
            "policy_file": str(policy_file),
            "mode": "add",
            "golden": golden,
            "golden_node": "golden-0",
            "_ansible_diff": True,
        },
    )
    assert result["changed"] and not result["failed"]
    assert result["policy_sha256"] == hashlib.sha256(policy_file.read_bytes()).hexdigest()
    assert CMDLINE_NEW.hex() in result["diff"]["after"] and CMDLINE_NEW.hex() not in result["diff"]["before"]
    again = run_main(measurement_rollover.main, {"policy_file": str(policy_file), "mode": "add", "golden": golden})
    assert not again["changed"]


def test_module_retire_fails_naming_the_node_and_changes_nothing(policy_file):
    run_main(
        measurement_rollover.main, {"policy_file": str(policy_file), "mode": "add", "golden": GOLDEN.to_document()}
    )
    text = policy_file.read_bytes()
    node_pcrs = {"worker-1": {str(i): v.hex() for i, v in pcrs().items()}}
    args = {"policy_file": str(policy_file), "mode": "retire", "node_pcrs": node_pcrs}
    result = run_main(measurement_rollover.main, args)
    assert result["failed"] and "worker-1 (PCR 8,9)" in result["msg"]
    assert policy_file.read_bytes() == text


def test_module_refuses_bad_node_values(policy_file):
    result = run_main(
        measurement_rollover.main,
        {"policy_file": str(policy_file), "mode": "status", "node_pcrs": {"worker-1": {"8": "zz"}}},
    )
    assert result["failed"] and "node_pcrs worker-1 PCR 8" in result["msg"]
