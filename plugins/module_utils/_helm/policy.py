# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Chart version policy (Constellation's): no downgrades, no major changes, minor steps of at most one."""

from __future__ import annotations

import re
from dataclasses import dataclass

_SEMVER = re.compile(r"^v?(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$")


class VersionPolicyError(ValueError):
    """The requested chart version is not allowed from the deployed one (``reason`` names the rule)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class SemVer:
    major: int
    minor: int
    patch: int
    prerelease: tuple[object, ...] = ()

    @classmethod
    def parse(cls, text: str) -> SemVer:
        match = _SEMVER.match(str(text).strip())
        if not match:
            raise VersionPolicyError("invalid", f"chart version {text!r} is not a semantic version (MAJOR.MINOR.PATCH)")
        pre: tuple[object, ...] = ()
        if match.group(4):
            pre = tuple(int(p) if p.isdigit() else p for p in match.group(4).split("."))
        return cls(int(match.group(1)), int(match.group(2)), int(match.group(3)), pre)

    def key(self) -> tuple[object, ...]:
        # SemVer precedence: a release sorts after its pre-releases; numeric identifiers before alphanumeric ones.
        pre = tuple((0, p, "") if isinstance(p, int) else (1, 0, p) for p in self.prerelease)
        return (self.major, self.minor, self.patch, 0 if self.prerelease else 1, pre)

    def __lt__(self, other: SemVer) -> bool:
        return self.key() < other.key()


def check_version_policy(current: str | None, target: str, skip: bool = False) -> None:
    """Raise VersionPolicyError when going from ``current`` to ``target`` breaks the policy (``skip`` skips it).

    Allowed: a first install (no ``current``), the same version, patch upgrades, and upgrades to the next minor.
    """
    wanted = SemVer.parse(target)
    if current is None or skip:
        return
    deployed = SemVer.parse(current)
    if wanted.key() == deployed.key():
        return
    if wanted < deployed:
        raise VersionPolicyError(
            "downgrade", f"refusing to downgrade from {current} to {target} (set skip_version_policy to override)"
        )
    if wanted.major != deployed.major:
        raise VersionPolicyError(
            "major",
            f"refusing the major version change from {current} to {target} (set skip_version_policy to override)",
        )
    if wanted.minor - deployed.minor > 1:
        raise VersionPolicyError(
            "minor-jump",
            f"refusing to upgrade from {current} to {target}: minor versions may only advance by one at a time "
            f"(upgrade to {deployed.major}.{deployed.minor + 1}.x first, or set skip_version_policy)",
        )
