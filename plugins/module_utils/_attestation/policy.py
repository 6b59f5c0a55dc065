# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Measurement policies: PCR index -> allowed values (+ warn-only), own format and Constellation's; and a section per CVM
evidence variant (`sev-snp`, `tdx`), kept as the file has it for that variant to read."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace

from .._files import FileTooLargeError, read_bounded
from . import variants
from .eventlog import EVENT_TYPE_IDS, MAX_DESCRIPTION, MAX_EVENTS, GoldenEvent

try:
    import yaml
except ImportError:  # reported by the modules through missing_required_lib()
    pass

POLICY_VERSION = 1
AK_TRUST_LEVELS = {"pcrs-only": 1, "ek-certificate": 2}
MAX_POLICY_BYTES = 256 * 1024
NODE_LOCK_PCR = 15
_HEX = re.compile(r"[0-9a-fA-F]+")
_PCR_INDEX = re.compile(r"0|[1-9][0-9]?")
_DIGEST_SIZES = {"sha1": 20, "sha256": 32, "sha384": 48, "sha512": 64}
_OWN_KEYS = ("version", "hash_algorithm", "ak_trust", "pcrs", "event_log")
_UNKNOWN_EVENT_TYPE = re.compile(r"EV_0x[0-9a-f]{8}")


class PolicyError(ValueError):
    """The measurement policy cannot be read or is malformed; the message names the entry."""


@dataclass(frozen=True)
class PcrRule:
    index: int
    allowed: tuple[bytes, ...]
    warn_only: bool = False


@dataclass(frozen=True)
class MeasurementPolicy:
    hash_algorithm: str
    rules: dict[int, PcrRule]
    ak_trust: str = "ek-certificate"
    # The golden node's measured events in this bank: they name the events behind a PCR that fails the policy.
    event_log: tuple[GoldenEvent, ...] = ()
    # Variant name -> that variant's section as the file has it (``sev-snp``, ``tdx``).
    variant_sections: dict[str, dict] = field(default_factory=dict)

    @property
    def ak_trust_level(self) -> int:
        return AK_TRUST_LEVELS[self.ak_trust]

    def with_rule(self, index: int, allowed: list[bytes], warn_only: bool = False) -> "MeasurementPolicy":
        rules = dict(self.rules)
        rules[index] = PcrRule(index, tuple(allowed), warn_only)
        return replace(self, rules=rules)

    def to_document(self) -> dict:
        document = {
            "version": POLICY_VERSION,
            "hash_algorithm": self.hash_algorithm,
            "ak_trust": self.ak_trust,
            "pcrs": {
                str(i): {"allowed": [v.hex() for v in rule.allowed], "warn_only": rule.warn_only}
                for i, rule in sorted(self.rules.items())
            },
        }
        if self.event_log:
            document["event_log"] = [
                {"pcr": e.pcr, "type": e.type, "description": e.description, "digest": e.digest.hex()}
                for e in self.event_log
            ]
        document.update(self.variant_sections)
        return document


def add_golden_values(current: MeasurementPolicy, golden: MeasurementPolicy) -> MeasurementPolicy:
    """``current`` with the golden node's value of each PCR it checks allowed after the values it allows already.

    The PCRs checked, their warn-only flags, the hash algorithm and the AK trust stay ``current``'s: a rollover trusts
    new values, it changes nothing else. Golden PCRs the policy does not check are ignored.
    """
    if golden.hash_algorithm != current.hash_algorithm:
        raise PolicyError(f"the golden values are {golden.hash_algorithm}, the policy checks {current.hash_algorithm}")
    missing = sorted(set(current.rules) - set(golden.rules))
    if missing:
        raise PolicyError(f"the golden values lack PCR(s) {', '.join(map(str, missing))}, which the policy checks")
    rules = {}
    for index, rule in current.rules.items():
        added = tuple(value for value in golden.rules[index].allowed if value not in rule.allowed)
        rules[index] = replace(rule, allowed=rule.allowed + added)
    return replace(current, rules=rules)


def retire_values(current: MeasurementPolicy, retiring: dict[int, tuple[bytes, ...]]) -> MeasurementPolicy:
    """``current`` without the ``retiring`` values; refuses to leave a PCR that allows no value at all."""
    rules = {}
    for index, rule in current.rules.items():
        kept = tuple(value for value in rule.allowed if value not in retiring.get(index, ()))
        if not kept:
            raise PolicyError(f"retiring its values would leave PCR {index} allowing no value")
        rules[index] = replace(rule, allowed=kept)
    return replace(current, rules=rules)


