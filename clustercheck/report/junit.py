"""JUnit XML: a testsuite per host (and one for the cluster-wide checks), a testcase per check."""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET
from typing import TextIO

from clustercheck.model import CheckResult, Status
from clustercheck.report import CLUSTER_SUITE, Report

HEAD = '<?xml version="1.0" encoding="utf-8"?>\n'
INDENT = "  "


def render(report: Report) -> str:
    out = io.StringIO()
    write(report, out)
    return out.getvalue().removesuffix("\n")


def write(report: Report, out: TextIO) -> None:
    """REPORT's JUnit XML written to OUT suite by suite, indented as ET.indent indents the whole tree, and a newline:
    one suite's elements at a time, never the whole tree and its text (43 MB at 4,000 nodes; docs/benchmarks.md, "The
    whole run's controller side at 4,000 nodes")."""
    suites: dict[str, list[CheckResult]] = {host: [] for host in report.hosts}
    for r in report.results:
        suites.setdefault(r.host or CLUSTER_SUITE, []).append(r)
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for members in suites.values():
        for key, value in _counts(members).items():
            totals[key] += value
    root = ET.Element("testsuites", name="clustercheck", **{k: str(v) for k, v in totals.items()})
    empty = ET.tostring(root, encoding="unicode")  # <testsuites ... />
    if not suites:
        out.write(HEAD + empty + "\n")
        return
    out.write(HEAD + empty.removesuffix(" />") + ">\n" + INDENT)
    for number, (name, members) in enumerate(suites.items(), 1):
        suite = _suite(name, members)
        ET.indent(suite, space=INDENT, level=1)
        suite.tail = "\n" + (INDENT if number < len(suites) else "")
        out.write(ET.tostring(suite, encoding="unicode"))
    out.write("</testsuites>\n")


def _counts(members: list[CheckResult]) -> dict[str, int]:
    return {
        "tests": len(members),
        "failures": sum(r.status is Status.FAIL for r in members),
        "errors": sum(r.status is Status.ERROR for r in members),
        "skipped": sum(r.status is Status.SKIP for r in members),
    }


def _suite(name: str, members: list[CheckResult]) -> ET.Element:
    suite = ET.Element("testsuite", name=name, **{k: str(v) for k, v in _counts(members).items()})
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
    return suite
