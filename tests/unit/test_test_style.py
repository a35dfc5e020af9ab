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
MOST_MARKED = 10_000
WORDS = 4  # a string of four words or more is a sentence, not a name, a value or a state


def _sentences(node: ast.AST) -> bool:
    """Whether an expression is, or holds, a string literal of WORDS words or more."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return len(node.value.split()) >= WORDS
    if isinstance(node, ast.JoinedStr):
        text = "".join(v.value if isinstance(v, ast.Constant) else "x" for v in node.values)
        return len(text.split()) >= WORDS
    if isinstance(node, ast.BinOp):
        return _sentences(node.left) or _sentences(node.right)
    if isinstance(node, (ast.Tuple, ast.List)):
        return any(_sentences(e) for e in node.elts)
    return False


def _comments(source: str) -> dict[int, str]:
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return {t.start[0]: t.string for t in tokens if t.type == tokenize.COMMENT}


def whole_sentence_asserts(path: Path) -> list[tuple[int, bool]]:
    """(line, marked) for each `==` in an assert with a sentence on one side."""
    source = path.read_text()
    comments = _comments(source)
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Assert):
            continue
        for compare in ast.walk(node.test):
            if not isinstance(compare, ast.Compare):
                continue
            sides = [compare.left, *compare.comparators]
            for op, left, right in zip(compare.ops, sides, sides[1:], strict=False):
                if isinstance(op, ast.Eq) and (_sentences(left) or _sentences(right)):
                    lines = range(node.lineno, (node.end_lineno or node.lineno) + 1)
                    marked = any(comments.get(n, "").startswith(MARKS) for n in lines)
                    found.append((compare.lineno, marked))
    return found


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
    )
    assert whole_sentence_asserts(sample) == [(2, False), (3, False), (4, True)]
