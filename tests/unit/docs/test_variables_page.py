# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""docs/variables.md is what scripts/variables-page.py makes of the argument specs now, and lists every option."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "variables-page.py"


def test_the_variables_page_is_current():
    run = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr


def test_the_variables_page_lists_every_option_of_every_argument_spec():
    page = (REPO / "docs" / "variables.md").read_text()
    for path in REPO.glob("roles/*/meta/argument_specs.yml"):
        for entry_point, spec in yaml.safe_load(path.read_text())["argument_specs"].items():
            for name in spec.get("options") or {}:
                assert f"| `{name}` |" in page, f"{path.parent.parent.name} {entry_point}: {name}"


def test_the_check_fails_for_a_stale_page(tmp_path):
    stale = tmp_path / "variables-page.py"
    stale.write_text(
        SCRIPT.read_text()
        .replace(
            'PAGE = REPO / "docs" / "variables.md"', f'PAGE = __import__("pathlib").Path("{tmp_path}") / "variables.md"'
        )
        .replace("REPO = Path(__file__).resolve().parents[1]", f'REPO = Path("{REPO}")')
    )
    (tmp_path / "variables.md").write_text("# Variables\n")
    run = subprocess.run([sys.executable, str(stale), "--check"], capture_output=True, text=True, check=False)
    assert run.returncode == 1 and "is not current" in run.stderr


def _copy_of_the_repository(tmp_path: Path) -> Path:
    """roles/*/meta, docs/ and the generator in a temporary tree, for a check to run against edited copies."""
    copy = tmp_path / "repo"
    for spec in REPO.glob("roles/*/meta/argument_specs.yml"):
        target = copy / spec.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(spec.read_text())
    for page in [REPO / "docs" / "variables.md", *(REPO / "docs" / "roles").glob("*.md")]:
        target = copy / page.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(page.read_text())
    (copy / "scripts").mkdir()
    (copy / "scripts" / "variables-page.py").write_text(SCRIPT.read_text())
    return copy


def _check(copy: Path) -> subprocess.CompletedProcess:
    script = copy / "scripts" / "variables-page.py"
    return subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True, check=False)


def test_every_role_page_has_one_generated_options_section():
    spec = SCRIPT.read_text()
    begin = "<!-- BEGIN GENERATED: options (scripts/variables-page.py) -->"
    assert begin in spec
    for page in sorted((REPO / "docs" / "roles").glob("*.md")):
        text = page.read_text()
        assert text.count(begin) == 1 and text.count("<!-- END GENERATED -->") == 1, page.name


def test_every_role_page_lists_every_option_of_its_role_per_entry_point():
    for page in sorted((REPO / "docs" / "roles").glob("*.md")):
        section = page.read_text().split("<!-- BEGIN GENERATED")[1].split("<!-- END GENERATED -->")[0]
        specs = yaml.safe_load((REPO / "roles" / page.stem / "meta" / "argument_specs.yml").read_text())
        for entry_point, spec in specs["argument_specs"].items():
            assert f"### Entry point `{entry_point}`" in section, f"{page.name}: {entry_point}"
            block = section.split(f"### Entry point `{entry_point}`")[1].split("### Entry point")[0]
            for name in spec.get("options") or {}:
                assert f"| `{name}` |" in block, f"{page.name} {entry_point}: {name}"


def test_the_check_passes_on_a_faithful_copy(tmp_path):
    run = _check(_copy_of_the_repository(tmp_path))
    assert run.returncode == 0, run.stderr


def test_the_check_fails_when_a_role_spec_changes_and_its_page_does_not(tmp_path):
    copy = _copy_of_the_repository(tmp_path)
    spec = copy / "roles" / "reset" / "meta" / "argument_specs.yml"
    text = spec.read_text()
    said = "to derive the cluster ID (defaults as in the init role)."
    assert said in text
    spec.write_text(text.replace(said, "to derive the cluster ID, a description edited in this copy only."))
    run = _check(copy)
    assert run.returncode == 1
    assert f"{copy / 'docs' / 'roles' / 'reset.md'} is not current" in run.stderr


def test_the_check_fails_when_a_role_page_section_is_edited_by_hand(tmp_path):
    copy = _copy_of_the_repository(tmp_path)
    page = copy / "docs" / "roles" / "init.md"
    page.write_text(
        page.read_text().replace(
            "| `init_kubeadm_timeout` | int | `1800` |", "| `init_kubeadm_timeout` | int | `900` |"
        )
    )
    run = _check(copy)
    assert run.returncode == 1 and "init.md is not current" in run.stderr and "variables.md" not in run.stderr


def test_regenerating_keeps_the_hand_written_text_byte_for_byte(tmp_path):
    copy = _copy_of_the_repository(tmp_path)
    page = copy / "docs" / "roles" / "certificates.md"
    before = page.read_text()
    head, rest = before.split("<!-- BEGIN GENERATED")
    tail = rest.split("<!-- END GENERATED -->")[1]
    page.write_text(
        head + "<!-- BEGIN GENERATED: options (scripts/variables-page.py) -->\nstale\n<!-- END GENERATED -->" + tail
    )
    script = copy / "scripts" / "variables-page.py"
    subprocess.run([sys.executable, str(script)], check=True)
    assert page.read_text() == before


def test_a_role_page_without_markers_is_refused_by_name(tmp_path):
    copy = _copy_of_the_repository(tmp_path)
    page = copy / "docs" / "roles" / "reset.md"
    page.write_text(page.read_text().replace("<!-- END GENERATED -->", ""))
    run = _check(copy)
    assert run.returncode == 2 and "reset.md" in run.stderr and "END GENERATED" in run.stderr
