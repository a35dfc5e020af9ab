#!/usr/bin/env python3
"""Rewrite the README's checks tables from the check registry (clustercheck checks --format markdown)."""

import re
import sys
from pathlib import Path

from clustercheck import catalog

README = Path(__file__).resolve().parent.parent / "README.md"
PATTERN = re.compile(r"(<!-- BEGIN checks[^\n]*-->\n).*?(<!-- END checks -->)", re.S)


def main() -> int:
    text = README.read_text()
    if not PATTERN.search(text):
        print("README.md has no <!-- BEGIN checks --> ... <!-- END checks --> block", file=sys.stderr)
        return 1
    README.write_text(PATTERN.sub(lambda m: m.group(1) + catalog.markdown_tables() + m.group(2), text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
