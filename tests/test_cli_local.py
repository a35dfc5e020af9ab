"""`clustercheck run --hosts localhost`: the README's main job, run for real on this machine."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

CLUSTERCHECK = str(Path(sys.executable).parent / "clustercheck")


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([CLUSTERCHECK, *args], capture_output=True, text=True, timeout=timeout)


def test_localhost_passes_with_two_gloo_ranks(tmp_path):
    proc = run_cli(
        "run", "--hosts", "localhost", "--format", "json", "--run-dir", str(tmp_path / "run"), "--master-port", "29611"
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["schema_version"] == 1
    assert report["status"] in ("PASS", "WARN")
    assert report["hosts"] == ["localhost"]
    checks = {c["name"]: c for c in report["checks"]}
    assert {"connect", "facts", "torch.import", "local.allreduce", "local.allgather", "local.broadcast"} <= set(checks)
    assert checks["connect"]["message"] == "localhost: local"
    assert checks["torch.import"]["status"] == "PASS"
    for name in ("local.allreduce", "local.allgather", "local.broadcast"):
        assert checks[name]["status"] == "PASS"
        assert checks[name]["data"]["world_size"] == 2
        assert checks[name]["data"]["backend"] == "gloo"
        assert checks[name]["data"]["wrong"] == 0
    assert all(c["status"] in ("PASS", "WARN", "SKIP") for c in report["checks"])
    assert "READY" in proc.stderr
    host_dir = tmp_path / "run" / "hosts" / "localhost"
    assert sorted(p.name for p in (host_dir / "ranks").iterdir()) == ["rank-0.json", "rank-1.json"]
    assert json.loads((host_dir / "facts.json").read_text())["python"]["executable"]
    assert (tmp_path / "run" / "report.xml").exists()
    assert len(report["run_id"]) == 12
    assert not Path(f"/tmp/clustercheck-{report['run_id']}").exists()  # the work directory is cleaned up too


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
    assert checks["local.allreduce"]["status"] == "SKIP"
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("hosts", "code", "message"),
    [
        ("node1:http", 4, "bad port"),
        ("inventory/missing.ini", 4, "no such inventory"),
        (",", 5, "no host matched"),
    ],
)
def test_bad_hosts_are_one_line_errors_with_their_exit_code(hosts, code, message):
    proc = run_cli("run", "--hosts", hosts)
    assert proc.returncode == code
    assert proc.stderr.startswith("clustercheck: error:") and message in proc.stderr
    assert "Traceback" not in proc.stderr


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
        "--skip",
        "local.*",
        "--run-dir",
        str(tmp_path / "run"),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    root = ET.parse(out).getroot()
    assert [s.get("name") for s in root.iter("testsuite")] == ["localhost", "(cluster)"]
    assert root.find(".//testcase[@name='local.allreduce']/skipped") is not None


def test_bad_option_is_a_usage_error():
    proc = run_cli("run", "--hosts", "localhost", "--format", "xml")
    assert proc.returncode == 4
    assert "Traceback" not in proc.stderr
