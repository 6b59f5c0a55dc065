# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Writes docs/variables.md, every variable of the collection, from the roles' argument specs (the one source).

python scripts/variables-page.py            # rewrite docs/variables.md
python scripts/variables-page.py --check    # exit 1 when docs/variables.md is not current
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "variables.md"
_MARKUP = re.compile(r"\b([CVOM])\(([^()]*)\)|\bI\(([^()]*)\)")


def _text(description) -> str:
    text = " ".join(description) if isinstance(description, list) else str(description or "")
    text = _MARKUP.sub(lambda m: f"`{m.group(2)}`" if m.group(1) else f"*{m.group(3)}*", text)
    return text.replace("|", "\\|").replace("\n", " ")


def _type(option: dict) -> str:
    kind = option.get("type", "str")
    if kind == "list" and option.get("elements"):
        return f"list of {option['elements']}"
    if option.get("choices"):
        return f"{kind}: " + ", ".join(f"`{choice}`" for choice in option["choices"])
    return kind


def _default(option: dict) -> str:
    if option.get("required"):
        return "required"
    if "default" not in option:
        return ""
    text = yaml.safe_dump(option["default"], default_flow_style=True, width=1000).strip().removesuffix("...").strip()
    return "`" + text.replace("|", "\\|") + "`"


def _rows(options: dict, prefix: str = "") -> list[str]:
    rows = []
    for name, option in sorted(options.items()):
        rows.append(f"| `{prefix}{name}` | {_type(option)} | {_default(option)} | {_text(option.get('description'))} |")
        if option.get("options"):
            rows += _rows(option["options"], f"{prefix}{name}.")
    return rows


def render() -> str:
    specs = {
        path.parent.parent.name: yaml.safe_load(path.read_text())["argument_specs"]
        for path in sorted(REPO.glob("roles/*/meta/argument_specs.yml"))
    }
    lines = [
        "# Variables",
        "",
        "Every variable of the collection, from the roles' argument specs (`roles/*/meta/argument_specs.yml`),",
        "written by `scripts/variables-page.py`; do not edit by hand. Every playbook checks the inventory's",
        "against them first ([the inventory](inventory.md)).",
        "`ansible-doc -t role confidential.kubernetes.<role>` shows the same.",
        "",
    ]
    inventory = ("node", "inventory")
    order = [inventory] + [
        (role, entry) for role, entries in specs.items() for entry in entries if (role, entry) != inventory
    ]
    for role, entry in order:
        spec = specs[role][entry]
        title = (
            "The inventory (every playbook)"
            if (role, entry) == inventory
            else f"Role `{role}`" + ("" if entry == "main" else f", entry point `{entry}`")
        )
        lines += [f"## {title}", "", _text(spec.get("short_description")) + ".", ""]
        if spec.get("options"):
            lines += ["| variable | type | default | description |", "|---|---|---|---|", *_rows(spec["options"]), ""]
        else:
            lines += ["No variables.", ""]
    return "\n".join(lines)


def main() -> int:
    page = render()
    if "--check" in sys.argv[1:]:
        if PAGE.read_text() != page:
            print(f"{PAGE} is not current: run python scripts/variables-page.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
