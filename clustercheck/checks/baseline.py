"""This run against an earlier report of the same cluster (`clustercheck run --baseline REPORT.json`, and
`clustercheck diff`): the figures a cluster degrades in quietly, and the versions the consistency checks compare.
Pure logic over report documents (the JSON report's `hosts` and `checks`), no I/O.

A figure that got worse than the baseline by more than its tolerance (percent, per figure, `--baseline-tolerance
FIGURE=WARN[:FAIL]`) is a WARN, or a FAIL past the second bound, naming the node or pair, then and now:
`node3 -> node1 throughput 9.1 Gbit/s, baseline 23.4 Gbit/s (-61 %)`. A node or pair that only one of the two
reports measured is said, never judged.

Only the nodes both reports checked are compared. A figure of the whole cluster (its all_reduce busbw, its DDP
step) depends on the nodes it was measured across, so it is compared only when both reports checked the same
nodes, and said otherwise; a baseline with no node in common is a report of another cluster: baseline.versions
FAILs naming both sets of nodes, and nothing is compared.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from clustercheck.checks import gpuperf
from clustercheck.checks.collectives import size_text
from clustercheck.checks.netperf import RTT_MARGIN_MS
from clustercheck.checks.registry import declare, emit
from clustercheck.model import CheckResult, Status

STAGE = "baseline"
BUSBW_FROM_BYTES = 1 << 20  # busbw is compared from 1 MiB on: below it the run-to-run spread exceeds a regression


@dataclass(frozen=True)
class Figure:
    """A measured figure compared with the baseline."""

    name: str  # --baseline-tolerance takes it; its check is baseline.<name>
    what: str  # how a message names it after the node or pair
    higher_is_better: bool
    warn_pct: float  # default tolerance: WARN when worse by more than this many percent
    fail_pct: float | None  # FAIL when worse by more than this (None: never FAIL)
    floor: float = 0.0  # and the change must be larger than this, in the figure's unit (sub-ms round trips jitter)

    @property
    def check(self) -> str:
        return f"baseline.{self.name}"

    def text(self, value: float, key: str) -> str:
        """VALUE of KEY (a node or pair, or a node's GPU figure) with its unit."""
        return gpuperf.shown_in(key, value) if self.name == GPU_PERF else _UNITS[self.name](value)


def _throughput(mbps: float) -> str:
    return f"{mbps / 1000:.1f} Gbit/s" if mbps >= 1000 else f"{mbps:.0f} Mbit/s"


def _seconds(value: float) -> str:
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


_UNITS = {
    "busbw": lambda v: f"{v:.3g} GB/s",
    "rtt": lambda v: f"{v:.2f} ms",
    "throughput": _throughput,
    "ddp_step": _seconds,
    "collector": lambda v: f"{v:.1f} s",
}
GPU_PERF = "gpu_perf"  # each GPU's figures (checks/gpuperf.py), their units theirs

FIGURES = {
    f.name: f
    for f in (
        Figure("busbw", "", True, 10, 25),
        Figure("rtt", "round trip", False, 50, 200, floor=RTT_MARGIN_MS),
        Figure("throughput", "throughput", True, 20, 50),
        Figure("ddp_step", "", False, 20, 50),
        Figure("collector", "facts collector", False, 50, 200, floor=1.0),
        Figure(GPU_PERF, "", True, 10, 25),
    )
}
VERSIONS = "baseline.versions"
CLUSTER = "cluster"  # how a busbw measured across the whole cluster is named (a node's own: "node1 intra-node")
DDP_STEP = "DDP step"


def cluster_wide(key: str) -> bool:
    """Whether the figure KEY is of the whole cluster (its all_reduce across every node, its DDP step), not of one
    node or pair: it changes with the nodes it was measured across."""
    return key.startswith(f"{CLUSTER} ") or key == DDP_STEP


@dataclass(frozen=True)
class Tolerance:
    warn_pct: float
    fail_pct: float | None

    def describe(self) -> str:
        return f"WARN past {self.warn_pct:g} %" + (f", FAIL past {self.fail_pct:g} %" if self.fail_pct else "")

    @property
    def text(self) -> str:
        """As --baseline-tolerance takes it: WARN[:FAIL]."""
        return f"{self.warn_pct:g}" + (f":{self.fail_pct:g}" if self.fail_pct is not None else "")


DEFAULT_TOLERANCES = {name: Tolerance(f.warn_pct, f.fail_pct) for name, f in FIGURES.items()}


class ToleranceError(ValueError):
    """A --baseline-tolerance that cannot be read; printed as one line."""


def parse_tolerances(texts: tuple[str, ...] | list[str], option: str = "--baseline-tolerance") -> dict[str, Tolerance]:
    """`FIGURE=WARN[:FAIL]` (percent) for each given figure, over the defaults; FAIL left out: never FAIL. OPTION: the
    option they were given with, named in the error (run's --baseline-tolerance, diff's --tolerance)."""
    tolerances = dict(DEFAULT_TOLERANCES)
    for text in texts:
        figure, sep, bounds = text.partition("=")
        figure = figure.strip()
        if not sep or figure not in FIGURES:
            raise ToleranceError(
                f"{option} {text}: give FIGURE=WARN[:FAIL] in percent, FIGURE one of {', '.join(FIGURES)}"
            )
        warn_text, _, fail_text = bounds.partition(":")
        try:
            warn = float(warn_text)
            fail = float(fail_text) if fail_text else None
        except ValueError:
            raise ToleranceError(f"{option} {text}: WARN and FAIL are numbers (percent)") from None
        if warn < 0 or (fail is not None and fail < warn):
            raise ToleranceError(f"{option} {text}: give 0 <= WARN <= FAIL (percent)")
        tolerances[figure] = Tolerance(warn, fail)
    return tolerances


@dataclass(frozen=True)
class Baseline:
    """The earlier report a run is compared with: its document (validated), where it came from, the tolerances."""

    document: dict[str, Any]
    source: str
    tolerances: dict[str, Tolerance]


# ---------------------------------------------------------------------------------------------- what a report holds


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def figures(checks: list[dict]) -> dict[str, dict[str, float]]:
    """Figure name -> {node or pair -> value} from a report's checks (what the run measured; a SKIP measured
    nothing). Units: busbw GB/s, rtt ms, throughput Mbit/s, ddp_step and collector seconds; gpu_perf each GPU
    figure's own, keyed by node, bus id and figure (gpuperf.report_figures)."""
    out: dict[str, dict[str, float]] = {name: {} for name in FIGURES}
    for check in checks:
        if check.get("status") == "SKIP":
            continue
        name, host, data = check.get("name"), check.get("host"), check.get("data") or {}
        if name in ("allreduce.bandwidth", "allreduce.bandwidth.intra_node"):
            where = CLUSTER if host is None else f"{host} intra-node"
            for row in data.get("sizes") or []:
                size, busbw = row.get("bytes"), _number(row.get("busbw_gbps"))
                if isinstance(size, int) and size >= BUSBW_FROM_BYTES and busbw is not None:
                    out["busbw"][f"{where} all_reduce busbw at {size_text(size)}"] = busbw
        elif name == "network.rtt":
            for pair in data.get("pairs") or []:
                rtt = _number(pair.get("rtt_ms"))
                if rtt is not None:
                    out["rtt"][" <-> ".join(sorted((pair["a"], pair["b"])))] = rtt
        elif name == "network.throughput":
            for flow in data.get("flows") or []:
                rate = _number(flow.get("mbps"))
                if rate is not None:
                    out["throughput"][f"{flow['from']} -> {flow['to']}"] = rate
        elif name == "ddp_equivalence":
            batch, rate = _number(data.get("global_batch")), _number(data.get("ddp_samples_per_s"))
            if batch and rate:
                out["ddp_step"][DDP_STEP] = batch / rate
        elif name == "facts" and host is not None:
            seconds = _number(data.get("seconds"))
            if seconds is not None:
                out["collector"][host] = seconds
    out[GPU_PERF] = gpuperf.report_figures(checks)
    return out


def versions(checks: list[dict]) -> dict[str, dict[str, Any]]:
    """What the consistency checks compared: check -> {node -> value} (None where not collected)."""
    out: dict[str, dict[str, Any]] = {}
    for check in checks:
        values = (check.get("data") or {}).get("values")
        if str(check.get("name", "")).startswith("consistency.") and isinstance(values, dict):
            out[check["name"]] = values
    return out


# ---------------------------------------------------------------------------------------------- the comparison


@dataclass(frozen=True)
class Change:
    """One figure of one node or pair, then (the baseline) and now; status PASS, WARN or FAIL."""

    figure: str
    key: str
    baseline: float
    now: float
    change_pct: float | None
    status: Status

    @property
    def message(self) -> str:
        figure = FIGURES[self.figure]
        label = f"{self.key} {figure.what}".strip()
        pct = f" ({self.change_pct:+.0f} %)" if self.change_pct is not None else ""
        return f"{label} {figure.text(self.now, self.key)}, baseline {figure.text(self.baseline, self.key)}{pct}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "figure": self.figure,
            "key": self.key,
            "baseline": self.baseline,
            "now": self.now,
            "change_pct": None if self.change_pct is None else round(self.change_pct, 1),
            "status": self.status.value,
        }


