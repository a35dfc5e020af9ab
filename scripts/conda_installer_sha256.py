#!/usr/bin/env python3
"""Print the sha256 table for python_env_conda_installer_sha256 (roles/python_env/defaults/main.yml).

    scripts/conda_installer_sha256.py [VERSION ...]     e.g. 24.11.3-0

Miniforge publishes a .sha256 file next to every installer on its GitHub release; this reads them
for Linux x86_64 and aarch64 and prints YAML to paste into the defaults (or group_vars). Needs
internet access (run it on a workstation, not on the air-gapped nodes).
"""

from __future__ import annotations

import re
import sys
import urllib.error
import urllib.request

RELEASES = "https://github.com/conda-forge/miniforge/releases/download"
ARCHES = ["x86_64", "aarch64"]
DEFAULT_VERSIONS = ["24.11.3-0"]


def installer_names(version: str) -> list[str]:
    return [f"Miniforge3-{version}-Linux-{arch}.sh" for arch in ARCHES]


def parse_sha256_file(text: str) -> str:
    """The digest out of a `<sha256>  <file>` (or bare digest) .sha256 file."""
    match = re.search(r"\b([0-9a-f]{64})\b", text.lower())
    if not match:
        raise ValueError(f"no sha256 in {text[:80]!r}")
    return match[1]


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()


def main(argv: list[str]) -> int:
    versions = argv or DEFAULT_VERSIONS
    print("python_env_conda_installer_sha256:")
    for version in versions:
        for name in installer_names(version):
            try:
                digest = parse_sha256_file(fetch(f"{RELEASES}/{version}/{name}.sha256"))
            except (urllib.error.URLError, ValueError, OSError) as exc:
                print(f"conda_installer_sha256: {name}: {exc}", file=sys.stderr)
                return 1
            print(f"  {name}: {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
