# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Measurement rollover on the controller: trust a new node image's golden values beside the old ones (``add``), drop
the old ones once no node runs them (``retire``), or put the policy from before the rollover back (``rollback``).

The rollover record (``<policy file>.rollover.json``) says which values are new and which retire, and where the policy
from before the rollover is kept; every policy replaced is kept first as ``<policy file>.<date>@<time>~``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field, replace

from .._files import FileTooLargeError, read_bounded, write_file_atomically
from .policy import (
    MAX_POLICY_BYTES,
    MeasurementPolicy,
    PolicyError,
    add_golden_values,
    load_policy,
    parse_policy,
    pcrs_on_values,
    retire_values,
)

try:
    import yaml
except ImportError as exc:  # reported by the module through missing_required_lib()
    YAML_IMPORT_ERROR: ImportError | None = exc
else:
    YAML_IMPORT_ERROR = None

RECORD_VERSION = 1
MODES = ("add", "retire", "rollback", "status")


class RolloverError(RuntimeError):
    """A rollover step is refused; the message says why and what to do, and nothing was changed."""


@dataclass(frozen=True)
class RolloverRecord:
    golden_node: str
    started: str
    backup: str
    new: dict[int, tuple[bytes, ...]]
    retiring: dict[int, tuple[bytes, ...]]
    retired: str | None = None

    def to_document(self) -> dict:
        def values(table: dict[int, tuple[bytes, ...]]) -> dict:
            return {str(index): [value.hex() for value in table[index]] for index in sorted(table)}

        return {
            "version": RECORD_VERSION,
            "golden_node": self.golden_node,
            "started": self.started,
            "backup": self.backup,
            "new": values(self.new),
            "retiring": values(self.retiring),
            "retired": self.retired,
        }

    @classmethod
    def from_document(cls, doc: object, where: str) -> "RolloverRecord":
        try:
            if doc.get("version") != RECORD_VERSION:
                raise RolloverError(f"{where}: record version {doc.get('version')!r} is not {RECORD_VERSION}")

            def values(table: dict) -> dict[int, tuple[bytes, ...]]:
                return {int(index): tuple(bytes.fromhex(value) for value in table[index]) for index in table}

            return cls(
                str(doc["golden_node"]),
                str(doc["started"]),
                str(doc["backup"]),
                values(doc["new"]),
                values(doc["retiring"]),
                doc.get("retired"),
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise RolloverError(f"{where} is not a rollover record ({exc.__class__.__name__}: {exc})") from None


@dataclass
class Outcome:
    """What a step did (or, in check mode, would do)."""

    changed: bool
    msg: str
    policy: MeasurementPolicy | None = None
    record: RolloverRecord | None = None
    backup: str | None = None
    nodes_on_old_values: dict[str, list[int]] = field(default_factory=dict)
    nodes_not_allowed: dict[str, list[int]] = field(default_factory=dict)


def _timestamp(now: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))


def policy_text(policy: MeasurementPolicy) -> bytes:
    """The policy file's content as written here: YAML, keys sorted, as the measurements playbook enrols it."""
    return yaml.safe_dump(policy.to_document(), indent=2, sort_keys=True, default_flow_style=False).encode()


def _names(nodes: dict[str, list[int]]) -> str:
    return ", ".join(f"{node} (PCR {','.join(map(str, pcrs))})" for node, pcrs in sorted(nodes.items()))


