"""Facts are declared once (issue 53): every NodeFacts field says where its value comes from, the collector fills
them from those declarations alone, and the facts are frozen after it: a stage that learns more returns new facts.
A hung chronyc reaches time.sync through the declared `time` fact and the registry's hung-probe rule."""

from __future__ import annotations

import ast
import json
from dataclasses import FrozenInstanceError, fields
from pathlib import Path

import pytest
from test_checks import by_name, node_facts

from clustercheck.facts import model
from clustercheck.facts.model import HUNG, NodeFacts
from clustercheck.model import Status

PACKAGE = Path(__file__).resolve().parents[2] / "clustercheck"
RECORDS = Path(__file__).parent / "records"


def recorded_keys() -> set[str]:
    """Every key the recorded collector outputs hold: top-level ones, and "commands.X" for each command."""
    keys: set[str] = set()
    for path in RECORDS.glob("facts-*.json"):
        raw = json.loads(path.read_text())
        keys |= set(raw) | {f"commands.{name}" for name in raw.get("commands") or {}}
    return keys


def test_every_nodefacts_field_is_declared_with_where_its_value_comes_from():
    declarations = model.declarations()
    assert set(declarations) == {f.name for f in fields(NodeFacts)}
    kinds = {name: getattr(d, "kind", type(d).__name__) for name, d in declarations.items()}
    assert kinds["time"] == kinds["smi"] == kinds["kernel_log"] == "Collected"
    assert kinds["os"] == "Fact"
    assert kinds["gpu_bench"] == kinds["dcgm"] == kinds["gpu_burn"] == kinds["image"] == "learnt"
    assert kinds["python"] == kinds["cluster_size"] == kinds["models"] == "given"
    assert kinds["interface"] == "derived"


def test_every_collected_fact_reads_keys_the_collector_reports():
    known = recorded_keys()
    for name, declaration in model.declarations().items():
        if isinstance(declaration, model.Collected):
            assert declaration.keys, name
            unknown = [key for key in declaration.keys if key not in known]
            assert not unknown, f"{name} reads {unknown}, which no recorded collector output holds"


def test_facts_are_frozen_after_collection():
    facts = node_facts()
    with pytest.raises(FrozenInstanceError):
        facts.gpu_bench = None  # type: ignore[misc]


def assignments_to_facts(tree: ast.AST) -> list[str]:
    """`facts.X = ...` (and setattr(facts, ...)) on a name that holds facts: what a frozen record refuses."""
    names = {f.name for f in fields(NodeFacts)}

    def holds_facts(value: ast.AST) -> bool:
        return isinstance(value, ast.Name) and ("facts" in value.id or value.id in ("rebuilt", "f"))

    found = []
    for node in ast.walk(tree):
        targets = [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        targets = node.targets if isinstance(node, ast.Assign) else targets
        for target in targets:
            for one in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(one, ast.Attribute) and one.attr in names and holds_facts(one.value):
                    found.append(f"{node.lineno}: {ast.unparse(one)} =")
        call = isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
        if call and node.args and holds_facts(node.args[0]):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_nothing_in_clustercheck_assigns_to_facts_after_collection():
    found = {
        str(path.relative_to(PACKAGE.parent)): hits
        for path in sorted(PACKAGE.rglob("*.py"))
        if (hits := assignments_to_facts(ast.parse(path.read_text())))
    }
    assert not found, f"facts changed in place (return new facts with dataclasses.replace): {found}"


def test_the_scan_finds_an_assignment_to_facts():
    assert assignments_to_facts(ast.parse("facts.models = catalog\nsetattr(facts, 'smi', None)\n"))


def test_a_hung_chronyc_is_the_time_fact_that_hung_and_time_sync_fails_by_the_hung_probe_rule():
    hung = {"error": f"{HUNG}chronyc -n tracking gave no answer within 7 s"}
    facts = node_facts(commands={"chronyc": hung})
    assert facts.time is None and facts.missing["time"].startswith(HUNG)
    result = by_name(facts)["time.sync"]
    assert result.status is Status.FAIL and "chronyc -n tracking gave no answer" in result.message
    assert "reboot" in result.remediation  # the hung-probe rule's fix: find what hangs there
    # Where timedatectl says the clock is synchronized, a hung chronyc leaves it so, as before.
    synced = {"rc": 0, "out": "NTPSynchronized=yes\n"}
    fine = node_facts(commands={"chronyc": hung, "timedatectl": synced})
    assert fine.time is not None and fine.time.synchronized
    assert by_name(fine)["time.sync"].status is Status.PASS
