"""The JSON report (schema_version 1, described by report.schema.json): what scripts and CI pipelines read."""

from __future__ import annotations

import datetime as dt
import json
from typing import TextIO

from clustercheck.report import SCHEMA_VERSION, Report, StageSummary


def document(report: Report) -> dict:
    doc = {
        "schema_version": SCHEMA_VERSION,
        "status": report.status.value,
        "hosts": report.hosts,
        "checks": [r.to_dict() for r in report.results],
    }
    if report.run_id:
        doc["run_id"] = report.run_id
    if report.started_at is not None:
        started = dt.datetime.fromtimestamp(report.started_at, dt.timezone.utc)
        doc["started_at"] = started.isoformat(timespec="seconds").replace("+00:00", "Z")
    if report.duration_s is not None:
        doc["duration_s"] = round(report.duration_s, 3)
    if report.durations:  # a report of a run (not of some checks alone): every stage, how it went and its time
        doc["stages"] = [_stage(s) for s in report.stages]
    return doc


def _stage(stage: StageSummary) -> dict:
    entry: dict = {"name": stage.name, "status": stage.status.value}
    if stage.duration_s is not None:
        entry["duration_s"] = round(stage.duration_s, 3)
    if stage.skipped is not None:
        entry["skipped"] = stage.skipped
    return entry


def render(report: Report) -> str:
    return json.dumps(document(report), indent=2)


def write(report: Report, out: TextIO) -> None:
    """REPORT's JSON written to OUT as it is rendered, the same text as render's and a newline: never held whole as
    one string (95 MB at 4,000 nodes, and the encoder's pieces of it, 170 MiB more at 2,000 nodes;
    docs/benchmarks.md, "The whole run's controller side at 4,000 nodes")."""
    json.dump(document(report), out, indent=2)
    out.write("\n")
