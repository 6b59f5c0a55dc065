# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Write the supported-versions lists of the docs from the versions table; with --check, fail when they drifted.

Each list sits between `<!-- generated:versions-NAME -->` and `<!-- /generated:versions-NAME -->` in its file; only
what is between the markers is rewritten. The table is read by its one parser,
plugins/module_utils/_versions/__init__.py (loaded by path: it imports nothing of the collection).

    scripts/gen-docs-versions.py            rewrite the lists
    scripts/gen-docs-versions.py --check    exit 1, naming each file, when a list is not the table's
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PARSER = REPO / "plugins" / "module_utils" / "_versions" / "__init__.py"
# file -> the lists it holds
FILES = {
    "README.md": ("supported",),
    "docs/roles/node.md": ("rows",),
    "docs/playbooks/cni.md": ("cilium",),
}


def _parser():
    spec = importlib.util.spec_from_file_location("_versions_table", PARSER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _rows(versions, table_file: Path) -> list:
    table = versions.load_table(str(table_file))
    return [versions.parse_row(version, table[version]) for version in versions.supported(table)]


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def render(name: str, rows: list) -> str:
    """The text between the markers of list ``name``."""
    if name == "supported":
        return f"**{', '.join(row.version for row in rows)}**"
    if name == "rows":
        lines = [
            "| Kubernetes | end of life | containerd | runc | crictl | CNI plugins | helm | etcd | CoreDNS "
            "| pause | Cilium chart | host packages |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in rows:
            tags = [row.images[image].rsplit(":", 1)[1] for image in ("etcd", "coredns", "pause")]
            versions = [row.artifact_version(n) for n in ("containerd", "runc", "crictl", "cni_plugins", "helm")]
            lines.append(
                "| "
                + " | ".join(
                    [
                        row.version,
                        row.end_of_life.isoformat(),
                        *versions,
                        *tags,
                        row.artifact_version("cilium"),
                        ", ".join(row.host_packages) or "-",
                    ]
                )
                + " |"
            )
        return "\n" + "\n".join(lines) + "\n"
    if name == "cilium":
        by_chart: dict[str, list[str]] = {}
        for row in rows:
            by_chart.setdefault(row.artifact_version("cilium"), []).append(row.version)
        return "; ".join(f"Cilium {chart} for {_join(versions)}" for chart, versions in by_chart.items())
    raise KeyError(name)


def regenerate(text: str, names, rows: list, label: str) -> str:
    for name in names:
        pattern = re.compile(rf"(<!-- generated:versions-{name} -->)(.*?)(<!-- /generated:versions-{name} -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(
                f"{label}: no <!-- generated:versions-{name} --> ... <!-- /generated:versions-{name} --> markers"
            )
        text = pattern.sub(lambda match: match.group(1) + render(name, rows) + match.group(3), text, count=1)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a list drifted")
    parser.add_argument("--root", type=Path, default=REPO, help="the tree whose docs are checked or written")
    parser.add_argument("--table", type=Path, default=None, help="the versions table (default: the root's)")
    args = parser.parse_args(argv)
    versions = _parser()
    rows = _rows(versions, args.table or args.root / PARSER.relative_to(REPO).with_name("kubernetes_versions.yml"))
    drifted = []
    for relative, names in FILES.items():
        path = args.root / relative
        text = path.read_text(encoding="utf-8")
        wanted = regenerate(text, names, rows, relative)
        if wanted != text:
            drifted.append(relative)
            if not args.check:
                path.write_text(wanted, encoding="utf-8")
    if args.check and drifted:
        print(
            f"the supported-versions lists of {', '.join(drifted)} are not the versions table's; run "
            "scripts/gen-docs-versions.py",
            file=sys.stderr,
        )
        return 1
    for relative in drifted:
        print(f"rewrote {relative}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
