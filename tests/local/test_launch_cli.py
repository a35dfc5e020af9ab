"""`clustercheck launch`, `logs` and `stop` on this machine: bad input is one line and exit 4, and a real job on
localhost streams every rank's output with its node/rank prefix and passes on the job's exit status."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from harness import CLUSTERCHECK, RANK_0_WRITES, run_cli

LOCALJOB = str(Path(__file__).parent / "localjob.py")  # a script that is there and compiles (launch reads it first)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["launch", "--hosts", "localhost", "--", "--bogus", "t.py"], "--bogus: not a torchrun option"),
        (["launch", "--hosts", "localhost", "--", "--node-rank=1", "t.py"], "--node-rank=1: not allowed after --"),
        (["launch", "--hosts", "localhost", "--", "--nnodes", "2", "t.py"], "the inventory has 1 node"),
        (["launch", "--hosts", "localhost", "--env", "X", "--", "t.py"], "--env X: expected NAME=VALUE"),
        (["launch", "--hosts", "nosuch/inventory.ini", "--", "t.py"], "no such inventory"),
        (["launch", "--hosts", "localhost", "--sync", "/usr", "--", "/etc/hostname"], "not inside --sync"),
        (["launch", "--hosts", "localhost", "--run-dir", "/proc/nope", "--", LOCALJOB], "--run-dir /proc/nope: cannot"),
        (["logs", "not-a-job"], "not-a-job: not a job id"),
        (["stop", "0123456789ab"], "no job 0123456789ab recorded on this machine"),
        (["launch", "--", "t.py"], "give the nodes: --hosts INVENTORY, or --slurm"),
        (["launch", "--slurm", "--", "t.py"], "--slurm: give the batch job's nodes (--nodes N or --nodelist NODES)"),
        (["launch", "--hosts", "localhost", "--nodes", "2", "--", "t.py"], "--nodes: only with --slurm"),
        (["launch", "--hosts", "localhost", "--dry-run", "--", "t.py"], "--dry-run: only with --slurm outside an"),
        (["launch", "--slurm", "--nodes", "2", "--hosts", "localhost", "--", "t.py"], "--hosts: a batch job runs on"),
        (["jobs"], "give the nodes: --hosts INVENTORY (or --slurm"),
        (["jobs", "--slurm", "--hosts", "localhost"], "--hosts and --slurm"),
    ],
)
def test_bad_input_is_one_line_and_exit_4(args, message, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    proc = run_cli(*args, timeout=60)
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr.count("\n") == 1 and message in proc.stderr and "Traceback" not in proc.stderr


def test_a_dry_run_writes_and_prints_the_batch_script_and_needs_no_slurm(tmp_path):
    """No Slurm on this machine: --dry-run writes the script into the run directory, prints it, submits nothing."""
    proc = run_cli(
        "launch", "--slurm", "--nodes", "2", "--time", "10", "--dry-run", "--run-dir", str(tmp_path / "run"),
        "--", "train.py", "--steps", "3",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (tmp_path / "run" / "launch.sbatch").read_text()
    assert "#SBATCH --nodes=2\n#SBATCH --time=10\n" in proc.stdout
    assert proc.stdout.rstrip().endswith(" -- train.py --steps 3")
    assert proc.stderr.startswith("clustercheck: not submitted (--dry-run)")


def test_a_slurm_command_where_slurm_is_missing_is_one_line(tmp_path, monkeypatch):
    """A Slurm job id (digits) goes to Slurm: without its commands here, one line and exit 1, no traceback."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("PATH", "/nonexistent")
    for command in (["stop", "42"], ["logs", "42"], ["jobs", "--slurm"]):
        proc = run_cli(*command)
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr.count("\n") == 1 and "cannot run here" in proc.stderr, proc.stderr


