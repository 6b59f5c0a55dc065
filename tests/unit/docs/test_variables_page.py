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
