"""Lint is part of the test command: ruff for Python, yamllint and ansible-lint (production) for Ansible."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "."],
        ["ruff", "format", "--check", "."],
        ["yamllint", "--strict", "."],
        ["ansible-lint", "--profile", "production", "--offline"],
    ],
    ids=["ruff-check", "ruff-format", "yamllint", "ansible-lint"],
)
def test_lint_clean(command):
    proc = subprocess.run([str(BIN / command[0]), *command[1:]], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(command)} found problems:\n{proc.stdout}\n{proc.stderr}"