@pytest.mark.parametrize("command", [["jobs"], ["jobs", "--all"], ["logs", "0123456789ab"], ["stop", "0123456789ab"]])
@pytest.mark.parametrize(
    ("hosts", "cause"),
    [
        ("127.0.0.1:1", "127.0.0.1 (127.0.0.1:1): unreachable"),
        ("node1.invalid", "node1.invalid (node1.invalid:22): unreachable"),
    ],
)
def test_a_node_that_cannot_be_asked_is_named_and_the_exit_status_is_1(command, hosts, cause, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    proc = run_cli(*command, "--hosts", hosts, "--connect-timeout", "5", timeout=60)
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.splitlines()[-1]
    assert last.startswith("clustercheck: error: could not ") and cause in last, proc.stderr
    assert "no running jobs" not in proc.stderr and "no job" not in proc.stderr and "Traceback" not in proc.stderr


def test_a_launch_whose_node_cannot_be_reached_names_it_and_exits_6(tmp_path):
    (tmp_path / "t.py").write_text("print('never')\n")
    run = tmp_path / "run"
    proc = run_cli("launch", "--hosts", "127.0.0.1:1", "--run-dir", str(run), "--", str(tmp_path / "t.py"), timeout=120)
    assert proc.returncode == 6, proc.stderr
    last = proc.stderr.splitlines()[-1]
    assert last.startswith("clustercheck: error: preflight failed") and "127.0.0.1 (127.0.0.1:1): unreachable" in last
    assert "--no-preflight" not in proc.stderr and "internal error" not in proc.stderr
    assert (run / "preflight" / "report.json").exists()
    proc = run_cli(
        "launch", "--no-preflight", "--hosts", "127.0.0.1:1", "--run-dir", str(run), "--", "t.py", timeout=120
    )
    assert proc.returncode == 6 and "127.0.0.1 (127.0.0.1:1): unreachable" in proc.stderr, proc.stderr


@pytest.mark.skipif(Path("/run/systemd/system").is_dir(), reason="this machine runs systemd as PID 1")
def test_a_detached_launch_on_a_node_without_systemd_says_so_and_records_no_job(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "t.py").write_text("print('never')\n")
    args = ["--hosts", "localhost", "--no-preflight", "--run-dir", str(tmp_path / "run")]
    proc = run_cli("launch", "--detach", *args, "--sync", str(tmp_path / "code"), "--", "t.py", timeout=120)
    assert proc.returncode == 6, proc.stderr
    last = proc.stderr.splitlines()[-1]
    assert "localhost: systemd is not running as PID 1 here" in last and "launch without --detach" in last
    assert "Failed to connect to bus" not in proc.stderr
    listed = run_cli("jobs", "--hosts", "localhost", "--all", timeout=60)
    assert listed.returncode == 0 and listed.stdout == "" and "no jobs" in listed.stderr
    assert not (tmp_path / "state" / "clustercheck" / "jobs").exists()


def test_no_script_is_a_usage_error():
    proc = run_cli("launch", "--hosts", "localhost", timeout=60)
    assert proc.returncode == 4 and "Traceback" not in proc.stderr


JOB = """
import os, sys
import torch.distributed as dist
dist.init_process_group("gloo")
print(f"hello from rank {dist.get_rank()} of {dist.get_world_size()}", flush=True)
print(f"warning from rank {dist.get_rank()}", file=sys.stderr, flush=True)
dist.barrier()
dist.destroy_process_group()
# torch 2.13's gloo can abort the interpreter's shutdown (SIGABRT) on a busy machine; leave as the README's
# train_ddp.py does, with the status asked for
os._exit(int(sys.argv[1]))
"""


def test_a_job_on_localhost_streams_prefixed_rank_output_and_passes_on_its_exit_status(tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "job.py").write_text(JOB)
    run = tmp_path / "run"
    base = ["launch", "--hosts", "localhost", "--no-preflight", "--nproc-per-node", "2", "--master-port", "29641"]
    proc = run_cli(*base, "--run-dir", str(run), "--sync", str(tmp_path / "code"), "--", "job.py", "0", timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "localhost/0: hello from rank 0 of 2" in proc.stdout.splitlines()
    assert "localhost/1: hello from rank 1 of 2" in proc.stdout.splitlines()
    assert "localhost/1: warning from rank 1" in proc.stdout.splitlines()
    kept = (run / "hosts" / "localhost" / "output.log").read_text()
    assert "localhost/1: hello from rank 1 of 2" in kept
    command = (run / "hosts" / "localhost" / "launch.command").read_text()
    assert "--nnodes=1" in command and "--node-rank=0" in command and "--nproc-per-node=2" in command
    assert "the job completed on every node" in proc.stderr
    # When every rank failed alike, the script's own exit status is clustercheck's, not torchrun's 1. One rank: two
    # exiting at once may see torchrun stop the second before it exits on its own (tests/unit/test_rootcause.py).
    one = [*base[:4], "--nproc-per-node", "1", *base[6:]]
    failed = run_cli(*one, "--sync", str(tmp_path / "code"), "--", "job.py", "3", timeout=240)
    assert failed.returncode == 3, failed.stderr[-3000:]
    assert "the job failed on localhost first (exit 1)" in failed.stderr
    # the rank's last lines, from its standard output and error: the two streams reach torchrun's log in either order
    told = next(
        line for line in failed.stderr.splitlines() if "localhost's rank 0 (local rank 0): exit code 3 | " in line
    )
    quoted = told.split("exit code 3 | ", 1)[1]
    assert "hello from rank 0 of 1" in quoted and "warning from rank 0" in quoted, told
    assert "Every rank failed alike: exit 3, the script's own status (torchrun's: 1)" in failed.stderr


CUDA = """
import os
import torch
import torch.distributed as dist
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
"""


@pytest.mark.skipif(torch.version.cuda is not None, reason="torch here is a CUDA build")
def test_a_cuda_script_on_this_machine_without_a_gpu_says_it_has_none(tmp_path):
    """A script written for GPUs, launched here (no GPU, a CPU build of torch): its ranks' AttributeError, and
    what clustercheck knew of this machine."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train_cuda.py").write_text(CUDA)  # not cuda.py: torch imports a module of that name
    args = ["launch", "--hosts", "localhost", "--no-preflight", "--master-port", "29644", "--run-dir"]
    proc = run_cli(*args, str(tmp_path / "run"), "--sync", str(tmp_path / "code"), "--", "train_cuda.py", timeout=240)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'. " in proc.stderr
    assert f"localhost has no GPU, and its torch {torch.__version__} is a CPU build: the script asks for CUDA" in (
        proc.stderr
    )


FOREVER = """
import time
import torch.distributed as dist
dist.init_process_group("gloo")
for tick in range(100000):
    print(f"rank {dist.get_rank()} tick {tick}", flush=True)
    time.sleep(0.5)
"""


def test_ctrl_c_stops_every_rank_and_leaves_nothing_running(tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "forever.py").write_text(FOREVER)
    args = ["launch", "--hosts", "localhost", "--no-preflight", "--nproc-per-node", "2", "--master-port", "29642"]
    proc = subprocess.Popen(
        [CLUSTERCHECK, *args, "--run-dir", str(tmp_path / "run"), "--sync", str(tmp_path / "code"), "--", "forever.py"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = set()
    deadline = time.monotonic() + 180
    assert proc.stdout is not None
    while len(seen) < 2 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if " tick " in line:
            seen.add(line.split(":")[0])
    assert seen == {"localhost/0", "localhost/1"}
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    assert "interrupted; processes started on the nodes were stopped" in err
    left = subprocess.run(["pgrep", "-af", "[f]orever.py"], capture_output=True, text=True)
    assert left.stdout == ""
    assert not list(Path("/tmp").glob("clustercheck-*/code/forever.py"))


def test_launches_from_the_code_directory_compare_the_code_only(tmp_path, monkeypatch):
    """The user's way: cd into the code and launch, twice. The run directories clustercheck writes there, the
    environment beside the script and what rank 0 wrote are not the code: the file count stays the same."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the node's record of launches from the directory
    code = tmp_path / "code"
    (code / ".venv" / "lib").mkdir(parents=True)
    (code / ".venv" / "lib" / "big.bin").write_bytes(b"\0" * 1024)
    (code / "job.py").write_text(RANK_0_WRITES)
    (code / "util.py").write_text("X = 1\n")
    base = ["launch", "--hosts", "localhost", "--no-preflight", "--nproc-per-node", "2", "--master-port", "29643"]
    said = []
    for _ in range(2):
        proc = subprocess.run(
            [CLUSTERCHECK, *base, "--chdir", str(code), "--", "job.py"],
            cwd=code,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "localhost/1: rank 1 done" in proc.stdout
        said.append(proc.stderr)
    assert all(f"{code / 'job.py'}: the same 2 file(s) on every node" in s for s in said), said
    assert "not compared on localhost, written by earlier launches from there: lightning_logs/" in said[1]
    assert len(list((code / "clustercheck-runs").iterdir())) == 2