@dataclass(frozen=True)
class Comparison:
    """One figure across every node or pair: the changes, what only one of the two reports measured, and the
    cluster-wide figures both measured but across other nodes (not compared)."""

    figure: str
    changes: list[Change]
    not_in_baseline: list[str]
    not_measured_now: list[str]
    not_compared: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> list[Change]:
        return sorted(
            (c for c in self.changes if c.status in (Status.WARN, Status.FAIL)),
            key=lambda c: (c.status is not Status.FAIL, -abs(c.change_pct or 0)),
        )


def judge(figure: Figure, tolerance: Tolerance, baseline: float, now: float) -> tuple[float | None, Status]:
    """The change in percent, and whether it is worse than TOLERANCE allows."""
    if baseline == 0:
        return None, Status.PASS
    change = (now - baseline) / baseline * 100
    worse = -change if figure.higher_is_better else change
    if abs(now - baseline) <= figure.floor:
        return change, Status.PASS
    if tolerance.fail_pct is not None and worse > tolerance.fail_pct:
        return change, Status.FAIL
    if worse > tolerance.warn_pct:
        return change, Status.WARN
    return change, Status.PASS


def compare(
    then: dict[str, float], now: dict[str, float], figure: Figure, tolerance: Tolerance, *, same_nodes: bool = True
) -> Comparison:
    """THEN and NOW of every key both measured; the cluster-wide ones only when SAME_NODES (both reports checked
    the same nodes)."""
    changes, not_compared = [], []
    for key in sorted(set(then) & set(now)):
        if not same_nodes and cluster_wide(key):
            not_compared.append(key)
            continue
        change, status = judge(figure, tolerance, then[key], now[key])
        changes.append(Change(figure.name, key, then[key], now[key], change, status))
    return Comparison(figure.name, changes, sorted(set(now) - set(then)), sorted(set(then) - set(now)), not_compared)


