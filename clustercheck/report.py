"""Render results: a table for people, JSON for machines (with a schema_version)."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from clustercheck.model import CheckResult, Status, overall_status

SCHEMA_VERSION = 1
STYLES = {
    Status.PASS: "green",
    Status.WARN: "yellow",
    Status.FAIL: "bold red",
    Status.ERROR: "bold red",
    Status.SKIP: "dim",
}


def to_json(results: list[CheckResult], hosts: list[str]) -> str:
    return json.dumps(
        {
            "schema_version": SCHEMA_VERSION,
            "status": overall_status(results).value,
            "hosts": hosts,
            "checks": [r.to_dict() for r in results],
        },
        indent=2,
    )


def print_table(results: list[CheckResult], console: Console) -> None:
    table = Table(show_lines=False)
    for column in ("status", "check", "host", "message"):
        table.add_column(column)
    for r in results:
        table.add_row(f"[{STYLES[r.status]}]{r.status.value}[/]", r.name, r.host or "(cluster)", r.message)
    console.print(table)
    for r in results:
        if r.status.is_problem and r.remediation:
            console.print(f"[bold]fix[/] {r.name}{' on ' + r.host if r.host else ''}: {r.remediation}")


def verdict(results: list[CheckResult]) -> str:
    status = overall_status(results)
    if status is Status.FAIL:
        bad = sum(1 for r in results if r.status.is_problem)
        return f"NOT READY: {bad} check(s) failed"
    return "READY for multi-node PyTorch" + (" (with warnings)" if status is Status.WARN else "")
