"""Every result a run emits comes through the check registry: the name is declared, the declared fix arrives."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from wording import says

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


def test_every_result_carries_its_stage_and_a_skip_its_reason_as_data():
    from clustercheck.selection import Selection

    tcp = registry.emit("network.tcp", Status.PASS, "every node reaches every node")
    assert tcp.stage == "network" and tcp.skip is None
    own = registry.get("gpu.nvlink").result("node1", registry.skip("one GPU on this node: no NVLink"))
    assert own.message == "node1: one GPU on this node: no NVLink"  # contract: the SKIP format, the host in front
    assert own.stage == "core" and own.skip.reason == "one GPU on this node: no NVLink"  # verbatim: the reason given
    assert own.skip.deselected_by is None
    left_out = registry.skipped(
        registry.get("ddp_equivalence"), ["node1"], Selection(skip=("ddp",)).why_not_stage("ddp")
    )
    (ddp,) = left_out
    assert ddp.message == "ddp_equivalence skipped: not selected (--skip ddp)"  # contract: model.skipped_message
    assert ddp.stage == "ddp" and says(ddp.skip.reason, "not selected", "--skip ddp")
    assert ddp.skip.deselected_by == "--skip ddp"
    per_node = registry.skipped(registry.get("local.allreduce"), ["node1", "node2"], "torch does not import")
    assert [r.message for r in per_node] == [
        f"{h}: local.allreduce skipped: torch does not import" for h in ("node1", "node2")
    ]
    assert {r.skip.reason for r in per_node} == {"torch does not import"}
    # A stage's SKIP on a node is worded by the registry too: its reason without the host, the host in front.
    stage_own = registry.emit(
        "allreduce.bandwidth.intra_node", Status.SKIP, "no bandwidth results: sweep not run", host="node2"
    )
    assert stage_own.message == "node2: no bandwidth results: sweep not run"  # contract: the SKIP format
    assert stage_own.skip.reason == "no bandwidth results: sweep not run"  # verbatim: the reason given


def test_the_message_of_a_check_that_did_not_run_is_worded_in_one_place():
    """model.skipped_message builds it; a module that wrote `NAME skipped: ...` itself would be a second copy the
    reports could drift from (the text report's own folded line, `N skipped: REASON`, is a report line)."""
    allowed = {"model.py", "report/text.py"}
    found = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if str(path.relative_to(PACKAGE)) not in allowed and path.parent.name != "remote"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"[\"'][^\"']*skipped: |skipped'\}: ", line)  # in a string: `f"{c.name} skipped: {why}"`
    ]
    assert found == []


def test_a_selection_says_which_options_left_a_check_out():
    from clustercheck.selection import Selection

    selection = Selection(only=("core", "network"), skip=("network.rtt", "local.*", "gpu.*"))
    assert selection.why_not_stage("ddp").deselected_by == "--only core network"
    assert says(selection.why_not_check("local.allreduce").reason, "not selected", "--skip local.*")
    assert selection.why_not_checks(["network.rtt", "gpu.ecc"]).deselected_by == "--skip network.rtt gpu.*"
    assert Selection(skip=("ddp",)).why_not_stage("ddp").deselected_by == "--skip ddp"