def compare_reports(
    baseline: dict[str, Any], current: dict[str, Any], tolerances: dict[str, Tolerance] | None = None
) -> dict[str, Comparison]:
    """Every figure of CURRENT against BASELINE (report documents), figure name -> Comparison. A figure of a node
    or pair is compared where both reports measured it; a cluster-wide one only when both checked the same nodes."""
    tolerances = tolerances or DEFAULT_TOLERANCES
    then, now = figures(baseline.get("checks", [])), figures(current.get("checks", []))
    same = node_sets(baseline, current).same
    return {name: compare(then[name], now[name], f, tolerances[name], same_nodes=same) for name, f in FIGURES.items()}


@dataclass(frozen=True)
class VersionChange:
    check: str
    host: str
    baseline: Any
    now: Any

    @property
    def message(self) -> str:
        what = self.check.removeprefix("consistency.")
        return f"{self.host} {what} {self.now}, baseline {self.baseline}"

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "host": self.host, "baseline": self.baseline, "now": self.now}


def version_changes(baseline: dict[str, Any], current: dict[str, Any]) -> list[VersionChange]:
    """Every node whose compared version or fact differs from the baseline's (both known)."""
    then, now = versions(baseline.get("checks", [])), versions(current.get("checks", []))
    out = []
    for check in sorted(set(then) & set(now)):
        for host in sorted(set(then[check]) & set(now[check])):
            old, new = then[check][host], now[check][host]
            if old is not None and new is not None and old != new:
                out.append(VersionChange(check, host, old, new))
    return out


@dataclass(frozen=True)
class Nodes:
    """The nodes two reports checked, each list in its report's order."""

    baseline: list[str]
    now: list[str]

    @property
    def common(self) -> list[str]:
        return [h for h in self.now if h in self.baseline]

    @property
    def added(self) -> list[str]:
        """Checked now, not in the baseline."""
        return [h for h in self.now if h not in self.baseline]

    @property
    def gone(self) -> list[str]:
        """In the baseline, not checked now."""
        return [h for h in self.baseline if h not in self.now]

    @property
    def same(self) -> bool:
        return set(self.baseline) == set(self.now)

    @property
    def unrelated(self) -> bool:
        """No node in common: a report of another cluster (or of these nodes under other names)."""
        return not self.common

    def across(self) -> str:
        """What the cluster-wide figures of the two reports were measured across, when the node sets differ."""
        return f"the baseline's across {', '.join(self.baseline)}, this run's across {', '.join(self.now)}"


def node_sets(baseline: dict[str, Any], current: dict[str, Any]) -> Nodes:
    """The nodes BASELINE and CURRENT (report documents) checked."""
    return Nodes(list(baseline.get("hosts", [])), list(current.get("hosts", [])))


# ---------------------------------------------------------------------------------------------- the checks

for _figure, _proves in (
    (
        "busbw",
        "all_reduce bus bandwidth at each message size from 1 MiB (across the cluster, and within each node) has not "
        "fallen below the baseline report's by more than its tolerance",
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
        "ddp_step",
        "the DDP stage's time per training step has not risen above the baseline report's by more than its tolerance",
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


CLUSTER_FIGURES = ("busbw", "rtt", "throughput", "ddp_step")  # one result each
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
    results = [emit(f"baseline.{name}", Status.SKIP, f"baseline.{name}: {why}", data=data) for name in CLUSTER_FIGURES]
    results += [
        emit(f"baseline.{name}", Status.SKIP, f"{host}: {why}", host=host, data=data)
        for name in NODE_FIGURES
        for host in nodes.now
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
    return "".join(f"; {n}" for n in notes)


def _figure_result(comparison: Comparison, baseline: Baseline, nodes: Nodes) -> CheckResult:
    name = f"baseline.{comparison.figure}"
    figure = FIGURES[comparison.figure]
    data = _data(comparison, baseline, nodes)
    if not comparison.changes:
        if comparison.not_compared:
            return emit(name, Status.SKIP, f"{name}: {_not_compared(comparison, nodes)}", data=data)
        if not comparison.not_in_baseline:
            return emit(name, Status.SKIP, f"{name}: not measured in this run", data=data)
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
