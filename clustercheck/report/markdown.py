"""A Markdown summary for a CI job summary or a pull request comment: the verdict, each stage's time, what is wrong
with its fix, the next step (after the failures and warnings it refers to), then one compact table row per
check."""

from __future__ import annotations

from collections import Counter

from clustercheck.model import CheckResult, Status
from clustercheck.report import CLUSTER_SUITE, SEVERITY, Report, duration_text
from clustercheck.report.text import stages_line

DETAIL_CHARS = 160


def _cell(text: str) -> str:
    """TEXT fit for one table cell: one line, pipes escaped."""
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= DETAIL_CHARS else text[: DETAIL_CHARS - 1] + "…"


def _code(text: str) -> str:
    return f"`{text}`" if "`" not in text else f"`` {text} ``"


def _problem(r: CheckResult) -> list[str]:
    where = f" on {_code(r.host)}" if r.host else ""
    lines = [f"- **{r.status.value}** {_code(r.name)}{where}: {' '.join(r.message.split())}"]
    if r.remediation:
        lines.append(f"  - fix: {' '.join(r.remediation.split())}")
    return lines


def _row(name: str, members: list[CheckResult]) -> str:
    """One row per check: each status with the hosts that have it (worst first), and the worst one's message."""
    by_status: dict[Status, list[str]] = {}
    for r in sorted(members, key=lambda r: SEVERITY[r.status]):
        by_status.setdefault(r.status, []).append(r.host or CLUSTER_SUITE)
    status, hosts = next(iter(by_status.items()))
    if len(by_status) == 1 and status in (Status.PASS, Status.SKIP):
        outcome = status.value if len(hosts) == 1 else f"{status.value} ({len(hosts)} hosts)"
    else:
        outcome = "; ".join(f"{s.value}: {', '.join(dict.fromkeys(h))}" for s, h in by_status.items())
    worst = min(members, key=lambda r: SEVERITY[r.status])
    return f"| {_code(name)} | {_cell(outcome)} | {_cell(worst.message)} |"


def render(report: Report) -> str:
    results = report.results
    counts = Counter(r.status for r in results)
    summary = ", ".join(f"{counts[s]} {s.value}" for s in sorted(counts, key=SEVERITY.get))
    facts = [f"{len(report.hosts)} host(s)", f"{len(results)} check result(s): {summary or 'none'}"]
    if report.duration_s is not None:
        facts.append(f"took {duration_text(report.duration_s)}")
    if report.run_id:
        facts.append(f"run {_code(report.run_id)}")
    lines = [f"## clustercheck: {report.verdict}", "", " · ".join(facts), ""]
    if report.durations:
        lines += [stages_line(report.stages), ""]

    problems = sorted((r for r in results if r.status.is_problem), key=lambda r: SEVERITY[r.status])
    warnings = [r for r in results if r.status is Status.WARN]
    for title, members in (("Failures", problems), ("Warnings", warnings)):
        if members:
            lines += [f"### {title}", ""]
            for r in members:
                lines += _problem(r)
            lines.append("")
    lines += [f"Next: {report.next_step}", ""]

    grouped: dict[str, list[CheckResult]] = {}
    for r in results:
        grouped.setdefault(r.name, []).append(r)
    lines += ["### Checks", "", "| check | result | detail |", "| --- | --- | --- |"]
    lines += [_row(name, members) for name, members in grouped.items()]
    return "\n".join(lines)
