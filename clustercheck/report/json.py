"""The JSON report (schema_version 1, described by report.schema.json): what scripts and CI pipelines read."""

from __future__ import annotations

import datetime as dt
import json

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
