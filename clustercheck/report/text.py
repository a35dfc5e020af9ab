"""The table people read: status, check, host and message, then the fixes for what is wrong."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from clustercheck.model import CheckResult, Status
from clustercheck.report import CLUSTER_SUITE, Report, verdict

STYLES = {
    Status.PASS: "green",
    Status.WARN: "yellow",
    Status.FAIL: "bold red",
    Status.ERROR: "bold red",
    Status.SKIP: "dim",
}


def print_table(results: list[CheckResult], console: Console) -> None:
    table = Table(show_lines=False)
    for column in ("status", "check", "host", "message"):
        table.add_column(column, overflow="fold")
    for r in results:
        table.add_row(f"[{STYLES[r.status]}]{r.status.value}[/]", r.name, r.host or CLUSTER_SUITE, r.message)
    console.print(table)
    for r in results:
        if r.status in (Status.FAIL, Status.ERROR, Status.WARN) and r.remediation:
            console.print(f"[bold]fix[/] {r.name}{' on ' + r.host if r.host else ''}: {r.remediation}", markup=True)


def render(report: Report) -> str:
    """The table and the verdict as plain text (for -o FILE)."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=200, color_system=None)
    print_table(report.results, console)
    console.print(verdict(report.results))
    return buffer.getvalue().rstrip("\n")
