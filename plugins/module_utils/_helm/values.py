# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""User-supplied values: merged as helm merges ``-f`` files, compared with a deployed release, masked for diffs."""

from __future__ import annotations

import base64
import copy
import hashlib
import hmac
import json
import os
from typing import Any

try:
    import yaml

    HAS_YAML = True
except ImportError:  # reported by the modules through missing_required_lib()
    HAS_YAML = False


class ValuesError(ValueError):
    """A values file cannot be read or is not a map."""


def merge_values(base: dict, override: dict) -> dict:
    """Helm's coalescing of ``-f`` files: maps merge recursively, anything else replaces, ``null`` deletes a key."""
    result = copy.deepcopy(base)
    for key, value in override.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merge_values(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def load_values_file(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            loaded = yaml.safe_load(handle)
    except OSError as exc:
        raise ValuesError(f"cannot read the values file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ValuesError(f"the values file {path} is not valid YAML: {exc}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ValuesError(f"the values file {path} must hold a map of values, not a {type(loaded).__name__}")
    return loaded


def requested_values(values_files: list[str], values: dict | None) -> dict:
    """The values a release is asked to run with: every file in order, then ``values`` on top."""
    merged: dict = {}
    for path in values_files:
        merged = merge_values(merged, load_values_file(path))
    return merge_values(merged, values or {})


def normalise(values: Any) -> dict:
    """Values as helm stores them (JSON): ``None`` is no values, YAML-only types become strings."""
    if not values:
        return {}
    return json.loads(json.dumps(values, default=str))


def values_equal(deployed: Any, requested: Any) -> bool:
    return normalise(deployed) == normalise(requested)


class ValueMasker:
    """Replaces every leaf value with a per-run keyed fingerprint: a diff shows which keys changed, never a value.

    The key is random per instance, so fingerprints cannot be compared across runs or guessed offline.
    """

    def __init__(self) -> None:
        self._key = os.urandom(32)

    def fingerprint(self, value: object) -> str:
        digest = hmac.new(self._key, json.dumps(value, sort_keys=True, default=str).encode(), hashlib.sha256)
        return f"<masked:{digest.hexdigest()[:8]}>"

    def mask(self, values: object) -> object:
        if isinstance(values, dict):
            return {key: self.mask(item) for key, item in values.items()}
        if isinstance(values, list):
            return [self.mask(item) for item in values]
        return self.fingerprint(values)

    def scrub_text(self, text: str, values: object) -> str:
        """Mask every string leaf of ``values`` (at least 4 characters) where it appears in ``text``."""
        for leaf in sorted(_string_leaves(values), key=len, reverse=True):
            # Secrets reach manifests as themselves or base64-encoded (Secret data).
            text = text.replace(leaf, self.fingerprint(leaf))
            text = text.replace(base64.b64encode(leaf.encode()).decode(), self.fingerprint(leaf))
        return text


def _string_leaves(values: object) -> set[str]:
    if isinstance(values, dict):
        return set().union(*(_string_leaves(v) for v in values.values())) if values else set()
    if isinstance(values, list):
        return set().union(*(_string_leaves(v) for v in values)) if values else set()
    return {values} if isinstance(values, str) and len(values) >= 4 else set()


def dump_values(values: dict) -> str:
    """Values for a diff or a backup, stable key order (plain types first: Ansible hands over str subclasses)."""
    return yaml.safe_dump(normalise(values), sort_keys=True, default_flow_style=False)
