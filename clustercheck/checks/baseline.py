"""This run against an earlier report of the same cluster (`clustercheck run --baseline REPORT.json`, and
`clustercheck diff`): the figures a cluster degrades in quietly, and the versions the consistency checks compare.
Pure logic over report documents (the JSON report's `hosts` and `checks`), no I/O.

A figure that got worse than the baseline by more than its tolerance (percent, per figure, `--baseline-tolerance
FIGURE=WARN[:FAIL]`) is a WARN, or a FAIL past the second bound, naming the node or pair, then and now:
`node3 -> node1 throughput 9.1 Gbit/s, baseline 23.4 Gbit/s (-61 %)`. A node or pair that only one of the two
reports measured is said, never judged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clustercheck.checks.collectives import size_text
from clustercheck.checks.network import RTT_MARGIN_MS
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

    def text(self, value: float) -> str:
        return _UNITS[self.name](value)


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

FIGURES = {
    f.name: f
    for f in (
        Figure("busbw", "", True, 10, 25),
        Figure("rtt", "round trip", False, 50, 200, floor=RTT_MARGIN_MS),
        Figure("throughput", "throughput", True, 20, 50),
        Figure("ddp_step", "", False, 20, 50),
        Figure("collector", "facts collector", False, 50, 200, floor=1.0),
    )
}
VERSIONS = "baseline.versions"


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
    nothing). Units: busbw GB/s, rtt ms, throughput Mbit/s, ddp_step and collector seconds."""
    out: dict[str, dict[str, float]] = {name: {} for name in FIGURES}
    for check in checks:
        if check.get("status") == "SKIP":
            continue
        name, host, data = check.get("name"), check.get("host"), check.get("data") or {}
        if name in ("allreduce.bandwidth", "allreduce.bandwidth.intra_node"):
            where = "cluster" if host is None else f"{host} intra-node"
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
                out["ddp_step"]["DDP step"] = batch / rate
        elif name == "facts" and host is not None:
            seconds = _number(data.get("seconds"))
            if seconds is not None:
                out["collector"][host] = seconds
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
        return f"{label} {figure.text(self.now)}, baseline {figure.text(self.baseline)}{pct}"

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
    """One figure across every node or pair: the changes, and what only one of the two reports measured."""

    figure: str
    changes: list[Change]
    not_in_baseline: list[str]
    not_measured_now: list[str]

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


def compare(then: dict[str, float], now: dict[str, float], figure: Figure, tolerance: Tolerance) -> Comparison:
    changes = []
    for key in sorted(set(then) & set(now)):
        change, status = judge(figure, tolerance, then[key], now[key])
        changes.append(Change(figure.name, key, then[key], now[key], change, status))
    return Comparison(figure.name, changes, sorted(set(now) - set(then)), sorted(set(then) - set(now)))


def compare_reports(
    baseline: dict[str, Any], current: dict[str, Any], tolerances: dict[str, Tolerance] | None = None
) -> dict[str, Comparison]:
    """Every figure of CURRENT against BASELINE (report documents), figure name -> Comparison."""
    tolerances = tolerances or DEFAULT_TOLERANCES
    then, now = figures(baseline.get("checks", [])), figures(current.get("checks", []))
    return {name: compare(then[name], now[name], f, tolerances[name]) for name, f in FIGURES.items()}


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


