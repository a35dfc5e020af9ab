"""Node-side code has one shape (issue 53): a program that runs on a node is a module under clustercheck/remote/
(Python, or a shell script file where it must run before the node's Python is known), and a command reaches a node
through its transport only from clustercheck/transport/ and stages/nodeprogram.py. docs/architecture.md ("Node-side
code") names the exceptions below and why."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "clustercheck"

# Program text, as these tests define it: a string (not a docstring) that holds a shebang, a shell compound command
# (if/for/while/until/case closed by fi/done/esac), or three lines or more of Python with an import or a def. A
# one-line wrapper that only changes how argv runs (cd DIR && exec "$@") is argv, not a program.
SHELL_OPENS = re.compile(r"(?:^|[;\n&|(]\s*)(?:if|for|while|until|case)\s")
SHELL_CLOSES = re.compile(r"(?:^|[;\n]\s*)(?:fi|done|esac)\b")
PYTHON = re.compile(r"^\s*(?:import \w|from \w[\w.]* import |def \w+\()", re.M)

# (module, the top-level name that holds the text): the measured exceptions, each with why it stays.
PROGRAM_TEXT_ALLOWED = {
    # The transport's own shell: a checked upload (WRITE_CHECKED) and the sweeps of this run's and earlier runs'
    # processes, run before any Python is known on the node and built with the run's own values.
    ("transport/__init__.py", "WRITE_CHECKED"),
    ("transport/__init__.py", "stale_sweep_script"),
    # The first command: the clock, the identity, finding the node's Python (before any is known), composed with the
    # run's values and the stale-run sweep.
    ("facts/firstcommand.py", "first_script"),
    # One-line wrappers that shape argv and exec it, beside the code that builds that argv: the container's start
    # (the mounts' directories made, then docker run with the run's label) and a foreground job's directory (~
    # expanded, cd, exec).
    ("container.py", "RUN"),
    ("launcher/job.py", "_CD"),
    # The sbatch file written for the user beside the run (launch --slurm), not a program sent to a node.
    ("slurm/batch.py", "script"),
}

# (module, the function that calls `.run(` on a transport): the named exceptions.
TRANSPORT_RUN_ALLOWED = {
    # The Slurm step transport's own first step, made where Slurm's side of a step lives (transport/srun.py is the
    # transport; slurm/step.py its factory, which proves a step runs).
    ("slurm/step.py", "connect"),
    # Reach's fan-out to every node at once (`jobs`, `logs`, `stop`): the threads under nodeprogram's callers.
    ("reach.py", "run"),
}


def modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        yield relative, ast.parse(path.read_text(), relative)


def owners(tree: ast.Module):
    """(node, the name of the top-level statement or the innermost function that holds it) for every node."""

    def walk(node, owner):
        for child in ast.iter_child_nodes(node):
            name = owner
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = child.name
            elif node is tree and isinstance(child, ast.Assign | ast.AnnAssign):
                target = child.targets[0] if isinstance(child, ast.Assign) else child.target
                name = target.id if isinstance(target, ast.Name) else owner
            yield child, name
            yield from walk(child, name)

    yield from walk(tree, "<module>")


def docstrings(tree: ast.Module) -> set[int]:
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def is_program(text: str) -> bool:
    shell = bool(SHELL_OPENS.search(text) and SHELL_CLOSES.search(text))
    return "#!/" in text or shell or (text.count("\n") >= 2 and bool(PYTHON.search(text)))


def strings(tree: ast.Module):
    """(owner, text) of every string literal but docstrings; an f-string's text with {} for its values."""
    skip = docstrings(tree)
    for node, owner in owners(tree):
        if isinstance(node, ast.JoinedStr):
            yield owner, "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            yield owner, node.value


def program_texts() -> set[tuple[str, str]]:
    return {
        (relative, owner)
        for relative, tree in modules()
        if not relative.startswith("remote/")
        for owner, text in strings(tree)
        if is_program(text)
    }


def transport_runs() -> set[tuple[str, str]]:
    """(module, owner) of every `X.run(...)` whose X names a transport, outside transport/ and nodeprogram."""
    found = set()
    for relative, tree in modules():
        if relative.startswith("transport/") or relative == "stages/nodeprogram.py":
            continue
        for node, owner in owners(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "run"
                and "transport" in ast.unparse(node.func.value).lower()
            ):
                found.add((relative, owner))
    return found


def test_the_definition_finds_python_and_shell_programs_and_leaves_argv_and_prose_alone():
    assert is_program("import sys\nimport json\nprint(json.dumps(sys.argv))\n")
    assert is_program('d=$1; if [ -d "$d" ]; then rm -rf "$d"; fi')
    assert is_program('for f in a b; do echo "$f"; done')
    assert is_program("#!/bin/sh\necho hello")
    assert not is_program('cd "$1" || exit 125; shift; exec "$@"')
    assert not is_program("if the node answers, then it is done")
    assert not is_program("import torch failed on node1")


def test_no_module_outside_remote_holds_node_side_program_text():
    found = program_texts()
    assert found - PROGRAM_TEXT_ALLOWED == set(), "move the program into clustercheck/remote/ (docs/architecture.md)"


def test_only_the_transport_and_nodeprogram_run_commands_on_a_node():
    found = transport_runs()
    assert found - TRANSPORT_RUN_ALLOWED == set(), "run it through stages/nodeprogram.py (run or call)"


def test_every_named_exception_is_still_there():
    """An exception that has gone is taken off its list, so that the lists never hide a new one."""
    assert PROGRAM_TEXT_ALLOWED - program_texts() == set()
    assert TRANSPORT_RUN_ALLOWED - transport_runs() == set()
