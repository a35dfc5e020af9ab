"""The example inventory a user copies: every group in it is one the playbooks act on, and the copy, which names the
user's own machines, stays out of git."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent.parent


def test_every_group_of_the_example_inventory_is_one_the_playbooks_use():
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-inventory"), "-i", "inventory/hosts.example.ini", "--list"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    groups = set(json.loads(proc.stdout)["all"]["children"]) - {"ungrouped"}
    targeted = {play["hosts"] for play in yaml.safe_load((REPO / "playbooks" / "nodes.yml").read_text())}
    assert groups and groups <= targeted, f"groups no play acts on: {groups - targeted}"


def test_the_users_inventory_is_ignored_by_git():
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    proc = subprocess.run(["git", "check-ignore", "-q", "inventory/hosts.ini"], cwd=REPO)
    assert proc.returncode == 0, "inventory/hosts.ini (the README's copy of the example) is not in .gitignore"
    assert (REPO / "inventory" / "hosts.example.ini").exists()