def pcrs_on_values(node_pcrs: dict[int, bytes], values: dict[int, tuple[bytes, ...]]) -> list[int]:
    """The PCRs (sorted) whose value on a node is one of ``values`` for that PCR."""
    return sorted(index for index, value in node_pcrs.items() if value in values.get(index, ()))


def pcr_values_from_document(doc: object, where: str, hash_algorithm: str = "sha256") -> dict[int, bytes]:
    """A node's PCR values as modules report them (index -> hex; indices as text or numbers)."""
    if not isinstance(doc, dict):
        raise PolicyError(f"{where}: PCR values must be a mapping of index -> hex, got {type(doc).__name__}")
    return {
        _index(where, key): _hex_value(f"{where} PCR {key}", value, _DIGEST_SIZES[hash_algorithm])
        for key, value in doc.items()
    }


def node_lock_mark(cluster_id: bytes, hash_algorithm: str = "sha256") -> bytes:
    """PCR 15 of a node locked for this cluster: H(0^n || H(cluster_id))."""
    size = _DIGEST_SIZES[hash_algorithm]
    return hashlib.new(hash_algorithm, b"\x00" * size + hashlib.new(hash_algorithm, cluster_id).digest()).digest()


def _hex_value(where: str, value: object, size: int) -> bytes:
    if not isinstance(value, str) or not _HEX.fullmatch(value) or len(value) != size * 2:
        raise PolicyError(f"{where}: {value!r} is not a {size}-byte hex digest")
    return bytes.fromhex(value)


def _index(where: str, key: object) -> int:
    text = str(key) if isinstance(key, (str, int)) and not isinstance(key, bool) else ""
    if not _PCR_INDEX.fullmatch(text) or int(text) > 23:
        raise PolicyError(f"{where}: PCR index {key!r} is not 0..23")
    return int(text)


