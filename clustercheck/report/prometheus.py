"""Prometheus metrics in the text exposition format, for node_exporter's textfile collector.

Write them with `-o <textfile directory>/clustercheck.prom`: the file is replaced atomically, so node_exporter
never reads half of it. Every check gets a status gauge per host; the values checks measured (their results'
typed measures, each a Metric declared next to its check, with its unit in the name) get metrics of their own.
This module knows no check by name: a new check is monitored from its first run, a new measure from its Metric.

The textfile collector rejects samples with timestamps and metric families whose series differ in their label
names, so neither appears here: a cluster-wide check has an empty `host` label. It also refuses a series that two
files repeat, and a node can hold two of these files (a `clustercheck run` report, and `clustercheck node-health`'s
own results): every series carries `source`, the command that wrote it (`run` or `node-health`), so the two never
repeat each other while the same queries and alerts read both.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from clustercheck.model import CheckResult, Status
from clustercheck.report import Report

PREFIX = "clustercheck_"
# The status gauge's value: higher is worse, so max() over checks is the worst status.
STATUS_VALUES = {Status.PASS: 0, Status.SKIP: 1, Status.WARN: 2, Status.FAIL: 3, Status.ERROR: 4}
STATUS_HELP = ", ".join(f"{value} {status.value}" for status, value in STATUS_VALUES.items())


@dataclass
class Family:
    name: str
    help: str
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)

    def add(self, value: float, **labels: str) -> None:
        self.samples.append((labels, value))


def _format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1 << 53:
        return str(int(value))
    return repr(value)


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _worst(results: list[CheckResult]) -> dict[tuple[str, str], Status]:
    """One status per check and host: a check that reports several results on one host (network.tcp names each
    unreachable peer) counts with its worst."""
    worst: dict[tuple[str, str], Status] = {}
    for r in results:
        key = (r.name, r.host or "")
        if key not in worst or STATUS_VALUES[r.status] > STATUS_VALUES[worst[key]]:
            worst[key] = r.status
    return worst


def _families(report: Report) -> Iterator[Family]:
    run = Family(
        PREFIX + "run_status",
        f"Overall verdict of the last clustercheck run ({STATUS_HELP}); the status is also a label.",
    )
    run.add(STATUS_VALUES[report.status], status=report.status.value)
    yield run
    if report.started_at is not None:
        started = Family(PREFIX + "run_start_time_seconds", "When the last clustercheck run started (Unix time).")
        started.add(report.started_at)
        yield started
    if report.duration_s is not None:
        duration = Family(PREFIX + "run_duration_seconds", "How long the last clustercheck run took.")
        duration.add(report.duration_s)
        yield duration
    hosts = Family(PREFIX + "run_hosts", "Hosts the last clustercheck run checked.")
    hosts.add(len(report.hosts))
    yield hosts

    status = Family(
        PREFIX + "check_status",
        f"Outcome of a check on a host ({STATUS_HELP}); the status is also a label. "
        "host is empty for a cluster-wide check.",
    )
    for (name, host), value in _worst(report.results).items():
        status.add(STATUS_VALUES[value], check=name, host=host, status=value.value)
    yield status
    counts = Family(PREFIX + "checks", "Checks (per host) with each status in the last run.")
    for value in Status:
        counts.add(sum(1 for r in report.results if r.status is value), status=value.value)
    yield counts

    yield from _measurements(report.results)


def _measurements(results: list[CheckResult]) -> Iterator[Family]:
    """A family per metric the results measured (their typed measures), in the order first measured; a series
    measured twice (the same metric and labels) counts once."""
    families: dict[str, Family] = {}
    seen: set[tuple] = set()
    for r in results:
        for measure in r.measures:
            metric = measure.metric
            key = (metric.name, *sorted(measure.labels.items()))
            if key in seen or not math.isfinite(measure.value):
                continue
            seen.add(key)
            family = families.setdefault(metric.name, Family(PREFIX + metric.name, metric.help))
            family.add(measure.value, **measure.labels)
    yield from families.values()


SOURCES = ("run", "node-health")


def render(report: Report, source: str = "run", extra: Iterable[Family] = ()) -> str:
    """REPORT as metrics, and the families EXTRA after them; SOURCE, the command that made it, is the `source` label
    of every series."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, not {source!r}")
    lines = []
    for family in [*_families(report), *extra]:
        lines.append(f"# HELP {family.name} {_escape_help(family.help)}")
        lines.append(f"# TYPE {family.name} gauge")
        for own, value in family.samples:
            labels = {**own, "source": source}
            pairs = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items())
            lines.append(
                f"{family.name}{{{pairs}}} {_format_value(value)}" if pairs else f"{family.name} {_format_value(value)}"
            )
    return "\n".join(lines)
