"""Module documentation stands alone: version_added agrees with galaxy.yml and the changelog, and nothing points at
files that are not shipped or at the test lab."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[4]
MODULES = sorted((REPO / "plugins" / "modules").glob("*.py"))
FRAGMENTS = sorted((REPO / "plugins" / "doc_fragments").glob("*.py"))
# Files that are not in the built collection (galaxy.yml build_ignore) or are not files of it at all.
UNSHIPPED = re.compile(r"DESIGN(\.md| section)|\btests/|\bmolecule\b|\bthe lab\b|\blab's\b|\blab node|10\.77\.")


def _doc_block(source: str, name: str) -> str:
    return source.split(f'{name} = r"""', 1)[1].split('"""', 1)[0]


def _released_modules() -> dict[str, str]:
    changelog = yaml.safe_load((REPO / "changelogs" / "changelog.yaml").read_text())
    return {
        module["name"]: version
        for version, release in changelog["releases"].items()
        for module in release.get("modules", [])
    }


@pytest.mark.parametrize("module", MODULES, ids=lambda p: p.stem)
def test_version_added_is_the_release_that_shipped_the_module_or_the_coming_one(module):
    galaxy_version = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
    documented = yaml.safe_load(_doc_block(module.read_text(), "DOCUMENTATION"))["version_added"]
    assert str(documented) == _released_modules().get(module.stem, galaxy_version)


def test_galaxy_version_is_ahead_of_every_release():
    galaxy_version = tuple(int(p) for p in yaml.safe_load((REPO / "galaxy.yml").read_text())["version"].split("."))
    released = yaml.safe_load((REPO / "changelogs" / "changelog.yaml").read_text())["releases"]
    assert all(tuple(int(p) for p in v.split(".")) <= galaxy_version for v in released)


@pytest.mark.parametrize("plugin", MODULES + FRAGMENTS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_docs_name_nothing_outside_the_collection(plugin):
    source = plugin.read_text()
    blocks = [
        _doc_block(source, name) for name in ("DOCUMENTATION", "EXAMPLES", "RETURN") if f'{name} = r"""' in source
    ]
    assert blocks
    found = [m.group(0) for block in blocks for m in UNSHIPPED.finditer(block)]
    assert not found, f"{plugin.name} documents {found}"