def _flag(where: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise PolicyError(f"{where}: must be true or false, got {value!r}")
    return value


def _from_own(doc: dict) -> MeasurementPolicy:
    # YAML keys may be of any type (1, null, a date): name them as text.
    # Beside its own keys, a section per variant that reads one (variants.py: sev-snp, tdx), kept for that variant.
    section_names = variants.policy_sections()
    unknown = sorted(str(key) for key in doc if key not in _OWN_KEYS and key not in section_names)
    if unknown:
        raise PolicyError(f"policy has unknown key(s): {', '.join(unknown)}")
    if isinstance(doc.get("version"), bool) or doc.get("version") != POLICY_VERSION:
        raise PolicyError(f"policy version {doc.get('version')!r} is not supported (expected {POLICY_VERSION})")
    hash_algorithm = doc.get("hash_algorithm", "sha256")
    if not isinstance(hash_algorithm, str) or hash_algorithm not in _DIGEST_SIZES:
        raise PolicyError(f"policy hash_algorithm {hash_algorithm!r} is not one of {', '.join(_DIGEST_SIZES)}")
    ak_trust = doc.get("ak_trust", "ek-certificate")
    if not isinstance(ak_trust, str) or ak_trust not in AK_TRUST_LEVELS:
        raise PolicyError(f"policy ak_trust {ak_trust!r} is not one of {', '.join(AK_TRUST_LEVELS)}")
    sections = {}
    for name in section_names:
        if name in doc:
            if not isinstance(doc[name], dict) or not doc[name]:
                raise PolicyError(f"policy {name!r} section must be a non-empty mapping of its fields")
            try:
                variants.find(name).read_policy_section(doc[name])
            except variants.VerificationError as exc:
                raise PolicyError(f"policy {name!r} section: {exc}") from None
            sections[name] = doc[name]
    pcrs = doc.get("pcrs", {} if sections else None)
    if sections and pcrs == {}:
        return MeasurementPolicy(hash_algorithm, {}, ak_trust, (), sections)
    if not isinstance(pcrs, dict) or not pcrs:
        raise PolicyError("policy 'pcrs' must be a non-empty mapping of PCR index -> rule")
    rules = {}
    for key, rule in pcrs.items():
        index = _index("policy pcrs", key)
        where = f"policy PCR {index}"
        if not isinstance(rule, dict) or set(rule) - {"allowed", "warn_only"}:
            raise PolicyError(f"{where}: rule must be a mapping with 'allowed' and optional 'warn_only'")
        allowed = rule.get("allowed")
        if isinstance(allowed, str):
            allowed = [allowed]
        if not isinstance(allowed, list) or not allowed:
            raise PolicyError(f"{where}: 'allowed' must list at least one hex value")
        values = tuple(_hex_value(where, v, _DIGEST_SIZES[hash_algorithm]) for v in allowed)
        rules[index] = PcrRule(index, values, _flag(f"{where} warn_only", rule.get("warn_only", False)))
    event_log = _golden_events(doc["event_log"], _DIGEST_SIZES[hash_algorithm]) if "event_log" in doc else ()
    return MeasurementPolicy(hash_algorithm, rules, ak_trust, event_log, sections)


def _golden_events(value: object, size: int) -> tuple[GoldenEvent, ...]:
    """The enrolled golden event log: a list of {pcr, type, description, digest} in the policy's bank."""
    if not isinstance(value, list) or len(value) > MAX_EVENTS:
        raise PolicyError(f"policy 'event_log' must be a list of at most {MAX_EVENTS} events")
    events = []
    for number, event in enumerate(value, 1):
        where = f"policy event_log entry {number}"
        if not isinstance(event, dict) or set(event) != {"pcr", "type", "description", "digest"}:
            raise PolicyError(f"{where}: must be a mapping of exactly pcr, type, description and digest")
        event_type, description = event["type"], event["description"]
        if not isinstance(event_type, str) or not (
            event_type in EVENT_TYPE_IDS or _UNKNOWN_EVENT_TYPE.fullmatch(event_type)
        ):
            raise PolicyError(f"{where}: type {event_type!r} is not a TCG event type name")
        if not isinstance(description, str) or len(description) > MAX_DESCRIPTION:
            raise PolicyError(f"{where}: description must be text of at most {MAX_DESCRIPTION} characters")
        digest = _hex_value(where, event["digest"], size)
        events.append(GoldenEvent(_index(where, event["pcr"]), event_type, description, digest))
    return tuple(events)


def _from_constellation(doc: dict) -> MeasurementPolicy:
    rules = {}
    for key, rule in doc.items():
        index = _index("Constellation measurements", key)
        where = f"Constellation measurement {index}"
        if not isinstance(rule, dict) or "expected" not in rule or set(rule) - {"expected", "warnOnly"}:
            raise PolicyError(f"{where}: must be {{'expected': <hex>, 'warnOnly': <bool>}}")
        expected = rule["expected"]
        allowed = expected if isinstance(expected, list) else [expected]
        if not allowed:
            raise PolicyError(f"{where}: 'expected' must list at least one hex value")
        values = tuple(_hex_value(where, v, 32) for v in allowed)
        rules[index] = PcrRule(index, values, _flag(f"{where} warnOnly", rule.get("warnOnly", False)))
    if not rules:
        raise PolicyError("Constellation measurements are empty")
    return MeasurementPolicy("sha256", rules, "ek-certificate")


def policy_from_document(doc: object) -> MeasurementPolicy:
    if not isinstance(doc, dict):
        raise PolicyError(f"policy must be a mapping, got {type(doc).__name__}")
    if "pcrs" in doc or "version" in doc:
        return _from_own(doc)
    return _from_constellation(doc)


def parse_policy(text: str | bytes, source: str = "policy") -> MeasurementPolicy:
    if len(text) > MAX_POLICY_BYTES:
        raise PolicyError(f"{source} is larger than {MAX_POLICY_BYTES} bytes")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyError(f"{source} is neither JSON nor YAML: {str(exc).splitlines()[0]}") from None
    except RecursionError:
        raise PolicyError(f"{source} is nested too deeply to be a measurement policy") from None
    except ValueError as exc:  # e.g. an integer longer than Python converts (4300 digits)
        raise PolicyError(f"{source} holds a value that cannot be read: {str(exc).splitlines()[0][:200]}") from None
    try:
        return policy_from_document(doc)
    except PolicyError as exc:
        raise PolicyError(f"{source}: {exc}") from None


def load_policy(path: str) -> MeasurementPolicy:
    try:
        text = read_bounded(path, MAX_POLICY_BYTES)
    except OSError as exc:
        raise PolicyError(f"cannot read measurement policy {path}: {exc.strerror}") from None
    except FileTooLargeError as exc:
        raise PolicyError(f"measurement policy {exc}") from None
    return parse_policy(text, f"measurement policy {path}")


def dump_policy(policy: MeasurementPolicy) -> str:
    return json.dumps(policy.to_document(), indent=2, sort_keys=True) + "\n"
