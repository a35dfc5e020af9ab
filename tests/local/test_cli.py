"""`clustercheck run --hosts localhost`: the README's main job, run for real on this machine."""

from __future__ import annotations

import json
import os
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from harness import CLUSTERCHECK, promtool_path, run_cli

from clustercheck import selection
from clustercheck.report import load


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """One run of every stage on this machine, which the tests below read: (the process, its run directory). Its
    report goes to a node_exporter textfile directory in Prometheus' format (-o FILE.prom); the JSON report is the
    run directory's report.json."""
    tmp_path = tmp_path_factory.mktemp("full")
    (tmp_path / "tmpdir").mkdir()  # its TMPDIR, where nothing of the run may be left (test_nothing_is_left_in_tmpdir)
    (tmp_path / "node-exporter").mkdir()
    proc = subprocess.run(
        [
            CLUSTERCHECK, "run", "--hosts", "localhost", "-o", str(tmp_path / "node-exporter" / "clustercheck.prom"),
            "--run-dir", str(tmp_path / "run"), "--master-port", "29611",
        ],
        env={**os.environ, "TMPDIR": str(tmp_path / "tmpdir")},
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    return proc, tmp_path


@pytest.fixture(scope="module")
def full_report(full_run) -> dict:
    """The full run's JSON report, read as `--baseline` reads one (report/load.py: checked against the published
    schema; the module's run directory is no test's tmp_path, which the schema fixture checks)."""
    proc, tmp_path = full_run
    assert proc.returncode == 0, proc.stderr
    return load.load(tmp_path / "run" / "report.json")


def test_nothing_is_left_in_tmpdir(full_run):
    """torch makes its compile cache directory ($TMPDIR/torchinductor_<user>) in every job that imports its
    optimizers: the torch jobs' cache is in the run's work directory on the node, removed with it."""
    proc, tmp_path = full_run
    assert proc.returncode == 0, proc.stderr
    assert list((tmp_path / "tmpdir").iterdir()) == []


def test_localhost_runs_every_stage_and_proves_ddp_equivalence_on_two_cpu_ranks(full_run, full_report):
    proc, tmp_path = full_run
    report = full_report
    assert report["schema_version"] == 1
    assert report["status"] in ("PASS", "WARN")
    assert report["hosts"] == ["localhost"]
    names = [c["name"] for c in report["checks"]]
    checks = {c["name"]: c for c in report["checks"]}
    # The stages in order: core, network, data, collectives, DDP (with its checkpoint round trip), Lightning.
    order = ["torch.import", "network.tcp", "data.paths", "allreduce", "allgather", "broadcast", "allreduce.bandwidth"]
    order += ["ddp_equivalence", "checkpoint", "lightning.import", "lightning.ddp"]
    assert [n for n in names if n in order] == order and names[-1] == "lightning.ddp"
    assert checks["connect"]["message"] == "localhost: local"
    assert checks["network.master_port"]["status"] == "PASS" and "29611" in checks["network.master_port"]["message"]
    for name in ("allreduce", "allgather", "broadcast"):
        assert checks[name]["status"] == "PASS"
        assert checks[name]["data"]["world_size"] == 2
        assert checks[name]["data"]["backend"] == "gloo"
        assert checks[name]["data"]["wrong"] == 0
    assert checks["allreduce.bandwidth"]["data"]["peak_busbw_gbps"] > 0
    ddp = checks["ddp_equivalence"]
    assert ddp["status"] == "PASS", ddp["message"]
    assert ddp["data"]["world_size"] == 2 and ddp["data"]["backend"] == "gloo" and ddp["data"]["steps"] == 20
    assert ddp["data"]["max_abs_param_diff"] < 1e-12 and ddp["data"]["max_rel_param_diff"] < 1e-12
    assert abs(ddp["data"]["reference_accuracy"] - ddp["data"]["ddp_accuracy"]) <= 0.01
    assert ddp["data"]["scaling_efficiency"] > 0
    assert checks["checkpoint"]["status"] == "PASS", checks["checkpoint"]["message"]
    assert checks["data.paths"]["status"] == "SKIP" and "no --data-path given" in checks["data.paths"]["message"]
    lightning = checks["lightning.ddp"]  # Lightning is in the test environment (pyproject's test extra)
    assert lightning["status"] == "PASS", lightning["message"]
    assert lightning["data"]["world_size"] == 2 and lightning["data"]["num_nodes"] == 1
    for name in ("local.allreduce", "local.allgather", "local.broadcast"):  # on one node: the collectives stage
        assert checks[name]["status"] == "SKIP" and "collectives stage" in checks[name]["message"]
    assert all(c["status"] in ("PASS", "WARN", "SKIP") for c in report["checks"])
    said = " ".join(proc.stderr.split())  # as one line: the console wraps long lines at its width
    # One node proves PyTorch on that node, not across nodes: the verdict says which.
    assert "READY for PyTorch on localhost with 2 ranks" in said and "NOT VERIFIED" not in said
    assert "multi-node not verified with one node" in said and "READY for multi-node" not in said
    assert "next: " in said and "clustercheck launch --hosts localhost -- train.py" in said
    # Every stage with its time (data has nothing to check without --shared-dir or --data-path).
    stages = {s["name"]: s for s in report["stages"]}
    assert list(stages) == ["core", "network", "data", "collectives", "ddp", "lightning"]
    assert all(s["duration_s"] >= 0 for s in stages.values())
    assert stages["ddp"]["status"] in ("PASS", "WARN") and stages["data"]["status"] == "SKIP"
    assert sum(s["duration_s"] for s in stages.values()) <= report["duration_s"]
    host_dir = tmp_path / "run" / "hosts" / "localhost"
    job = host_dir / "torch"  # the run's one torch job: every torch stage a part of it
    for stage in ("collectives", "ddp", "lightning"):  # each part's rank records came back
        assert sorted(p.name for p in (job / stage).glob("rank-*.json")) == ["rank-0.json", "rank-1.json"]
    assert list((job / "torchrun-logs").rglob("stderr.log"))  # and torchrun's per-rank logs
    assert [p.name for p in host_dir.glob("*.command")] == ["torch.command"]  # one torchrun for the run
    assert "--master-port=29611" in (host_dir / "torch.command").read_text()
    assert json.loads((host_dir / "facts.json").read_text())["python"]["executable"]
    assert (tmp_path / "run" / "report.xml").exists()
    assert len(report["run_id"]) == 12
    assert not Path(f"/tmp/clustercheck-{report['run_id']}").exists()  # the work directory is cleaned up too


def test_a_full_run_writes_prometheus_metrics_promtool_accepts(full_run, full_report):
    """-o FILE.prom: the report in Prometheus' text format for node_exporter's textfile collector, written whole
    (no temporary file left beside it), every check's status in it, and promtool accepts it."""
    proc, tmp_path = full_run
    report = full_report
    assert proc.stdout == ""  # the report went to the file; the table and verdict to stderr
    textfile_dir = tmp_path / "node-exporter"
    assert [p.name for p in textfile_dir.iterdir()] == ["clustercheck.prom"]
    text = (textfile_dir / "clustercheck.prom").read_text()
    lint = subprocess.run([promtool_path(), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    for check in report["checks"]:
        assert f'clustercheck_check_status{{check="{check["name"]}",host="{check["host"] or ""}",' in text
    for name in ("allreduce_busbw_bytes_per_second", "ddp_max_abs_param_diff", "ddp_scaling_efficiency_ratio"):
        assert f"\nclustercheck_{name}" in text
    duration = next(
        line for line in text.splitlines() if line.startswith('clustercheck_run_duration_seconds{source="run"} ')
    )
    assert 0 < float(duration.split()[1]) < 300


def test_every_check_a_run_reports_is_in_the_catalog_under_the_same_name(full_report, tmp_path):
    catalog = json.loads(run_cli("checks", "--format", "json").stdout)["checks"]
    known = {c["name"]: c for c in catalog}
    assert all(c["proves"] and c["stage"] in selection.STAGES for c in catalog)
    full = {c["name"] for c in full_report["checks"]}
    assert full <= set(known), full - set(known)
    for args in (["--only", "core"], ["--skip", "ddp", "--skip", "lightning"]):
        proc = run_cli(
            "run",
            "--hosts",
            "localhost",
            "--format",
            "json",
            "--run-dir",
            str(tmp_path),
            "--master-port",
            "29617",
            *args,
        )
        assert proc.returncode == 0, proc.stderr
        checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
        assert set(checks) == full  # the same checks whether a stage ran or was skipped
        if "--skip" in args:
            assert checks["network.tcp"]["status"] == "PASS" and checks["allreduce"]["status"] == "PASS"
            assert checks["ddp_equivalence"]["status"] == "SKIP" and "--skip" in checks["ddp_equivalence"]["message"]


def test_only_selects_a_stage_and_min_busbw_judges_bandwidth(tmp_path):
    proc = run_cli(
        "run",
        "--hosts",
        "localhost",
        "--format",
        "json",
        "--run-dir",
        str(tmp_path / "run"),
        "--only",
        "collectives",
        "--min-busbw",
        "100000",
    )
    assert proc.returncode == 1, proc.stderr
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert checks["allreduce"]["status"] == "PASS"
    bw = checks["allreduce.bandwidth"]
    assert bw["status"] == "FAIL" and bw["data"]["thresholds"]["fail_below"] == 100000
    assert checks["network.tcp"]["status"] == "SKIP" and "--only collectives" in checks["network.tcp"]["message"]
    assert checks["ddp_equivalence"]["status"] == "SKIP"
    assert not (tmp_path / "run" / "hosts" / "localhost" / "torch" / "ddp").exists()  # no DDP part run


def test_a_bad_min_busbw_or_stage_is_a_usage_error():
    proc = run_cli("run", "--hosts", "localhost", "--min-busbw", "fast")
    assert proc.returncode == 4
    assert proc.stderr.startswith("clustercheck: error: --min-busbw 'fast'")
    assert "Traceback" not in proc.stderr
    for args in (["--only", "gpu"], ["--skip", "core"]):
        proc = run_cli("run", "--hosts", "localhost", *args)
        assert proc.returncode == 4 and proc.stderr.startswith("clustercheck: error:"), proc.stderr
    for args in (["--shared-dir", "shared"], ["--data-path", "/data", "--data-path", "data"]):
        proc = run_cli("run", "--hosts", "localhost", *args)
        assert proc.returncode == 4 and "give an absolute path (it is a path on the nodes)" in proc.stderr


def test_a_python_without_torch_fails_with_its_cause(tmp_path):
    proc = run_cli(
        "run", "--hosts", "localhost", "--python", "/usr/bin/false", "--format", "json", "--run-dir", str(tmp_path)
    )
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["python.env"]["status"] == "FAIL"
    assert checks["torch.import"]["status"] == "FAIL"
    assert checks["torch.import"]["remediation"]
    for name in ("allreduce", "ddp_equivalence"):  # no torch job starts without torch
        assert checks[name]["status"] == "SKIP" and "torch does not import on localhost" in checks[name]["message"]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("hosts", "code", "message"),
    [
        ("node1:http", 4, "bad port"),
        ("inventory/missing.ini", 4, "no such inventory"),
        (",", 4, "names no host"),  # a list naming nothing is a usage error, not a filter that matched none
    ],
)
def test_bad_hosts_are_one_line_errors_with_their_exit_code(hosts, code, message):
    proc = run_cli("run", "--hosts", hosts)
    assert proc.returncode == code
    assert proc.stderr.startswith("clustercheck: error:") and message in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "give the nodes: --hosts INVENTORY, or --slurm inside a Slurm allocation"),
        (("--slurm",), "--slurm: not inside a Slurm allocation (no SLURM_JOB_ID): run it under salloc or sbatch"),
    ],
)
def test_no_nodes_to_check_is_a_one_line_usage_error(args, message, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    proc = run_cli("run", *args)
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr.startswith(f"clustercheck: error: {message}") and proc.stderr.count("\n") == 1, proc.stderr


def test_a_limit_that_matches_nothing_exits_5(tmp_path):
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("[gpu_nodes]\ngpu01 ansible_host=10.0.0.11\n")
    proc = run_cli("run", "--hosts", str(inventory), "--limit", "head")
    assert proc.returncode == 5, proc.stderr
    assert "no host matched" in proc.stderr


def test_junit_output_to_a_file(tmp_path):
    out = tmp_path / "report.xml"
    proc = run_cli(
        "run",
        "--hosts",
        "localhost",
        "--format",
        "junit",
        "-o",
        str(out),
        "--only",
        "core",
        "--skip",
        "local.*",
        "--run-dir",
        str(tmp_path / "run"),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    root = ET.parse(out).getroot()
    assert [s.get("name") for s in root.iter("testsuite")] == ["localhost", "(cluster)"]
    assert root.find(".//testcase[@name='ddp_equivalence']/skipped") is not None


def test_a_json_file_gets_the_json_report_without_format(tmp_path):
    """-o FILE's extension says the format: never the text table in a .json file."""
    out = tmp_path / "report.json"
    proc = run_cli(
        "run", "--hosts", "localhost", "-o", str(out), "--only", "core", "--skip", "local.*",
        "--run-dir", str(tmp_path / "run"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    report = json.loads(out.read_text())
    assert report == json.loads((tmp_path / "run" / "report.json").read_text())


def test_a_report_file_in_a_missing_directory_is_a_usage_error_before_anything_runs(tmp_path):
    proc = run_cli("run", "--hosts", "localhost", "-o", str(tmp_path / "missing" / "report.json"))
    assert proc.returncode == 4 and proc.stderr.startswith("clustercheck: error: -o "), proc.stderr
    assert "no such directory" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("where", ["/proc/nope", "/proc", "{tmp}/a-file/run"])
def test_a_run_directory_that_cannot_be_written_is_a_usage_error_before_anything_runs(where, tmp_path):
    (tmp_path / "a-file").touch()
    run_dir = where.format(tmp=tmp_path)
    proc = run_cli("run", "--hosts", "localhost", "--only", "core", "--run-dir", run_dir)
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr.startswith(f"clustercheck: error: --run-dir {run_dir}: cannot write there (")
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_bad_option_is_a_usage_error():
    proc = run_cli("run", "--hosts", "localhost", "--format", "xml")
    assert proc.returncode == 4
    assert "Traceback" not in proc.stderr
