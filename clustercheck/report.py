"""Render results: a table for people, JSON and JUnit XML for machines."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

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
CLUSTER_SUITE = "(cluster)"


def to_json(results: list[CheckResult], hosts: list[str], run_id: str | None = None) -> str:
    document = {
        "schema_version": SCHEMA_VERSION,
        "status": overall_status(results).value,
        "hosts": hosts,
        "checks": [r.to_dict() for r in results],
    }
    if run_id:
        document["run_id"] = run_id  # CLUSTERCHECK_RUN=<run_id> marks this run's processes on the nodes
    return json.dumps(document, indent=2)


def to_junit(results: list[CheckResult], hosts: list[str]) -> str:
    """A testsuite per host (and one for the cluster-wide checks), a testcase per check."""
    root = ET.Element("testsuites", name="clustercheck")
    suites: dict[str, list[CheckResult]] = {host: [] for host in hosts}
    for r in results:
        suites.setdefault(r.host or CLUSTER_SUITE, []).append(r)
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for name, members in suites.items():
        counts = {
            "tests": len(members),
            "failures": sum(r.status is Status.FAIL for r in members),
            "errors": sum(r.status is Status.ERROR for r in members),
            "skipped": sum(r.status is Status.SKIP for r in members),
        }
        suite = ET.SubElement(root, "testsuite", name=name, **{k: str(v) for k, v in counts.items()})
        for key in totals:
            totals[key] += counts[key]
        for r in members:
            case = ET.SubElement(suite, "testcase", name=r.name, classname=f"clustercheck.{name}")
            text = r.message + (f"\nfix: {r.remediation}" if r.remediation else "")
            if r.status is Status.FAIL:
                ET.SubElement(case, "failure", message=r.message).text = text
            elif r.status is Status.ERROR:
                ET.SubElement(case, "error", message=r.message).text = text
            elif r.status is Status.SKIP:
                ET.SubElement(case, "skipped", message=r.message)
            else:
                ET.SubElement(case, "system-out").text = f"{r.status.value}: {r.message}"
    for key, value in totals.items():
        root.set(key, str(value))
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode")


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


def verdict(results: list[CheckResult]) -> str:
    status = overall_status(results)
    if status is Status.FAIL:
        bad = sum(1 for r in results if r.status.is_problem)
        return f"NOT READY: {bad} check(s) failed"
    return "READY for multi-node PyTorch" + (" (with warnings)" if status is Status.WARN else "")
