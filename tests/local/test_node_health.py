"""`clustercheck node-health` run for real on this machine, as Slurm's HealthCheckProgram runs it: its results and
exit status, an empty environment, a hung nvidia-smi, node_exporter's textfile, no scontrol, bad input."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
from harness import CLUSTERCHECK, run_cli

from clustercheck.checks import registry
from clustercheck.run import health


def node_health(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CLUSTERCHECK, "node-health", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def statuses(proc: subprocess.CompletedProcess) -> dict[str, str]:
    return {c["name"]: c["status"] for c in json.loads(proc.stdout)["checks"]}


@pytest.fixture(scope="module")
def json_run():
    started = time.monotonic()
    proc = node_health("--format", "json")
    return proc, time.monotonic() - started


def test_it_runs_every_per_node_check_on_this_machine_and_exits_by_them(json_run):
    proc, took = json_run
    report = json.loads(proc.stdout)
    name = socket.gethostname().split(".")[0]
    assert report["hosts"] == [name] and report["schema_version"] == 1
    names = [c["name"] for c in report["checks"]]
    assert names == ["facts", *(c.name for c in registry.node_checks())]  # the run's per-node checks, no torch job
    assert all(c["host"] == name for c in report["checks"])
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["facts"]["status"] == "PASS" and checks["torch.import"]["status"] == "PASS"
    failed = [c for c in report["checks"] if c["status"] in ("FAIL", "ERROR")]
    assert proc.returncode == (1 if failed else 0), proc.stderr
    assert report["status"] == ("FAIL" if failed else report["status"])
    assert took < 30, f"node-health took {took:.1f} s"
    assert proc.stderr == ""  # nothing said beside the report without --slurm


def test_without_any_environment_it_finds_python_and_the_probes_as_with_the_users(json_run):
    """slurmd starts its health program with no PATH: the results are the same as from a shell."""
    given, _ = json_run
    empty = node_health("--format", "json", env={})
    assert empty.returncode == given.returncode, empty.stderr
    assert statuses(empty) == statuses(given)
    facts = next(c for c in json.loads(empty.stdout)["checks"] if c["name"] == "facts")
    assert facts["status"] == "PASS", facts["message"]


def test_a_hung_nvidia_smi_is_cut_at_its_deadline_and_nothing_of_it_is_left(tmp_path):
    """A stand-in nvidia-smi that never answers (a GPU falling off the bus leaves the real one so)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\nsleep 987\n")  # not exec: its child outlives a killed shell
    (fake / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    started = time.monotonic()
    proc = node_health("--format", "json", env=env)
    took = time.monotonic() - started
    assert proc.returncode in (0, 1) and json.loads(proc.stdout)["checks"], proc.stderr
    assert health.PROBE_DEADLINE <= took < health.PROBE_DEADLINE + 15, f"took {took:.1f} s"
    left = subprocess.run(["pgrep", "-f", "sleep 987"], capture_output=True, text=True)
    assert left.stdout == "", f"the hung probe is still running: {left.stdout}"


def test_text_output_the_textfile_and_no_scontrol(tmp_path):
    textfile_dir = tmp_path / "textfile"
    textfile_dir.mkdir()
    proc = node_health("--slurm", "--textfile-dir", str(textfile_dir))
    lines = proc.stdout.splitlines()
    checked = [line for line in lines if line.split(" ", 1)[0] in ("PASS", "WARN", "FAIL", "ERROR")]
    skipped = [int(line.split()[1]) for line in lines if line.startswith("SKIP  ")]  # `SKIP  29 skipped: why (...)`
    assert len(checked) + sum(skipped) == 1 + len(registry.node_checks())  # a line per check, the SKIPs by reason
    assert len(skipped) == len(set(line for line in lines if line.startswith("SKIP  ")))
    assert any(line.startswith("PASS  facts ") for line in checked)
    assert "result(s):" in lines[-1]
    failed = any(line.startswith(("FAIL", "ERROR")) for line in checked)
    assert proc.returncode == (1 if failed else 0)
    # This machine has no Slurm: said in one line, the results printed all the same.
    assert shutil.which("scontrol", path=health.system_path(os.environ.get("PATH"))) is None
    assert proc.stderr == "clustercheck: scontrol not found: the node's state in Slurm was not read or changed\n"
    assert [p.name for p in textfile_dir.iterdir()] == [health.TEXTFILE]  # no temporary file left
    text = (textfile_dir / health.TEXTFILE).read_text()
    name = socket.gethostname().split(".")[0]
    for line in checked:
        check = line.split()[1]
        assert (
            f'clustercheck_check_status{{check="{check}",host="{name}",status="{line.split()[0]}",source="node-health"}}'
            in text
        )
    assert "\nclustercheck_run_status{" in text and '\nclustercheck_run_duration_seconds{source="node-health"} ' in text
    tool = shutil.which("promtool")
    if tool:
        lint = subprocess.run([tool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
        assert lint.returncode == 0, lint.stdout + lint.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--format", "junit"], "Invalid value for '--format'"),
        (["--textfile-dir", "/nonexistent/textfile"], "--textfile-dir /nonexistent/textfile: no such directory"),
        (["--slurm", "extra"], "Got unexpected extra argument (extra)"),
    ],
)
def test_bad_input_is_one_line_and_exit_4(args, said):
    proc = run_cli("node-health", *args)
    assert proc.returncode == 4 and proc.stdout == ""
    assert proc.stderr.startswith("clustercheck: error: ") and said in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def torch_import(proc: subprocess.CompletedProcess) -> dict:
    return next(c for c in json.loads(proc.stdout)["checks"] if c["name"] == "torch.import")


def test_torch_is_imported_again_only_when_its_environment_changed_or_its_import_is_old(tmp_path):
    """A health program runs every few minutes: torch's import (about a second) is kept and reused while nothing
    it depends on changed, and while it is younger than --torch-max-age; a failed import is never kept."""
    env_dir = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    python = env_dir / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    )  # fmt: skip
    # The environment sees this one's packages (torch, clustercheck and its dependencies) through a .pth file.
    ours = sysconfig.get_paths()["purelib"]
    (site / "ours.pth").write_text(f"{ours}\n{Path(health.__file__).parents[2]}\n")
    cache = tmp_path / "cache"

    def run(*args: str, **env: str) -> dict:
        proc = subprocess.run(
            [python, "-m", "clustercheck", "node-health", "--format", "json", "--cache-dir", str(cache), *args],
            capture_output=True, text=True, env={**os.environ, **env}, timeout=120,
        )  # fmt: skip
        assert proc.returncode in (0, 1), proc.stderr
        return torch_import(proc)

    first = run()
    assert first["status"] == "PASS" and "imported_at" not in first["data"], first
    kept = cache / health.KEPT_IMPORT
    assert kept.stat().st_mode & 0o777 == 0o600
    second = run()
    assert second["status"] == "PASS" and second["data"]["imported_at"] == json.loads(kept.read_text())["at"]
    assert "unchanged since" in second["message"]
    # A package installed into the environment (pip adds its dist-info directory): torch is imported again.
    (site / "example-1.0.dist-info").mkdir()
    assert "imported_at" not in run()["data"]
    assert "imported_at" in run()["data"]
    assert "imported_at" not in run("--torch-max-age", "0")["data"]  # 0: every run
    assert "imported_at" not in run(LD_LIBRARY_PATH=str(tmp_path))["data"]  # what the import loads may differ
    assert "imported_at" not in run()["data"]  # the import kept is the last one's
    # A torch that fails to import is judged anew every run and never kept.
    broken = tmp_path / "broken" / "torch"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('libtorch_cuda.so: cannot open shared object file')\n")
    before = kept.read_text()
    for _ in range(2):
        found = run(PYTHONPATH=str(broken.parent))
        assert found["status"] == "FAIL" and "libtorch_cuda.so" in found["message"], found
    assert kept.read_text() == before
    # Older than --torch-max-age: imported again.
    assert "imported_at" in run()["data"]
    time.sleep(1.5)
    assert "imported_at" not in run("--torch-max-age", "1")["data"]


def test_a_cache_dir_that_cannot_be_written_is_one_line_and_exit_4(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    proc = run_cli("node-health", "--cache-dir", str(blocked / "cache"))
    assert proc.returncode == 4 and proc.stdout == "", proc.stderr
    assert proc.stderr.startswith(f"clustercheck: error: --cache-dir {blocked / 'cache'}: ")
    assert len(proc.stderr.strip().splitlines()) == 1
