#!/usr/bin/env python3
"""Rewrite the README's stage table and checks tables from the stage list and the check registry (clustercheck
checks --format markdown), and its table of the figures a GPU model's expected values may give."""

import re
import sys
from pathlib import Path

from clustercheck import catalog, expected

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = {"stages": catalog.stage_table, "checks": catalog.markdown_tables, "figures": expected.figure_table}


def block(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- BEGIN {name}[^\n]*-->\n).*?(<!-- END {name} -->)", re.S)


def main() -> int:
    text = README.read_text()
    for name, render in BLOCKS.items():
        if not block(name).search(text):
            print(f"README.md has no <!-- BEGIN {name} --> ... <!-- END {name} --> block", file=sys.stderr)
            return 1
        text = block(name).sub(lambda m, render=render: m.group(1) + render() + m.group(2), text)
    README.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
