"""The JSON report (schema_version 1): what scripts and CI pipelines read."""

from __future__ import annotations

import json

from clustercheck.report import SCHEMA_VERSION, Report


def document(report: Report) -> dict:
    doc = {
        "schema_version": SCHEMA_VERSION,
        "status": report.status.value,
        "hosts": report.hosts,
        "checks": [r.to_dict() for r in report.results],
    }
    if report.run_id:
        doc["run_id"] = report.run_id
    return doc


def render(report: Report) -> str:
    return json.dumps(document(report), indent=2)
