"""Every result a run emits comes through the check registry: the name is declared, the declared fix arrives."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import clustercheck
from clustercheck.checks import network, registry
from clustercheck.model import Status

PACKAGE = Path(clustercheck.__file__).parent
MAKERS = {"model.py", "checks/registry.py"}  # where a CheckResult is defined, and the one place that builds them


def test_no_result_is_built_outside_the_registry():
    built = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if str(path.relative_to(PACKAGE)) not in MAKERS
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bCheckResult\(", line)
    ]
    assert built == []


def test_a_result_under_an_undeclared_name_is_refused():
    with pytest.raises(registry.UndeclaredCheck, match=r"'network\.rtt_typo' is not declared"):
        registry.result("network.rtt_typo", None, registry.warn("slow"))
    with pytest.raises(registry.UndeclaredCheck):
        registry.emit("network.rtt_typo", Status.WARN, "slow")


def test_a_stage_checks_warning_carries_its_declared_fix_and_its_own_fix_wins():
    records = {
        "node1": {"perf": [{"peer": "node2", "round": 0, "error": "node2 did not connect within 10 s"}]},
        "node2": {"perf": [{"peer": "node1", "round": 0, "error": "node1 did not connect within 10 s"}]},
    }
    rtt, throughput = network.perf_checks(records)
    assert rtt.status is Status.WARN and rtt.remediation == registry.get("network.rtt").fix
    assert throughput.remediation == registry.get("network.throughput").fix
    own = registry.result("network.rtt", None, registry.warn("slow", fix="Replace the cable."))
    assert own.remediation == "Replace the cable."
    passed = registry.result("network.rtt", None, registry.passed("fast"))
    assert passed.remediation == "" and passed.message == "fast"
