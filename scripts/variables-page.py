# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Writes docs/variables.md and the options section of each docs/roles/<role>.md from the roles' argument specs.

The specs (roles/*/meta/argument_specs.yml) are the one source. A role page keeps its hand-written text; only what
lies between its BEGIN GENERATED and END GENERATED markers is rewritten.

python scripts/variables-page.py            # rewrite docs/variables.md and the role pages' sections
python scripts/variables-page.py --check    # exit 1 when any of them is not current
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "variables.md"
ROLE_PAGES = REPO / "docs" / "roles"
BEGIN = "<!-- BEGIN GENERATED: options (scripts/variables-page.py) -->"
END = "<!-- END GENERATED -->"
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


def _default(option: dict, required_column: bool = False) -> str:
    if option.get("required") and not required_column:
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


def _role_rows(options: dict, prefix: str = "") -> list[str]:
    rows = []
    for name, option in sorted(options.items()):
        required = "yes" if option.get("required") else ""
        rows.append(
            f"| `{prefix}{name}` | {_type(option)} | {_default(option, required_column=True)} | {required} "
            f"| {_text(option.get('description'))} |"
        )
        if option.get("options"):
            rows += _role_rows(option["options"], f"{prefix}{name}.")
    return rows


def _specs() -> dict[str, dict]:
    return {
        path.parent.parent.name: yaml.safe_load(path.read_text())["argument_specs"]
        for path in sorted(REPO.glob("roles/*/meta/argument_specs.yml"))
    }


def render_role_section(role: str, entries: dict) -> str:
    """The generated options section of docs/roles/<role>.md, markers included: every entry point, spec order."""
    lines = [
        BEGIN,
        "",
        f"Every variable of the role, per entry point, from `roles/{role}/meta/argument_specs.yml` (written by",
        f"`scripts/variables-page.py`; edit the spec, not this table). `ansible-doc -t role confidential.kubernetes.{role}`",
        "shows the same.",
        "",
    ]
    for entry, spec in entries.items():
        lines += [f"### Entry point `{entry}`", "", _text(spec.get("short_description")) + ".", ""]
        if spec.get("options"):
            lines += [
                "| variable | type | default | required | description |",
                "|---|---|---|---|---|",
                *_role_rows(spec["options"]),
                "",
            ]
        else:
            lines += ["No variables.", ""]
    lines.append(END)
    return "\n".join(lines)


def render_role_page(path: Path, text: str, entries: dict) -> str:
    """The page with its generated section rewritten; the text outside the markers is kept byte for byte."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"{path}: needs exactly one {BEGIN!r} followed by one {END!r}")
    head, rest = text.split(BEGIN)
    tail = rest.split(END)[1]
    return head + render_role_section(path.stem, entries) + tail


def render_all() -> dict[Path, str]:
    """Every generated file and what it must hold now."""
    specs = _specs()
    pages = {PAGE: render(specs)}
    for path in sorted(ROLE_PAGES.glob("*.md")):
        if path.stem not in specs:
            raise ValueError(f"{path}: no roles/{path.stem}/meta/argument_specs.yml to generate its options from")
        pages[path] = render_role_page(path, path.read_text(), specs[path.stem])
    return pages


def render(specs: dict[str, dict] | None = None) -> str:
    specs = _specs() if specs is None else specs
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
    try:
        pages = render_all()
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    stale = [path for path, text in pages.items() if not path.exists() or path.read_text() != text]
    if "--check" in sys.argv[1:]:
        for path in stale:
            print(f"{path} is not current: run python scripts/variables-page.py", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(pages[path])
    return 0


if __name__ == "__main__":
    sys.exit(main())
