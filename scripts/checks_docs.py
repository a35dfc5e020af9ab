#!/usr/bin/env python3
"""Rewrite the generated tables from the stage list and the check registry: the README's stage table, and in
docs/checks.md the checks tables (clustercheck checks --format markdown) and the table of the figures a GPU model's
expected values may give."""

import re
import sys
from pathlib import Path

from clustercheck import catalog, expected

REPO = Path(__file__).resolve().parent.parent
BLOCKS = {
    REPO / "README.md": {"stages": catalog.stage_table},
    REPO / "docs" / "checks.md": {"checks": catalog.markdown_tables, "figures": expected.figure_table},
}


def block(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- BEGIN {name}[^\n]*-->\n).*?(<!-- END {name} -->)", re.S)


def main() -> int:
    texts = {}
    for path, blocks in BLOCKS.items():
        text = path.read_text()
        for name, render in blocks.items():
            if not block(name).search(text):
                where = path.relative_to(REPO)
                print(f"{where} has no <!-- BEGIN {name} --> ... <!-- END {name} --> block", file=sys.stderr)
                return 1
            text = block(name).sub(lambda m, render=render: m.group(1) + render() + m.group(2), text)
        texts[path] = text
    for path, text in texts.items():  # nothing is written unless every file has its blocks
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
