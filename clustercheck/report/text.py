"""The report people read: failures and warnings first with their fixes, then what passed; the skipped checks
folded into one line per reason; each stage's time; the counts, the verdict and what to do next."""

from __future__ import annotations

import io
from collections import Counter

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from clustercheck.model import CheckResult, Status
from clustercheck.report import CLUSTER_SUITE, SEVERITY, Report, StageSummary, duration_text, skip_reason

STYLES = {
    Status.PASS: "green",
    Status.WARN: "yellow",
    Status.FAIL: "bold red",
    Status.ERROR: "bold red",
    Status.SKIP: "dim",
}
NAMES_SHOWN = 8  # check names listed on a folded skip line; the JSON report has them all
HOSTS_SHOWN = 8  # hosts named on a fix line
REASON_CHARS = 100  # of why a stage did not run, on the stages line (the skip lines have it whole)


def print_report(report: Report, console: Console, raw_output: str | None = None) -> None:
    results = report.results
    judged = sorted((r for r in results if r.status is not Status.SKIP), key=lambda r: SEVERITY[r.status])
    if judged:
        print_table(judged, console)
    for line in fix_lines(judged):
        console.print(f"[bold]fix[/] {escape(line)}")
    for line in skipped_lines(results, report.hosts):
        console.print(f"[dim]{escape(line)}[/]")
    if report.stages:
        console.print(escape(stages_line(report.stages)))
    console.print(escape(counts_line(report, raw_output)))
    console.print(f"[bold]{escape(report.verdict)}[/]")
    console.print(f"next: {escape(report.next_step)}")


def print_table(results: list[CheckResult], console: Console) -> None:
    table = Table(show_lines=False)
    for column in ("status", "check", "host", "message"):
        table.add_column(column, overflow="fold")
    for r in results:
        message = r.message.removeprefix(f"{r.host}: ") if r.host else r.message  # the host has its own column
        table.add_row(
            f"[{STYLES[r.status]}]{r.status.value}[/]", escape(r.name), escape(r.host or CLUSTER_SUITE), escape(message)
        )
    console.print(table)


def result_lines(results: list[CheckResult]) -> list[str]:
    """One line per result, in the order given: `STATUS  check  message` (node-health's output, which a health
    program's log keeps line by line)."""
    width = max((len(r.name) for r in results), default=0)
    lines = []
    for r in results:
        message = r.message.removeprefix(f"{r.host}: ") if r.host else r.message
        lines.append(f"{r.status.value:<5} {r.name:<{width}}  {' '.join(message.split())}")
    return lines


def fix_lines(results: list[CheckResult]) -> list[str]:
    """The fixes of what warned or failed, in the order given: one line per check and fix, naming every host that
    needs it (the same fix on every node is one line, not one per node)."""
    hosts: dict[tuple[str, str], list[str]] = {}
    for r in results:
        if r.status in (Status.WARN, Status.FAIL, Status.ERROR) and r.remediation:
            where = hosts.setdefault((r.name, r.remediation), [])
            if r.host and r.host not in where:
                where.append(r.host)
    lines = []
    for (name, fix), where in hosts.items():
        shown = ", ".join(where[:HOSTS_SHOWN]) + (
            f" and {len(where) - HOSTS_SHOWN} more" if len(where) > HOSTS_SHOWN else ""
        )
        lines.append(f"{name}{' on ' + shown if where else ''}: {fix}")
    return lines


def skipped_lines(results: list[CheckResult], hosts: list[str]) -> list[str]:
    """One line per reason a check was skipped: how many results, the reason, which checks, and on which hosts
    where not on all of them."""
    groups: dict[str, list[CheckResult]] = {}
    for r in results:
        if r.status is Status.SKIP:
            groups.setdefault(skip_reason(r), []).append(r)
    lines = []
    for reason, members in groups.items():
        names = _names(list(dict.fromkeys(r.name for r in members)))
        where = sorted({r.host for r in members if r.host})
        on = f" on {', '.join(where)}" if where and len(hosts) > 1 and set(where) != set(hosts) else ""
        lines.append(f"{len(members)} skipped: {reason} ({names}{on})")
    return lines


def _names(names: list[str]) -> str:
    """Check names, those sharing a prefix with others as `prefix.*`: gpu.*, pcie.*, torch.cuda."""
    prefixes = Counter(n.split(".", 1)[0] for n in names if "." in n)
    folded = (f"{n.split('.', 1)[0]}.*" if prefixes.get(n.split(".", 1)[0], 0) > 1 else n for n in names)
    shown = list(dict.fromkeys(folded))
    more = f" and {len(shown) - NAMES_SHOWN} more" if len(shown) > NAMES_SHOWN else ""
    return ", ".join(shown[:NAMES_SHOWN]) + more


def stages_line(stages: list[StageSummary]) -> str:
    """Each stage with its outcome and time; the stages that did not run, grouped by why."""
    parts = []
    skipped: dict[str, list[str]] = {}
    for s in stages:
        if s.verified:
            took = f" in {duration_text(s.duration_s)}" if s.duration_s is not None else ""
            parts.append(f"{s.name} {s.status.value}{took}")
        else:
            skipped.setdefault(s.skipped or "", []).append(s.name)
    for why, names in skipped.items():
        why = why if len(why) <= REASON_CHARS else why[: REASON_CHARS - 1] + "…"
        parts.append(f"{', '.join(names)} skipped ({why})")
    return "stages: " + " · ".join(parts)


def counts_line(report: Report, raw_output: str | None = None) -> str:
    counts = Counter(r.status for r in report.results)
    summary = ", ".join(f"{counts[s]} {s.value}" for s in sorted(counts, key=SEVERITY.get)) or "none"
    parts = [f"{len(report.results)} result(s): {summary}", f"{len(report.hosts)} host(s)"]
    if report.duration_s is not None:
        parts.append(f"took {duration_text(report.duration_s)}")
    if raw_output:
        parts.append(f"raw output: {raw_output}")
    return " · ".join(parts)


def render(report: Report) -> str:
    """The report as plain text (for -o FILE)."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=200, color_system=None)
    print_report(report, console)
    return buffer.getvalue().rstrip("\n")
