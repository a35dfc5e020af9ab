"""JUnit XML: a testsuite per host (and one for the cluster-wide checks), a testcase per check."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from clustercheck.model import CheckResult, Status
from clustercheck.report import CLUSTER_SUITE, Report


def render(report: Report) -> str:
    root = ET.Element("testsuites", name="clustercheck")
    suites: dict[str, list[CheckResult]] = {host: [] for host in report.hosts}
    for r in report.results:
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
