"""The machine-readable reports of a real `clustercheck run --hosts localhost`: the Markdown summary, a run against
a baseline report, and the published schema (the Prometheus metrics are test_cli.py's, of its run of every stage)."""

from __future__ import annotations

import json
from pathlib import Path

from harness import run_cli


def test_markdown_summary_to_stdout(tmp_path):
    proc = run_cli(
        "run", "--hosts", "localhost", "--only", "core", "--skip", "local.*", "--format", "markdown",
        "--run-dir", str(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # --only core proves the nodes, not multi-node training: the verdict says what did not run, and what to run next.
    assert proc.stdout.startswith("## clustercheck: NOT VERIFIED for multi-node PyTorch: core passed")
    assert "network, collectives, ddp did not run (not selected (--only core))" in proc.stdout.splitlines()[0]
    assert "Next: run the same command without --only core to verify network, collectives, ddp" in proc.stdout
    assert "| `torch.import` | PASS |" in proc.stdout


def test_a_run_against_a_real_report_compares_this_machines_figures(tmp_path):
    """`--baseline` of a recorded real report of this kind of machine (tests/unit/records/report-localhost.json):
    the core stage's real collector time and versions compared with it, the figures this run does not measure
    (--only core) SKIP, and nothing of the baseline stage in the earlier report itself."""
    recorded = Path(__file__).resolve().parents[1] / "unit" / "records" / "report-localhost.json"
    proc = run_cli(
        "run", "--hosts", "localhost", "--only", "core", "--skip", "local.*", "--format", "json",
        "--run-dir", str(tmp_path / "run"),
        "--baseline", str(recorded), "--baseline-tolerance", "collector=1000",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    checks = {(c["name"], c["host"]): c for c in json.loads(proc.stdout)["checks"]}
    (collector,) = checks[("baseline.collector", "localhost")]["data"]["changes"]
    assert collector["baseline"] == 2.169 and collector["now"] > 0
    assert checks[("baseline.versions", None)]["status"] in ("PASS", "WARN")  # another machine may run other versions
    assert "torch" in checks[("baseline.versions", None)]["message"]
    assert checks[("baseline.ddp_step", None)]["status"] == "SKIP"  # --only core: no DDP job
    assert checks[("baseline.busbw", None)]["message"] == "not measured in this run"
    assert not [c for c in json.loads(recorded.read_text())["checks"] if c["name"].startswith("baseline.")]


def test_a_baseline_of_another_cluster_fails_the_run_naming_both_sets_of_nodes(tmp_path):
    """`--baseline` of another cluster's report (the recorded one with its node renamed gpu01 and another torch,
    edited here): not a PASS, whatever this machine measures; baseline.versions FAILs naming both sets of nodes."""
    recorded = Path(__file__).resolve().parents[1] / "unit" / "records" / "report-localhost.json"
    other = json.loads(recorded.read_text().replace('"localhost"', '"gpu01"'))
    next(c for c in other["checks"] if c["name"] == "consistency.torch")["data"]["values"]["gpu01"] = "2.12.0+cu126"
    (tmp_path / "other.json").write_text(json.dumps(other))
    proc = run_cli(
        "run", "--hosts", "localhost", "--only", "core", "--skip", "local.*", "--format", "json",
        "--run-dir", str(tmp_path / "run"),
        "--baseline", str(tmp_path / "other.json"),
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert report["status"] != "PASS"
    versions = next(c for c in report["checks"] if c["name"] == "baseline.versions")
    assert versions["status"] == "FAIL"
    assert "checked gpu01; this run checked localhost. Nothing was compared" in versions["message"]


def test_a_baseline_that_is_not_a_report_stops_the_run_before_it_starts(tmp_path):
    other = tmp_path / "notes.json"
    other.write_text('{"hosts": ["node1"]}')
    proc = run_cli("run", "--hosts", "localhost", "--baseline", str(other), "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 4 and proc.stdout == ""
    assert proc.stderr.startswith(f"clustercheck: error: {other}: schema_version None, this clustercheck reads")
    assert proc.stderr.count("\n") == 1  # one line
    assert not (tmp_path / "run").exists()  # nothing ran
    bad = run_cli("run", "--hosts", "localhost", "--baseline-tolerance", "busbw=5")
    assert bad.returncode == 4 and "give the report to compare with (--baseline REPORT.json)" in bad.stderr