def hosts_changed(baseline: dict[str, Any], current: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(nodes only in CURRENT, nodes only in BASELINE), in their reports' order."""
    old, new = baseline.get("hosts", []), current.get("hosts", [])
    return [h for h in new if h not in old], [h for h in old if h not in new]


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


def evaluate(baseline: Baseline, current: dict[str, Any]) -> list[CheckResult]:
    """Every baseline.* check of CURRENT (a report document: its hosts and checks) against BASELINE."""
    comparisons = compare_reports(baseline.document, current, baseline.tolerances)
    results = []
    for name in ("busbw", "rtt", "throughput", "ddp_step"):
        results.append(_figure_result(comparisons[name], baseline))
    results += _collector_results(comparisons["collector"], baseline, current.get("hosts", []))
    results.append(_versions_result(baseline, current))
    return results


def _data(comparison: Comparison, baseline: Baseline) -> dict[str, Any]:
    tolerance = baseline.tolerances[comparison.figure]
    return {
        "baseline": _source(baseline),
        "tolerance": {"warn_pct": tolerance.warn_pct, "fail_pct": tolerance.fail_pct},
        "changes": [c.to_dict() for c in comparison.changes],
        "not_in_baseline": comparison.not_in_baseline,
        "not_measured_now": comparison.not_measured_now,
    }


def _notes(comparison: Comparison) -> str:
    notes = []
    if comparison.not_in_baseline:
        notes.append(f"not in the baseline: {', '.join(comparison.not_in_baseline[:SHOWN])}")
    if comparison.not_measured_now:
        notes.append(f"in the baseline, not measured now: {', '.join(comparison.not_measured_now[:SHOWN])}")
    return "".join(f"; {n}" for n in notes)


def _figure_result(comparison: Comparison, baseline: Baseline) -> CheckResult:
    name = f"baseline.{comparison.figure}"
    figure = FIGURES[comparison.figure]
    data = _data(comparison, baseline)
    if not comparison.changes:
        if not comparison.not_in_baseline:
            return emit(name, Status.SKIP, f"{name}: not measured in this run", data=data)
        return emit(
            name,
            Status.PASS,
            f"{name}: nothing to compare, the baseline has no such figure{_notes(comparison)}",
            data=data,
        )
    return _judged_result(name, None, comparison, figure, baseline, data)


def _judged_result(
    name: str, host: str | None, comparison: Comparison, figure: Figure, baseline: Baseline, data: dict
) -> CheckResult:
    regressions = comparison.regressions
    tolerance = baseline.tolerances[comparison.figure]
    if regressions:
        worst = Status.FAIL if any(c.status is Status.FAIL for c in regressions) else Status.WARN
        more = f"; and {len(regressions) - SHOWN} more" if len(regressions) > SHOWN else ""
        text = "; ".join(c.message for c in regressions[:SHOWN]) + more
        return emit(name, worst, f"{text} ({tolerance.describe()}){_notes(comparison)}", host=host, data=data)
    judged = [c for c in comparison.changes if c.change_pct is not None]
    if len(comparison.changes) == 1 and judged:
        text = f"{comparison.changes[0].message}: within its tolerance"
    else:
        largest = max(judged, key=lambda c: abs(c.change_pct or 0), default=None)
        text = f"{len(judged)} figure(s) within their tolerance of the baseline" + (
            f" (largest change: {largest.message})" if largest else ""
        )
    return emit(name, Status.PASS, text + _notes(comparison), host=host, data=data)


def _collector_results(comparison: Comparison, baseline: Baseline, hosts: list[str]) -> list[CheckResult]:
    name = "baseline.collector"
    figure = FIGURES["collector"]
    results = []
    for host in hosts:
        mine = Comparison(
            comparison.figure,
            [c for c in comparison.changes if c.key == host],
            [k for k in comparison.not_in_baseline if k == host],
            [],
        )
        data = _data(mine, baseline)
        if mine.changes:
            results.append(_judged_result(name, host, mine, figure, baseline, data))
        elif mine.not_in_baseline:
            results.append(emit(name, Status.PASS, f"{host}: not in the baseline, nothing to compare", host=host))
        else:
            results.append(emit(name, Status.SKIP, f"{host}: its facts were not collected now", host=host, data=data))
    return results


def _versions_result(baseline: Baseline, current: dict[str, Any]) -> CheckResult:
    changed = version_changes(baseline.document, current)
    added, gone = hosts_changed(baseline.document, current)
    data = {
        "baseline": _source(baseline),
        "changes": [c.to_dict() for c in changed],
        "hosts_added": added,
        "hosts_gone": gone,
    }
    notes = []
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
