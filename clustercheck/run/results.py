"""The run's results as the report gives them: a deselected check said SKIP in the shape a run gives, nodes.distinct
from what each node's first command read, the comparison with an earlier report (--baseline), and the last touches
every result gets (torch's pin, the setup role's fix command).
"""

from __future__ import annotations

import time

from clustercheck.checks import baseline, connection, registry, setup_roles, torchinstall
from clustercheck.config import RunConfig
from clustercheck.facts.model import NodeFacts
from clustercheck.inventory import Node
from clustercheck.model import CheckResult
from clustercheck.run.record import RunRecord
from clustercheck.selection import Selection


def deselect(result: CheckResult, selection: Selection) -> CheckResult:
    """RESULT, or its SKIP where SELECTION leaves its check out."""
    if selection.check_selected(result.name):
        return result
    return registry.get(result.name).not_run(result.host, selection.why_not_check(result.name))


def distinct(nodes: list[Node], selection: Selection, record: RunRecord) -> CheckResult:
    check = registry.get("nodes.distinct")
    if not selection.check_selected(check.name):  # still, nothing ran twice on one machine
        return check.not_run(None, selection.why_not_check(check.name))
    finding = connection.distinct_finding(
        [n.name for n in nodes], {n.name: n.address for n in nodes}, record.same, record.identities
    )
    return check.result(None, finding)


def compared(config: RunConfig, hosts: tuple[str, ...], results: list[CheckResult]) -> tuple[list, dict[str, float]]:
    """With --baseline: this run's results against the earlier report's (nothing reported without it), and the
    seconds the comparison took, under the baseline stage's name (nothing when it did not run)."""
    given = config.baseline
    if given is None:
        return [], {}
    selection = config.selection
    if not selection.stage_selected(baseline.STAGE):
        why = selection.why_not_stage(baseline.STAGE)
        checks = registry.of_stage(baseline.STAGE)
        return [r for check in checks for r in registry.skipped(check, list(hosts), why)], {}
    started = time.monotonic()
    current = {"hosts": list(hosts), "checks": [r.to_dict() for r in results]}
    found = [deselect(r, selection) for r in baseline.evaluate(given, current)]
    return found, {baseline.STAGE: time.monotonic() - started}


def finished(results: list[CheckResult], facts: dict[str, NodeFacts], config: RunConfig) -> list[CheckResult]:
    """RESULTS with the torch each node runs pinned in their fixes, and the setup role's command in theirs."""
    torches = {name: f.torch.version if f.torch else None for name, f in facts.items()}
    results = torchinstall.with_pinned_torch(results, torches)
    return setup_roles.with_fix_commands(results, config.inventory)
