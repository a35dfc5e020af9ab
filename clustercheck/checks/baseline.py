"""This run against an earlier report of the same cluster (`clustercheck run --baseline REPORT.json`, and
`clustercheck diff`): the figures a cluster degrades in quietly, and the versions the consistency checks compare.
Pure logic over report documents (the JSON report's `hosts` and `checks`), no I/O.

A figure that got worse than the baseline by more than its tolerance (percent, per figure, `--baseline-tolerance
FIGURE=WARN[:FAIL]`) is a WARN, or a FAIL past the second bound, naming the node or pair, then and now:
`node3 -> node1 throughput 9.1 Gbit/s, baseline 23.4 Gbit/s (-61 %)`. A node or pair that only one of the two
reports measured is said, never judged. The figures measured in repetitions (the all_reduce sweep's busbw, the DDP
step) are compared by their medians, and the spread of both runs is allowed for on top of the tolerance; one too
noisy to judge is at most a WARN, and says so (`gloo on CPU: too noisy to judge past a WARN`): the rule is
baseline_compare.py's, the figures' extraction from a report baseline_figures.py's.

Only the nodes both reports checked are compared. A figure of the whole cluster (its all_reduce busbw, its DDP
step) depends on the nodes it was measured across, so it is compared only when both reports checked the same
nodes, and said otherwise; a baseline with no node in common is a report of another cluster: baseline.versions
FAILs naming both sets of nodes, and nothing is compared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clustercheck.checks.baseline_compare import (
    DEFAULT_TOLERANCES,
    Change,
    Comparison,
    Nodes,
    Tolerance,
    ToleranceError,
    VersionChange,
    compare_reports,
    node_sets,
    parse_tolerances,
    version_changes,
)
from clustercheck.checks.baseline_figures import FIGURES, GPU_PERF, Figure, versions
from clustercheck.checks.registry import declare, emit
from clustercheck.model import CheckResult, Status

__all__ = [  # what the commands, the diff and the tests take from here (the comparison is baseline_compare's)
    "DEFAULT_TOLERANCES",
    "FIGURES",
    "STAGE",
    "VERSIONS",
    "Baseline",
    "Change",
    "Nodes",
    "Tolerance",
    "ToleranceError",
    "VersionChange",
    "compare_reports",
    "evaluate",
    "node_sets",
    "parse_tolerances",
    "version_changes",
]

STAGE = "baseline"
VERSIONS = "baseline.versions"


@dataclass(frozen=True)
class Baseline:
    """The earlier report a run is compared with: its document (validated), where it came from, the tolerances."""

    document: dict[str, Any]
    source: str
    tolerances: dict[str, Tolerance]


# ---------------------------------------------------------------------------------------------- the checks

for _figure, _proves in (
    (
        "busbw",
        "all_reduce bus bandwidth at each message size from 1 MiB (across the cluster, and within each node; the "
        "median of its timed repetitions) has not fallen below the baseline report's by more than its tolerance "
        "beyond the spread of both runs",
    ),
    (
        "rtt",
        "no measured node pair's TCP round trip time has risen above the baseline report's by more than its tolerance",
    ),
    (
        "throughput",
        "no measured node pair's TCP throughput (each way) has fallen below the baseline report's by more "
        "than its tolerance",
    ),
    (
        "fabric",
        "no node's rail (its median send/recv figure in the fabric pair rounds, fabric.pairs) has fallen below the "
        "baseline report's by more than its tolerance",
    ),
    (
        "ddp_step",
        "the DDP stage's time per training step (the median of its timed steps) has not risen above the baseline "
        "report's by more than its tolerance beyond the spread of both runs",
    ),
):
    declare(
        f"baseline.{_figure}",
        stage=STAGE,
        scope="cluster",
        proves=f"with --baseline: {_proves}",
        fix="Find what changed since the baseline on the node or pair named (a link renegotiated at a lower speed: "
        "`ethtool IFACE`; a traffic shaper: `tc qdisc show`; another job on the node; a driver or NCCL update); "
        "`clustercheck diff BASELINE.json NEW.json` lists every change.",
    )
declare(
    "baseline.collector",
    stage=STAGE,
    scope="node",
    proves="with --baseline: the node's facts collector has not slowed down past the baseline report's by more than "
    "its tolerance",
    fix="Look at what slows the node: its load (`uptime`, `top`), a slow or full disk, a hung mount, a slow "
    "`import torch` (a changed environment).",
)
declare(
    f"baseline.{GPU_PERF}",
    stage=STAGE,
    scope="node",
    proves="with --baseline: none of the node's GPUs (matched by bus id) multiplies or copies (the gpu.perf.* "
    "figures) slower than in the baseline report by more than its tolerance",
    fix="Look at the named GPU as gpu.perf.*'s fixes say (clocks and throttle reasons, power cap, temperature, "
    "PCIe link: nvidia-smi -q -d PERFORMANCE,CLOCK,POWER,PCIE); a driver or firmware update since the baseline; "
    "`clustercheck diff BASELINE.json NEW.json` lists every change.",
)
declare(
    VERSIONS,
    stage=STAGE,
    scope="cluster",
    proves="with --baseline: every node runs the versions (torch, CUDA, NCCL, driver, VBIOS, Python) and has the "
    "facts (GPU count, MTU) the consistency checks compare that it had in the baseline, and the same nodes are "
    "checked",
    fix="If the change was not intended, reinstall the baseline's versions (the setup playbook pins them); if it "
    "was, take a new baseline.",
)

SHOWN = 5  # regressions named in a message; the data has them all


def _source(baseline: Baseline) -> str:
    started = baseline.document.get("started_at")
    return baseline.source + (f" of {started}" if started else "")


CLUSTER_FIGURES = ("busbw", "rtt", "throughput", "fabric", "ddp_step")  # one result each
# one result per node, and what its SKIP says where the node has none of the figure now
NODE_FIGURES = {"collector": "its facts were not collected now", GPU_PERF: "no GPU of it measured now"}


def evaluate(baseline: Baseline, current: dict[str, Any]) -> list[CheckResult]:
    """Every baseline.* check of CURRENT (a report document: its hosts and checks) against BASELINE."""
    nodes = node_sets(baseline.document, current)
    if nodes.unrelated:
        return _unrelated(baseline, nodes)
    comparisons = compare_reports(baseline.document, current, baseline.tolerances)
    results = []
    for name in CLUSTER_FIGURES:
        results.append(_figure_result(comparisons[name], baseline, nodes))
    for name in NODE_FIGURES:
        results += _node_results(comparisons[name], baseline, nodes)
    results.append(_versions_result(baseline, current, nodes))
    return results


def _unrelated(baseline: Baseline, nodes: Nodes) -> list[CheckResult]:
    """A baseline with no node in common: nothing is compared, and baseline.versions FAILs naming both sets."""
    why = "not compared: no node in common with the baseline"
    data = {"baseline": _source(baseline), **_node_data(nodes)}
    results = [emit(f"baseline.{name}", Status.SKIP, why, data=data) for name in CLUSTER_FIGURES]
    results += [
        emit(f"baseline.{name}", Status.SKIP, why, host=host, data=data) for name in NODE_FIGURES for host in nodes.now
    ]
    results.append(
        emit(
            VERSIONS,
            Status.FAIL,
            f"no node in common with the baseline: {_source(baseline)} checked {', '.join(nodes.baseline) or 'none'}; "
            f"this run checked {', '.join(nodes.now)}. Nothing was compared: it is a report of other nodes (another "
            "cluster's, or these under other names)",
            remediation="Give --baseline a JSON report of these nodes, under the names this run gives them (the "
            "inventory's); take one with `clustercheck run --hosts INVENTORY --format json -o baseline.json`.",
            data={**data, "changes": [], "hosts_added": nodes.added, "hosts_gone": nodes.gone},
        )
    )
    return results


def _node_data(nodes: Nodes) -> dict[str, Any]:
    return {"nodes": {"baseline": nodes.baseline, "now": nodes.now, "common": nodes.common}}


def _data(comparison: Comparison, baseline: Baseline, nodes: Nodes) -> dict[str, Any]:
    tolerance = baseline.tolerances[comparison.figure]
    return {
        "baseline": _source(baseline),
        "tolerance": {"warn_pct": tolerance.warn_pct, "fail_pct": tolerance.fail_pct},
        "changes": [c.to_dict() for c in comparison.changes],
        "not_in_baseline": comparison.not_in_baseline,
        "not_measured_now": comparison.not_measured_now,
        "not_compared": comparison.not_compared,
        **_node_data(nodes),
    }


def _not_compared(comparison: Comparison, nodes: Nodes) -> str:
    keys = comparison.not_compared
    return f"not compared, measured across other nodes ({nodes.across()}): {', '.join(keys[:SHOWN])}"


def _notes(comparison: Comparison, nodes: Nodes) -> str:
    notes = []
    if comparison.not_compared:
        notes.append(_not_compared(comparison, nodes))
    if comparison.not_in_baseline:
        notes.append(f"not in the baseline: {', '.join(comparison.not_in_baseline[:SHOWN])}")
    if comparison.not_measured_now:
        notes.append(f"in the baseline, not measured now: {', '.join(comparison.not_measured_now[:SHOWN])}")
    if comparison.without_baseline_spread:
        notes.append("the baseline recorded no spread (an older clustercheck's report): judged on the values alone")
    return "".join(f"; {n}" for n in notes)


def _figure_result(comparison: Comparison, baseline: Baseline, nodes: Nodes) -> CheckResult:
    name = f"baseline.{comparison.figure}"
    figure = FIGURES[comparison.figure]
    data = _data(comparison, baseline, nodes)
    if not comparison.changes:
        if comparison.not_compared:
            return emit(name, Status.SKIP, _not_compared(comparison, nodes), data=data)
        if not comparison.not_in_baseline:
            return emit(name, Status.SKIP, "not measured in this run", data=data)
        return emit(
            name,
            Status.PASS,
            f"{name}: nothing to compare, the baseline has no such figure{_notes(comparison, nodes)}",
            data=data,
        )
    return _judged_result(name, None, comparison, figure, baseline, nodes, data)


def _judged_result(
    name: str,
    host: str | None,
    comparison: Comparison,
    figure: Figure,
    baseline: Baseline,
    nodes: Nodes,
    data: dict,
) -> CheckResult:
    regressions = comparison.regressions
    tolerance = baseline.tolerances[comparison.figure]
    notes = _notes(comparison, nodes)
    if regressions:
        worst = Status.FAIL if any(c.status is Status.FAIL for c in regressions) else Status.WARN
        more = f"; and {len(regressions) - SHOWN} more" if len(regressions) > SHOWN else ""
        text = "; ".join(c.message for c in regressions[:SHOWN]) + more
        return emit(name, worst, f"{text} ({tolerance.describe()}){notes}", host=host, data=data)
    judged = [c for c in comparison.changes if c.change_pct is not None]
    if len(comparison.changes) == 1 and judged:
        text = f"{comparison.changes[0].message}: within its tolerance"
    else:
        largest = max(judged, key=lambda c: abs(c.change_pct or 0), default=None)
        text = f"{len(judged)} figure(s) within their tolerance of the baseline" + (
            f" (largest change: {largest.message})" if largest else ""
        )
    return emit(name, Status.PASS, text + notes, host=host, data=data)


def _node_results(comparison: Comparison, baseline: Baseline, nodes: Nodes) -> list[CheckResult]:
    """A node's own figures (keyed by the node, or by the node and more: 'node1 GPU 00000000:18:00.0 ...'), one
    result per node."""
    name = f"baseline.{comparison.figure}"
    figure = FIGURES[comparison.figure]
    results = []
    for host in nodes.now:

        def own(keys: list[str], host: str = host) -> list[str]:
            return [k for k in keys if k.split(" ", 1)[0] == host]

        changes = [c for c in comparison.changes if c.key.split(" ", 1)[0] == host]
        mine = Comparison(comparison.figure, changes, own(comparison.not_in_baseline), own(comparison.not_measured_now))
        data = _data(mine, baseline, nodes)
        if mine.changes:
            results.append(_judged_result(name, host, mine, figure, baseline, nodes, data))
        elif mine.not_in_baseline:
            results.append(emit(name, Status.PASS, f"{host}: not in the baseline, nothing to compare", host=host))
        else:
            results.append(emit(name, Status.SKIP, NODE_FIGURES[comparison.figure], host=host, data=data))
    return results


def _versions_result(baseline: Baseline, current: dict[str, Any], nodes: Nodes) -> CheckResult:
    changed = version_changes(baseline.document, current)
    added, gone = nodes.added, nodes.gone
    data = {
        "baseline": _source(baseline),
        "changes": [c.to_dict() for c in changed],
        "hosts_added": added,
        "hosts_gone": gone,
        **_node_data(nodes),
    }
    notes = []
    if added or gone:
        notes.append(f"compared on the node(s) in both: {', '.join(nodes.common)}")
    if added:
        notes.append(f"not in the baseline: {', '.join(added)}")
    if gone:
        notes.append(f"in the baseline, not checked now: {', '.join(gone)}")
    if changed:
        more = f"; and {len(changed) - SHOWN} more" if len(changed) > SHOWN else ""
        text = "; ".join(c.message for c in changed[:SHOWN]) + more
        return emit(VERSIONS, Status.WARN, "; ".join([text, *notes]), data=data)
    compared = versions(current.get("checks", []))
    if not any(compared.values()):
        return emit(VERSIONS, Status.SKIP, "; ".join(["no versions collected in this run", *notes]), data=data)
    what = ", ".join(sorted(c.removeprefix("consistency.") for c in compared))
    return emit(VERSIONS, Status.PASS, "; ".join([f"the same {what} as the baseline", *notes]), data=data)
