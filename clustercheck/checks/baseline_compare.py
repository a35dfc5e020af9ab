"""A run's figures against a baseline report's (pure, no I/O): the tolerances (`--baseline-tolerance`), each
node's or pair's change and its verdict, and the nodes and versions of two reports. `run --baseline`
(checks/baseline.py) and `clustercheck diff` (report/diff.py) make this one comparison.

The verdict allows for the noise of both runs. A figure whose repetitions the report recorded (its spread: the
median and the interquartile range, as torch.utils.benchmark summarises repeated timings; checks/spread.py) is
compared by its medians, and only what the change exceeds the two runs' spreads by counts against the tolerance:
the difference of two noisy figures is as noisy as both together, so a change within the sum of the two IQRs (each
relative to its median) is not a regression. pyperf's `compare_to` likewise calls a difference within the runs'
noise "not significant" rather than slower (its t-test over the runs' values). A figure whose IQR exceeds a
quarter of its median, in either run, is what torch.utils.benchmark calls "significant environmental influence":
too noisy to judge past a WARN, and the message says so. So is every figure measured over gloo on CPUs, whatever
its spread: there the ranks share the cores with the node's other work, which changes more between two runs than
within one (pyperf runs a benchmark in 20 worker processes by default because "each process has different
performance", psf/pyperf#136: one process's values understate the run-to-run spread); the message names the
setting ('gloo on CPU'). A figure without a spread in either report (an older clustercheck's, or one measured
once: the collector, the network pairs, the GPUs) is judged as before, on its value alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from clustercheck.checks.baseline_figures import FIGURES, Figure, Measure, cluster_wide, figures, versions
from clustercheck.checks.spread import Spread
from clustercheck.model import Status


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
class Verdict:
    """A change judged: in percent of the baseline (None: the baseline is 0), its status, the noise allowed for (the
    two runs' IQRs relative to their medians, in percent; None: no spread in either report), and whether it was
    too noisy to judge past a WARN."""

    change_pct: float | None
    status: Status
    noise_pct: float | None = None
    too_noisy: bool = False
    within_noise: bool = False  # no worse than the noise allows for


def _pct(spread: Spread | None) -> float | None:
    return None if spread is None else spread.relative * 100


def judge(figure: Figure, tolerance: Tolerance, then: Measure, now: Measure) -> Verdict:
    """The change from THEN to NOW, and whether it is worse than TOLERANCE allows beyond the noise of both runs:
    with a spread in both reports, their medians are compared and the sum of their IQRs (each relative to its
    median) is allowed for on top of the tolerance; a figure too noisy in either run (spread.NOISY) is at most a
    WARN. Without both spreads: their values, judged on the tolerance alone (as clustercheck did before it
    recorded spreads)."""
    both = then.spread is not None and now.spread is not None
    old, new = (then.spread.median, now.spread.median) if both else (then.value, now.value)  # type: ignore[union-attr]
    if old == 0:
        return Verdict(None, Status.PASS)
    change = (new - old) / old * 100
    noise = (_pct(then.spread) or 0) + (_pct(now.spread) or 0) if both else None
    if abs(new - old) <= figure.floor:
        return Verdict(change, Status.PASS, noise)
    beyond = (-change if figure.higher_is_better else change) - (noise or 0)
    status = Status.PASS
    if tolerance.fail_pct is not None and beyond > tolerance.fail_pct:
        status = Status.FAIL
    elif beyond > tolerance.warn_pct:
        status = Status.WARN
    # A CPU's figure is too noisy to judge past a WARN whatever its repetitions' spread: its ranks share the cores
    # with the node's other work, which changes between two runs more than within one. Measured (docs/benchmarks.md):
    # two runs straight after each other, IQRs of 24 % and 15 %, medians 76 % apart.
    noisy = both and (then.spread.noisy or now.spread.noisy)  # type: ignore[union-attr]
    too_noisy = bool(noisy or (both and (then.setting or now.setting)))
    if too_noisy and status is Status.FAIL:
        status = Status.WARN
    return Verdict(change, status, noise, too_noisy, both and beyond <= 0)


@dataclass(frozen=True)
class Change:
    """One figure of one node or pair, then (the baseline) and now, judged (the Verdict); then and now are the
    medians of their repetitions where both reports recorded a spread."""

    figure: str
    key: str
    then: Measure
    now_measure: Measure
    verdict: Verdict

    @property
    def compared(self) -> tuple[float, float]:
        both = self.then.spread is not None and self.now_measure.spread is not None
        if both:
            return self.then.spread.median, self.now_measure.spread.median  # type: ignore[union-attr]
        return self.then.value, self.now_measure.value

    @property
    def baseline(self) -> float:
        return self.compared[0]

    @property
    def now(self) -> float:
        return self.compared[1]

    @property
    def change_pct(self) -> float | None:
        return self.verdict.change_pct

    @property
    def status(self) -> Status:
        return self.verdict.status

    @property
    def noise(self) -> str:
        """The spreads allowed for, in words ('' without): 'IQR 31 % now, 12 % then, gloo on CPU: too noisy to
        judge past a WARN'."""
        if self.verdict.noise_pct is None:
            return ""
        now, then = _pct(self.now_measure.spread), _pct(self.then.spread)
        text = f"IQR {now:.0f} % now, {then:.0f} % then of the median"
        setting = self.now_measure.setting or self.then.setting
        if setting:
            text += f", {setting}"
        if self.verdict.within_noise and self.change_pct is not None and abs(self.change_pct) >= 0.5:
            text += ": within the spread of both runs"
        elif self.verdict.too_noisy and self.status is not Status.PASS:
            text += ": too noisy to judge past a WARN"
        return text

    @property
    def message(self) -> str:
        figure = FIGURES[self.figure]
        label = f"{self.key} {figure.what}".strip()
        parts = [f"{self.change_pct:+.0f} %"] if self.change_pct is not None else []
        if self.noise:
            parts.append(self.noise)
        pct = f" ({'; '.join(parts)})" if parts else ""
        return f"{label} {figure.text(self.now, self.key)}, baseline {figure.text(self.baseline, self.key)}{pct}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "figure": self.figure,
            "key": self.key,
            "baseline": self.baseline,
            "now": self.now,
            "change_pct": None if self.change_pct is None else round(self.change_pct, 1),
            "status": self.status.value,
            "baseline_spread": None if self.then.spread is None else self.then.spread.to_dict(),
            "now_spread": None if self.now_measure.spread is None else self.now_measure.spread.to_dict(),
            "noise_pct": None if self.verdict.noise_pct is None else round(self.verdict.noise_pct, 1),
            "too_noisy": self.verdict.too_noisy,
            "setting": self.now_measure.setting or self.then.setting or None,
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

    @property
    def without_baseline_spread(self) -> bool:
        """Whether this run recorded spreads the baseline did not (an older clustercheck's report): those figures
        were judged on their values alone."""
        return any(c.now_measure.spread is not None and c.then.spread is None for c in self.changes)


def compare(
    then: dict[str, Measure], now: dict[str, Measure], figure: Figure, tolerance: Tolerance, *, same_nodes: bool = True
) -> Comparison:
    """THEN and NOW of every key both measured; the cluster-wide ones only when SAME_NODES (both reports checked
    the same nodes)."""
    changes, not_compared = [], []
    for key in sorted(set(then) & set(now)):
        if not same_nodes and cluster_wide(key):
            not_compared.append(key)
            continue
        changes.append(Change(figure.name, key, then[key], now[key], judge(figure, tolerance, then[key], now[key])))
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
