"""Tests assert what a user relies on, not whole sentences (issue 53, section 6).

A test that pins a message word for word breaks on every rewording, and hides what it meant to prove. Tests assert
the status, the node, the check, the cause's key words and the fix's key words instead. A whole sentence stays only
where the sentence itself is what a user or a script relies on; such a line says so with a ``# contract`` comment
(the verdict line, the SKIP format, a documented error line, a command a user runs), or with ``# verbatim`` where
the text is copied unchanged from the recorded input (a log line, a program's own error), not worded by us.

This guard counts the equality assertions against a sentence in tests/unit and fails when one lacks the comment,
or when the marked ones grow past the number left when the rewrite was done.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

UNIT = Path(__file__).resolve().parent
MARKS = ("# contract", "# verbatim")
# The marked whole-sentence assertions left after the rewrite; lower it when one goes, never raise it lightly.
MOST_MARKED = 53
WORDS = 4  # a string of four words or more is a sentence, not a name, a value or a state


def _sentences(node: ast.AST, named: dict[str, ast.AST]) -> bool:
    """Whether an expression is, or holds, a string literal of WORDS words or more (a name bound to one counts)."""
    if isinstance(node, ast.Name) and node.id in named:
        return _sentences(named[node.id], {})
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return len(node.value.split()) >= WORDS
    if isinstance(node, ast.JoinedStr):
        text = "".join(v.value if isinstance(v, ast.Constant) else "x" for v in node.values)
        return len(text.split()) >= WORDS
    if isinstance(node, ast.BinOp):
        return _sentences(node.left, named) or _sentences(node.right, named)
    if isinstance(node, (ast.Tuple, ast.List)):
        return any(_sentences(e, named) for e in node.elts)
    return False


def _comments(source: str) -> dict[int, str]:
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return {t.start[0]: t.string for t in tokens if t.type == tokenize.COMMENT}


def _scopes(tree: ast.Module):
    """Each function (and the module) with the names it binds to a plain value, innermost scope last."""
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for scope in [tree, *functions]:
        named = {
            n.targets[0].id: n.value
            for n in ast.walk(scope)
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
        }
        yield scope, named


def whole_sentence_asserts(path: Path) -> list[tuple[int, bool]]:
    """(line, marked) for each `==` in an assert with a sentence on one side, sorted by line."""
    source = path.read_text()
    comments = _comments(source)
    found = {}
    for scope, named in _scopes(ast.parse(source)):
        for node in ast.walk(scope):
            if not isinstance(node, ast.Assert):
                continue
            for compare in ast.walk(node.test):
                if not isinstance(compare, ast.Compare):
                    continue
                sides = [compare.left, *compare.comparators]
                for op, left, right in zip(compare.ops, sides, sides[1:], strict=False):
                    if isinstance(op, ast.Eq) and (_sentences(left, named) or _sentences(right, named)):
                        lines = range(node.lineno, (node.end_lineno or node.lineno) + 1)
                        marked = any(comments.get(n, "").startswith(MARKS) for n in lines)
                        found[(compare.lineno, compare.col_offset)] = (compare.lineno, marked)
    return [found[key] for key in sorted(found)]


def _all() -> dict[str, list[tuple[int, bool]]]:
    return {p.name: whole_sentence_asserts(p) for p in sorted(UNIT.glob("test_*.py"))}


def test_a_whole_sentence_is_asserted_only_where_it_is_the_contract():
    found = _all()
    unmarked = [f"{name}:{line}" for name, lines in found.items() for line, marked in lines if not marked]
    assert not unmarked, "assert the status, node, check and the cause's and fix's key words instead: " + ", ".join(
        unmarked
    )
    marked = sum(marked for lines in found.values() for _, marked in lines)
    assert marked <= MOST_MARKED, f"{marked} whole-sentence assertions, {MOST_MARKED} were left: assert key words"


def test_the_guard_sees_a_pinned_sentence_and_its_mark(tmp_path):
    sample = tmp_path / "test_sample.py"
    sample.write_text(
        "def test_x(r):\n"
        '    assert r.message == "node1: GPU 3 link 1 inactive"\n'
        '    assert (r.status, r.message) == (1, f"{r.host}: no Xid since boot")\n'
        '    assert r.verdict == "NOT READY: 2 check(s) failed"  # contract: the verdict line\n'
        '    assert r.name == "gpu.ecc" and "link 1" in r.message\n'
        '    said = "node2: differs: lib/model.py (compared with node1)"\n'
        "    assert r.problems == [said]\n"
    )
    assert whole_sentence_asserts(sample) == [(2, False), (3, False), (4, True), (7, False)]
