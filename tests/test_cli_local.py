"""`clustercheck run --hosts localhost`: the README's main job, run for real on this machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
    assert report["status"] == "PASS"
    checks = {c["name"]: c for c in report["checks"]}
    assert set(checks) == {"torch.import", "allreduce", "allgather", "broadcast"}
    assert checks["allreduce"]["data"]["world_size"] == 2
    assert checks["allreduce"]["data"]["backend"] == "gloo"
    assert checks["allreduce"]["data"]["wrong"] == 0
    assert "READY" in proc.stderr
    assert sorted(p.name for p in (tmp_path / "run" / "ranks").iterdir()) == ["rank-0.json", "rank-1.json"]


def test_a_python_without_torch_fails_with_its_cause(tmp_path):
    proc = run_cli(
        "run", "--hosts", "localhost", "--python", "/usr/bin/false", "--format", "json", "--run-dir", str(tmp_path)
    )
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["torch.import"]["status"] == "FAIL"
    assert checks["torch.import"]["remediation"]
    assert checks["allreduce"]["status"] == "SKIP"
    assert "Traceback" not in proc.stderr


def test_unsupported_hosts_is_a_usage_error_without_traceback():
    proc = run_cli("run", "--hosts", "node1,node2")
    assert proc.returncode == 4
    assert proc.stderr.startswith("clustercheck: error:")
    assert "Traceback" not in proc.stderr


def test_bad_option_is_a_usage_error():
    proc = run_cli("run", "--hosts", "localhost", "--format", "xml")
    assert proc.returncode == 4
    assert "Traceback" not in proc.stderr