class PolicyRollover:
    """The rollover of one policy file; ``check_mode`` decides everything and writes nothing."""

    def __init__(self, policy_file: str, check_mode: bool = False, now: float | None = None):
        self.policy_file = policy_file
        self.record_file = policy_file + ".rollover.json"
        self.check_mode = check_mode
        self.now = time.time() if now is None else now

    # ---- reading ----

    def current(self) -> MeasurementPolicy:
        if not os.path.exists(self.policy_file):
            raise RolloverError(
                f"there is no measurement policy at {self.policy_file} to roll over: "
                "enrol one first (measurements_mode=enrol)"
            )
        try:
            return load_policy(self.policy_file)
        except PolicyError as exc:
            raise RolloverError(str(exc)) from None

    def record(self) -> RolloverRecord | None:
        if not os.path.exists(self.record_file):
            return None
        text = self._read(self.record_file, "measurement rollover record")
        try:
            doc = json.loads(text)
        except ValueError:
            raise RolloverError(f"{self.record_file} is not JSON") from None
        return RolloverRecord.from_document(doc, self.record_file)

    @staticmethod
    def _read(path: str, what: str) -> bytes:
        try:
            return read_bounded(path, MAX_POLICY_BYTES)
        except FileTooLargeError as exc:
            raise RolloverError(f"{what} {exc}") from None

    # ---- writing (nothing in check mode) ----

    def _backup_current(self) -> str:
        """Keep the policy file's exact bytes as <policy file>.<date>@<time>~ (a new name, never one replaced)."""
        stamp = time.strftime("%Y-%m-%d@%H:%M:%S", time.gmtime(self.now))
        backup = f"{self.policy_file}.{stamp}~"
        serial = 1
        while os.path.exists(backup):
            serial += 1
            backup = f"{self.policy_file}.{stamp}.{serial}~"
        if not self.check_mode:
            write_file_atomically(backup, self._read(self.policy_file, "measurement policy"), 0o644)
        return backup

    def _write_policy(self, text: bytes) -> None:
        if not self.check_mode:
            write_file_atomically(self.policy_file, text, 0o644)

    def _write_record(self, record: RolloverRecord) -> None:
        if not self.check_mode:
            text = json.dumps(record.to_document(), indent=2, sort_keys=True) + "\n"
            write_file_atomically(self.record_file, text.encode(), 0o644)

    # ---- the steps ----

    def add(self, golden: MeasurementPolicy, golden_node: str) -> Outcome:
        current = self.current()
        try:
            merged = add_golden_values(current, golden)
        except PolicyError as exc:
            raise RolloverError(f"{golden_node}: {exc}") from None
        new = {index: golden.rules[index].allowed for index in current.rules}
        record = self.record()
        if record is not None and record.retired is None:
            if record.new != new:
                raise RolloverError(
                    f"a rollover to {record.golden_node}'s values is in progress since {record.started} and "
                    f"{golden_node}'s differ: retire it (measurements_mode=retire) or roll it back "
                    "(measurements_mode=rollback) before adding other values"
                )
            if merged == current:
                return Outcome(
                    False, f"{golden_node}'s values are allowed beside the old ones already", current, record
                )
            self._write_policy(policy_text(merged))
            return Outcome(True, f"{golden_node}'s values added again beside the old ones", merged, record)
        retiring = {
            index: tuple(value for value in rule.allowed if value not in new[index])
            for index, rule in current.rules.items()
        }
        retiring = {index: values for index, values in retiring.items() if values}
        if not retiring:
            return Outcome(
                False, f"the policy allows {golden_node}'s values and no others: nothing to roll over", current, record
            )
        backup = self._backup_current()
        record = RolloverRecord(golden_node, _timestamp(self.now), backup, new, retiring)
        self._write_record(record)
        if merged != current:
            self._write_policy(policy_text(merged))
        return Outcome(
            True,
            f"{golden_node}'s values allowed beside the old ones (policy before kept as {backup})",
            merged,
            record,
            backup,
        )

    def status(self, node_pcrs: dict[str, dict[int, bytes]]) -> Outcome:
        """Which nodes run values that the rollover in progress will retire (nothing when none is in progress)."""
        record = self.record()
        if record is None or record.retired is not None:
            return Outcome(False, "no measurement rollover in progress", None, record)
        on_old = nodes_on_values(node_pcrs, record.retiring)
        msg = (
            f"nodes still on the values that retire: {_names(on_old)}"
            if on_old
            else "every node runs the new values: retire the old ones (measurements_mode=retire)"
        )
        return Outcome(
            False,
            f"rollover to {record.golden_node}'s values since {record.started}; {msg}",
            None,
            record,
            nodes_on_old_values=on_old,
        )

    def retire(self, node_pcrs: dict[str, dict[int, bytes]], unreadable: list[str], force: bool = False) -> Outcome:
        record = self.record()
        if record is None:
            return Outcome(False, "no measurement rollover in progress: nothing to retire")
        current = self.current()
        if record.retired is not None:
            if retire_values(current, record.retiring) == current:
                return Outcome(False, f"the old values were retired at {record.retired}", current, record)
        on_old = nodes_on_values(node_pcrs, record.retiring)
        if (on_old or unreadable) and not force:
            reasons = []
            if on_old:
                reasons.append(f"still running the old values: {_names(on_old)}")
            if unreadable:
                reasons.append(f"not read (they may run the old values): {', '.join(sorted(unreadable))}")
            raise RolloverError(
                "refusing to retire the old values while nodes may need them - "
                + "; ".join(reasons)
                + ". Reboot them into the new image (they rejoin with the new values) and retire then."
            )
        try:
            retired = retire_values(current, record.retiring)
        except PolicyError as exc:
            raise RolloverError(f"{self.policy_file}: {exc}") from None
        backup = self._backup_current()
        self._write_policy(policy_text(retired))
        record = replace(record, retired=_timestamp(self.now))
        self._write_record(record)
        forced = f"; forced although these nodes run them: {_names(on_old)}" if on_old else ""
        return Outcome(
            True,
            f"the old values are retired (policy before kept as {backup}){forced}",
            retired,
            record,
            backup,
            nodes_on_old_values=on_old,
        )

    def rollback(self, node_pcrs: dict[str, dict[int, bytes]], force: bool = False) -> Outcome:
        """Put the policy from before the rollover back. After a retire that trusts the retired values again, so it
        needs ``force``."""
        record = self.record()
        if record is None:
            return Outcome(False, "no measurement rollover to roll back")
        if record.retired is not None and not force:
            raise RolloverError(
                f"refusing to roll back: the old values were retired at {record.retired}, and the policy from before "
                f"the rollover trusts them again ({_retired_pcrs(record)}). Roll back anyway with "
                "-e measurements_force=true"
            )
        if not os.path.exists(record.backup):
            raise RolloverError(f"the policy from before the rollover, {record.backup}, is gone: cannot roll back")
        text = self._read(record.backup, "measurement policy backup")
        try:
            restored = parse_policy(text, f"measurement policy backup {record.backup}")
        except PolicyError as exc:
            raise RolloverError(str(exc)) from None
        same = self._read(self.policy_file, "measurement policy") == text
        backup = None if same else self._backup_current()
        if not same:
            self._write_policy(text)
        if not self.check_mode:
            os.unlink(self.record_file)
        not_allowed = {
            node: pcrs
            for node, pcrs in ((node, restored_mismatches(restored, values)) for node, values in node_pcrs.items())
            if pcrs
        }
        kept = f" (policy before kept as {backup})" if backup else ""
        return Outcome(
            True,
            f"the policy from before the rollover ({record.backup}) is back{kept}",
            restored,
            None,
            backup,
            nodes_not_allowed=not_allowed,
        )


def _retired_pcrs(record: RolloverRecord) -> str:
    return ", ".join(f"PCR {index}: {len(values)} value(s)" for index, values in sorted(record.retiring.items()))


def nodes_on_values(
    node_pcrs: dict[str, dict[int, bytes]], values: dict[int, tuple[bytes, ...]]
) -> dict[str, list[int]]:
    """Each node that runs one of ``values`` on some PCR, with those PCRs."""
    found = {node: pcrs_on_values(pcrs, values) for node, pcrs in node_pcrs.items()}
    return {node: pcrs for node, pcrs in found.items() if pcrs}


def restored_mismatches(policy: MeasurementPolicy, node_pcrs: dict[int, bytes]) -> list[int]:
    """The PCRs (sorted) a node runs that ``policy`` does not allow (the PCRs it checks; warn-only ones included)."""
    return sorted(
        index for index, rule in policy.rules.items() if index in node_pcrs and node_pcrs[index] not in rule.allowed
    )
