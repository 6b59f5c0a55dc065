"""Version policy: no downgrades, no major changes, minor steps of at most one, unless forced."""

from __future__ import annotations

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.policy import (
    SemVer,
    VersionPolicyError,
    check_version_policy,
)


@pytest.mark.parametrize(
    "current, target, skip",
    [
        pytest.param(None, "1.0.0", False, id="first install"),
        pytest.param("1.2.3", "1.2.3", False, id="same version"),
        pytest.param("1.2.3", "1.2.9", False, id="patch upgrade"),
        pytest.param("1.2.3", "1.3.0", False, id="next minor"),
        pytest.param("v1.2.3", "1.3.1", False, id="v prefix"),
        pytest.param("1.3.0-rc.1", "1.3.0", False, id="pre-release to its release"),
        pytest.param("1.2.0", "1.3.0-rc.1", False, id="next minor pre-release"),
        pytest.param("1.3.0", "1.2.0", True, id="skipped downgrade"),
        pytest.param("1.0.0", "1.5.0", True, id="skipped minor jump"),
        pytest.param("1.0.0", "2.0.0", True, id="skipped major"),
    ],
)
def test_allowed(current, target, skip):
    check_version_policy(current, target, skip)


@pytest.mark.parametrize(
    "current, target, reason, words",
    [
        pytest.param("1.3.0", "1.2.9", "downgrade", "downgrade from 1.3.0 to 1.2.9", id="minor downgrade"),
        pytest.param("1.3.1", "1.3.0", "downgrade", "downgrade", id="patch downgrade"),
        pytest.param("1.3.0", "1.3.0-rc.1", "downgrade", "downgrade", id="release to its pre-release"),
        pytest.param("1.0.0", "1.2.0", "minor-jump", "upgrade to 1.1.x first", id="minor jump of two"),
        pytest.param("1.0.0", "2.0.0", "major", "major version change", id="major upgrade"),
        pytest.param("2.0.0", "1.9.0", "downgrade", "downgrade", id="major downgrade"),
        pytest.param("1.0.0", "one", "invalid", "not a semantic version", id="target not semver"),
        pytest.param("latest", "1.0.0", "invalid", "not a semantic version", id="deployed not semver"),
    ],
)
def test_refused(current, target, reason, words):
    with pytest.raises(VersionPolicyError) as refused:
        check_version_policy(current, target)
    assert refused.value.reason == reason
    assert words in str(refused.value)


def test_semver_precedence_follows_the_specification():
    ordered = [
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-alpha.beta",
        "1.0.0-beta",
        "1.0.0-beta.2",
        "1.0.0-beta.11",
        "1.0.0-rc.1",
        "1.0.0",
        "1.0.1",
        "1.1.0",
    ]
    parsed = [SemVer.parse(v) for v in ordered]
    assert sorted(parsed, key=SemVer.key) == parsed
