"""clustercheck's layers point one way: no import cycle between its subpackages and top-level modules, and the
pure checks import without the SSH library (docs/architecture.md gives the order)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "clustercheck"
NODE_SIDE = "remote"  # the programs that run on the nodes: bundled on their own, they import no clustercheck


def unit(module: str) -> str | None:
    """clustercheck.stages.core -> stages, clustercheck.config -> config; None outside clustercheck's parts."""
    parts = module.split(".")
    if parts[0] != "clustercheck" or len(parts) < 2 or parts[1] in ("__main__", NODE_SIDE):
        return None
    return parts[1]


def imports(path: Path) -> set[str]:
    """The clustercheck modules PATH imports, wherever in the file (a function's lazy import counts too)."""
    here = list(path.relative_to(PACKAGE.parent).parts[:-1])  # the package the file is in
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = here[: len(here) - node.level + 1]
                base = ".".join([*package, base] if base else package)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from clustercheck import catalog`
    return found


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        source = unit(module)
        if source is None:
            continue
        for target in filter(None, map(unit, imports(path))):
            if target != source and ((PACKAGE / target).is_dir() or (PACKAGE / f"{target}.py").exists()):
                edges.setdefault(source, set()).add(target)
    return edges


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as the path that closes it, or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for target in sorted(edges.get(node, ())):
            found = visit(target, [*path, node])
            if found:
                return found
        done.add(node)
        return None

    for start in sorted(edges):
        found = visit(start, [])
        if found:
            return found
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert cycle({"config": {"transport"}, "transport": {"inventory", "config"}}) == ["config", "transport", "config"]
    assert cycle({"run": {"stages"}, "stages": {"checks"}}) is None


def test_no_import_cycle_between_clustercheck_subpackages():
    edges = graph()
    assert edges["run"] >= {"stages"} and "launcher" in edges["commands"]  # the walk sees the imports it must
    assert cycle(edges) is None, " -> ".join(cycle(edges) or [])


def test_the_pure_layers_import_without_paramiko():
    checks = sorted(p.stem for p in (PACKAGE / "checks").glob("*.py") if p.stem != "__init__")
    assert "consistency" in checks and "nccl_net" in checks
    modules = [
        "clustercheck.checks",
        *(f"clustercheck.checks.{name}" for name in checks),
        "clustercheck.catalog",
        "clustercheck.selection",
    ]
    script = f"""
import importlib, sys

class NoParamiko:
    def find_spec(self, name, path=None, target=None):
        if name == "paramiko" or name.startswith("paramiko."):
            raise ImportError("paramiko is blocked here")
        return None

sys.meta_path.insert(0, NoParamiko())
for name in list(sys.modules):
    if name.startswith("paramiko"):
        del sys.modules[name]
for module in {modules!r}:
    importlib.import_module(module)
assert "paramiko" not in sys.modules
print("imported", len({modules!r}))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"imported {len(modules)}" in proc.stdout
    blocked = subprocess.run(
        [sys.executable, "-c", script.replace(repr(modules), repr(["clustercheck.transport.ssh"]))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "paramiko is blocked here" in blocked.stderr  # the blocker does block


MODULE_LINES = 600  # a module a reader takes in whole
FUNCTION_LINES = 80  # a function a reader takes in on a screen, its docstring left out


def function_lengths(path: Path) -> list[tuple[str, int]]:
    """(name, lines) of every function in PATH, from its first statement after the docstring to its end."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and len(body) > 1:
                body = body[1:]
            found.append((f"{path.name}:{node.lineno} {node.name}", node.end_lineno - body[0].lineno + 1))
    return found


def test_the_length_finder_leaves_the_docstring_out(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('def f():\n    """Doc,\n    on two lines."""\n    a = 1\n    return a\n')
    assert [n for _, n in function_lengths(sample)] == [2]


def test_every_module_and_function_reads_whole():
    """No module of clustercheck over MODULE_LINES lines and no function over FUNCTION_LINES: past them a reader
    loses the thread, and the next feature copies a piece instead of finding it."""
    modules = sorted(PACKAGE.rglob("*.py"))
    long_modules = [
        f"{p.relative_to(PACKAGE.parent)} ({n})"
        for p in modules
        if (n := len(p.read_text().splitlines())) > MODULE_LINES
    ]
    long_functions = [
        f"{p.parent.name}/{name} ({n})" for p in modules for name, n in function_lengths(p) if n > FUNCTION_LINES
    ]
    assert not long_modules, f"over {MODULE_LINES} lines: " + ", ".join(long_modules)
    assert not long_functions, f"over {FUNCTION_LINES} lines: " + ", ".join(long_functions)


SLURM_COMMANDS = ("salloc", "sbatch", "scancel", "scontrol", "sinfo", "squeue", "srun")


def test_slurm_is_called_from_the_slurm_package_only():
    """Slurm's commands run through clustercheck/slurm (its call.py, and step.py's srun lines): an argv that starts with
    one of them appears nowhere else."""
    outside = []
    for path in PACKAGE.rglob("*.py"):
        if path.is_relative_to(PACKAGE / "slurm"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.List | ast.Tuple) and node.elts:
                first = node.elts[0]
                if isinstance(first, ast.Constant) and first.value in SLURM_COMMANDS:
                    outside.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {first.value}")
    assert not outside, "Slurm called outside clustercheck/slurm: " + ", ".join(outside)
