"""The JSON report's published schema: `clustercheck schema` prints it, and it describes what the JSON report
holds (every report the other tests write is validated against it too: tests/conftest.py)."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys

import jsonschema
import pytest
from harness import real_results
from wording import says

from clustercheck import report
from clustercheck.model import CheckResult, Status
from clustercheck.report import Report


def validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads(report.schema_text()))


def document(results=None, **kw) -> dict:
    kw = {"run_id": "0123abcd", "started_at": 1_700_000_000.25, "duration_s": 12.3456, **kw}
    return json.loads(report.render(Report(results or real_results(), ["node1", "node2", "node3"], **kw), "json"))


def test_clustercheck_schema_prints_the_packaged_schema():
    proc = subprocess.run(
        [sys.executable, "-m", "clustercheck", "schema"], capture_output=True, text=True, timeout=60, check=True
    )
    schema = json.loads(proc.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema == json.loads(report.schema_text())
    assert schema["properties"]["schema_version"] == {"const": report.SCHEMA_VERSION}


def test_a_report_of_real_results_validates_with_its_time_and_duration():
    doc = document()
    validator().validate(doc)
    assert dt.datetime.fromisoformat(doc["started_at"].replace("Z", "+00:00")).timestamp() == 1_700_000_000
    assert doc["duration_s"] == 12.346
    minimal = document(run_id=None, started_at=None, duration_s=None)
    assert {"run_id", "started_at", "duration_s"}.isdisjoint(minimal)
    validator().validate(minimal)


@pytest.mark.parametrize(
    "spoil",
    [
        lambda d: d.pop("status"),
        lambda d: d.update(schema_version=2),
        lambda d: d.update(verdict="READY"),
        lambda d: d["checks"][0].update(status="OK"),
        lambda d: d["checks"][0].pop("remediation"),
        lambda d: next(c for c in d["checks"] if c["name"] == "allreduce.bandwidth")["data"]["sizes"][0].update(
            busbw_gbps="fast"
        ),
        lambda d: next(c for c in d["checks"] if c["name"] == "network.mtu")["data"]["mtu"].update(node1="1500"),
    ],
    ids=["no-status", "another-version", "unknown-field", "unknown-status", "no-remediation", "busbw", "mtu"],
)
def test_the_schema_rejects_what_a_reader_could_not_rely_on(spoil):
    doc = document()
    spoil(doc)
    assert list(validator().iter_errors(doc))


def test_a_check_the_schema_does_not_describe_keeps_any_data():
    odd = CheckResult("gpu.newcheck", Status.WARN, "m", host="node1", data={"anything": [1, {"x": None}]})
    validator().validate(document([odd]))


def test_each_stage_s_outcome_and_duration_are_in_the_report_and_the_schema():
    from clustercheck.selection import STAGES

    durations = {"core": 21.3456, "network": 3.2, "collectives": 20.0, "ddp": 15.5}
    doc = document(durations=durations)
    validator().validate(doc)
    stages = {s["name"]: s for s in doc["stages"]}
    assert list(stages) == [s for s in STAGES if s in stages]  # in the order they run
    assert stages["network"] == {"name": "network", "status": "FAIL", "duration_s": 3.2}  # node3's firewall
    assert stages["ddp"] == {"name": "ddp", "status": "PASS", "duration_s": 15.5}
    from clustercheck.checks import registry
    from clustercheck.selection import Selection

    why = Selection(only=("core",)).why_not_stage("network")
    skipped = document([registry.get("network.tcp").not_run(None, why)], durations={"core": 1.0})
    validator().validate(skipped)
    assert skipped["stages"] == [
        {"name": "core", "status": "SKIP", "duration_s": 1.0, "skipped": "nothing to check"},
        {"name": "network", "status": "SKIP", "skipped": "not selected (--only core)"},
    ]
    schema = json.loads(report.schema_text())
    assert schema["$defs"]["stage"]["properties"]["name"]["enum"] == list(STAGES)
    spoiled = document(durations=durations)
    spoiled["stages"][0]["duration_s"] = "21 s"
    assert list(validator().iter_errors(spoiled))


def test_each_check_s_stage_and_a_skip_s_reason_are_in_the_report_and_an_older_report_still_loads(tmp_path):
    from pathlib import Path

    from clustercheck.checks import registry
    from clustercheck.report.load import load
    from clustercheck.selection import STAGES, Selection

    why = Selection(only=("core", "network")).why_not_stage("lightning")
    results = real_results() + registry.skipped(registry.get("lightning.ddp"), ["node1"], why)
    doc = document(results)
    validator().validate(doc)
    assert all(c["stage"] in STAGES for c in doc["checks"])
    skipped = next(c for c in doc["checks"] if c["name"] == "lightning.ddp")
    assert skipped["stage"] == "lightning" and says(skipped["skip_reason"], "not selected", "--only core network")
    assert skipped["deselected_by"] == "--only core network"
    assert all("skip_reason" not in c for c in doc["checks"] if c["status"] != "SKIP")
    schema = json.loads(report.schema_text())
    assert schema["$defs"]["check"]["properties"]["stage"]["enum"] == list(STAGES)
    for name, spoil in (
        ("network.tcp", {"skip_reason": "why"}),  # a PASS has no reason to skip
        ("lightning.ddp", {"deselected_by": "lightning"}),  # the options, as the command line takes them
        ("lightning.ddp", {"stage": "gpu"}),
    ):
        spoiled = json.loads(json.dumps(doc))
        next(c for c in spoiled["checks"] if c["name"] == name).update(spoil)
        assert list(validator().iter_errors(spoiled)), spoil
    # A report written before checks carried these (records/report-localhost.json) is still a report: --baseline
    # and diff read it.
    recorded = Path(__file__).parent / "records" / "report-localhost.json"
    older = load(recorded)
    assert not any({"stage", "skip_reason"} & set(c) for c in older["checks"])
