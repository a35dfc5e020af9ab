"""The unit tests share one fake transport (fakes.FakeNode): a second class answering Transport.run would be a second
fake to keep in step with the interface (issue 53 found six)."""

from __future__ import annotations

import ast
from pathlib import Path

HERE = Path(__file__).parent


def test_no_unit_test_defines_a_transport_of_its_own():
    found = []
    for path in sorted(HERE.glob("*.py")):
        if path.name == "fakes.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef) or any(getattr(b, "id", "") == "FakeNode" for b in node.bases):
                continue
            runs = [f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "run"]
            if any("timeout" in {a.arg for a in f.args.kwonlyargs} for f in runs):
                found.append(f"{path.name}: {node.name}")
    assert found == []
