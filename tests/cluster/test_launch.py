"""`clustercheck launch` on the 3-node test cluster, over SSH, as a user runs it: the README's DDP script to
completion, a failing rank that stops every node, code that differs on one node, and a detached job that outlives
the control machine's clustercheck process, then `jobs`, `logs` and `stop`. One rank per node (gloo on CPUs), asked
with `--nproc-per-node 1`: the test nodes share this machine's few cores (the default, 2 CPU ranks per node as `run`
uses, is tested on localhost by tests/local/test_quickstart.py)."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from harness import CLUSTERCHECK, RANK_0_WRITES, leftovers, ssh_client, ssh_run

from clustercheck.exitcodes import ExitCode

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
CODE = "/root/launch-code"  # where the tests put the code on every node, as a user's deployment would


def example_ddp_script() -> str:
    """The repository's plain DDP example (examples/train_ddp.py, the README's Quick start and Training use it)."""
    return (REPO / "examples" / "train_ddp.py").read_text()


FAILING = """
import os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} started", flush=True)
if dist.get_rank() == 1:
    print("rank 1 gives up", flush=True)
    sys.exit(3)
time.sleep(600)  # the other ranks would wait far longer than the test: clustercheck must stop them
"""

FOREVER = """
import time
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
for tick in range(100000):
    print(f"rank {rank} tick {tick}", flush=True)
    time.sleep(0.5)
"""


def put_code(cluster, files: dict[str, str], nodes=None) -> None:
    for node in nodes or cluster.nodes:
        with ssh_client(cluster, node) as client:
            ssh_run(client, f"rm -rf {CODE} && mkdir -p {CODE}")
            with client.open_sftp() as sftp:
                for name, text in files.items():
                    with sftp.open(f"{CODE}/{name}", "w") as fh:
                        fh.write(text)


def launch_command(cluster, tmp_path: Path, *args: str) -> list[str]:
    empty_config = tmp_path / "ssh_config"
    empty_config.touch()
    one_rank = ["--nproc-per-node", "1"] if args[:1] == ("launch",) else []
    return [
        CLUSTERCHECK, *args[:1], "--hosts", cluster.inventory, "--ssh-config", str(empty_config), *one_rank, *args[1:]
    ]  # fmt: skip


def cli(cluster, tmp_path, *args, timeout=300, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        launch_command(cluster, tmp_path, *args), capture_output=True, text=True, timeout=timeout, env=env
    )


def torchruns(cluster) -> dict[str, str]:
    found = {}
    for node in cluster.nodes:
        with ssh_client(cluster, node) as client:
            _, out = ssh_run(client, "pgrep -af '[t]orch.distributed.run'; true", timeout=60)
            if out.strip():
                found[node.name] = out.strip()
    return found


def test_launch_runs_the_example_ddp_script_to_completion_on_every_node(torch_cluster, tmp_path):
    put_code(torch_cluster, {"train_ddp.py": example_ddp_script()})
    run = tmp_path / "run"
    proc = cli(
        torch_cluster,
        tmp_path,
        "launch",
        "--run-dir",
        str(run),
        "--master-port",
        "29651",
        "--",
        f"{CODE}/train_ddp.py",
        "--steps",
        "20",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "preflight passed" in proc.stderr and "the same 1 file(s) on every node" in proc.stderr
    lines = proc.stdout.splitlines()
    for rank, node in enumerate(torch_cluster.nodes):
        hostname_line = next(line for line in lines if line.startswith(f"{node.name}/{rank}: rank {rank} "))
        assert f"rank {rank} of world size 3" in hostname_line
        assert f"{node.name}/{rank}: step 19 loss" in proc.stdout
        kept = (run / "hosts" / node.name / "output.log").read_text()
        assert f"{node.name}/{rank}: step 19 loss" in kept
        command = (run / "hosts" / node.name / "launch.command").read_text()
        assert f"--node-rank={rank}" in command and "GLOO_SOCKET_IFNAME=eth0" in command
        assert f"--master-addr={torch_cluster.node('node1').address}" in command
        assert "/opt/clustercheck/venv/bin/python -m torch.distributed.run" in command
    assert (run / "preflight" / "report.json").exists()
    assert leftovers(torch_cluster) == {}


def test_a_failing_rank_stops_every_node_and_its_status_is_the_exit_status(torch_cluster, tmp_path):
    put_code(torch_cluster, {"fail.py": FAILING})
    started = time.monotonic()
    proc = cli(
        torch_cluster,
        tmp_path,
        "launch",
        "--no-preflight",
        "--run-dir",
        str(tmp_path / "run"),
        "--master-port",
        "29652",
        "--",
        f"{CODE}/fail.py",
        timeout=400,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]  # torchrun's exit status for a failed rank
    assert time.monotonic() - started < 240  # the ranks left waiting were stopped, not waited for
    assert "node2/1: rank 1 gives up" in proc.stdout
    assert "the job failed on node2 first (exit 1)" in proc.stderr, proc.stderr[-2000:]
    assert "every node's torchrun was stopped" in proc.stderr
    assert leftovers(torch_cluster) == {}
    assert torchruns(torch_cluster) == {}


def test_code_that_differs_on_one_node_is_refused_and_sync_runs_the_same_code_everywhere(torch_cluster, tmp_path):
    script = example_ddp_script()
    put_code(torch_cluster, {"train_ddp.py": script, "util.py": "X = 1\n"})
    put_code(
        torch_cluster,
        {"train_ddp.py": script + "# edited on node3\n", "util.py": "X = 1\n"},
        nodes=[torch_cluster.node("node3")],
    )
    proc = cli(torch_cluster, tmp_path, "launch", "--no-preflight", "--", f"{CODE}/train_ddp.py", timeout=200)
    assert proc.returncode == 6, proc.stderr
    assert proc.stderr.startswith("clustercheck: error: the script or its directory is not the same on every node")
    assert f"node3: differs: train_ddp.py (compared with node1's {CODE})" in proc.stderr
    assert "node2" not in proc.stderr.splitlines()[-1].split("not the same on every node")[1]
    assert proc.stdout == "" and torchruns(torch_cluster) == {}
    # --sync uploads the control machine's copy to every node and runs that.
    local = tmp_path / "code"
    local.mkdir()
    (local / "train_ddp.py").write_text(script)
    synced = cli(
        torch_cluster,
        tmp_path,
        "launch",
        "--no-preflight",
        "--master-port",
        "29653",
        "--run-dir",
        str(tmp_path / "run"),
        "--sync",
        str(local),
        "--",
        "train_ddp.py",
        "--steps",
        "3",
        timeout=300,
    )
    assert synced.returncode == 0, synced.stderr[-3000:]
    assert "node3/2: rank 2 of world size 3" in synced.stdout
    assert leftovers(torch_cluster) == {}


def test_what_rank_0_wrote_beside_the_script_does_not_refuse_the_next_launch(torch_cluster, tmp_path):
    put_code(torch_cluster, {"job.py": RANK_0_WRITES, "util.py": "X = 1\n"})
    for node in torch_cluster.nodes:  # no record of earlier tests' launches from that directory
        with ssh_client(torch_cluster, node) as client:
            ssh_run(client, "rm -rf ~/.local/state/clustercheck/code")
    args = ["launch", "--no-preflight", "--run-dir", str(tmp_path / "run"), "--master-port", "29655"]
    for attempt in range(2):
        proc = cli(torch_cluster, tmp_path, *args, "--", f"{CODE}/job.py", timeout=300)
        assert proc.returncode == 0, f"launch {attempt + 1}: {proc.stderr[-3000:]}"
        assert "node3/2: rank 2 done" in proc.stdout
        assert f"{CODE}/job.py: the same 2 file(s) on every node" in proc.stderr
    assert "not compared on node1, written by earlier launches from there: lightning_logs/" in proc.stderr
    # A file added to one node after the runs is code, and is named.
    with ssh_client(torch_cluster, torch_cluster.node("node1")) as client:
        ssh_run(client, f"echo 'LAYERS = 8' > {CODE}/model2.py")
    proc = cli(torch_cluster, tmp_path, *args, "--", f"{CODE}/job.py", timeout=300)
    assert proc.returncode == 6, proc.stderr
    assert f"node2: missing: model2.py (compared with node1's {CODE})" in proc.stderr
    assert leftovers(torch_cluster) == {}


def test_a_detached_job_outlives_clustercheck_then_jobs_logs_and_stop_reach_every_node(
    torch_cluster, tmp_path, monkeypatch
):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    local = tmp_path / "code"
    local.mkdir()
    (local / "forever.py").write_text(FOREVER)
    started = cli(
        torch_cluster,
        tmp_path,
        "launch",
        "--detach",
        "--no-preflight",
        "--master-port",
        "29654",
        "--sync",
        str(local),
        "--",
        "forever.py",
    )
    assert started.returncode == 0, started.stderr[-3000:]
    job = started.stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{12}", job), started.stdout
    try:
        # Follow the logs, then kill that clustercheck process outright, as a dropped laptop would.
        follow = subprocess.Popen(
            [CLUSTERCHECK, "logs", job, "--follow"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        seen: set[str] = set()
        deadline = time.monotonic() + 120
        assert follow.stdout is not None
        while len(seen) < 3 and time.monotonic() < deadline:
            line = follow.stdout.readline()
            match = re.match(r"^(node\d/\d): rank \d tick \d+$", line.strip())
            if match:
                seen.add(match.group(1))
        follow.send_signal(signal.SIGKILL)
        follow.wait(30)
        assert seen == {"node1/0", "node2/1", "node3/2"}
        # Ctrl-C on a follower stops the following and says the job goes on.
        follow = subprocess.Popen(
            [CLUSTERCHECK, "logs", job, "--follow"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert follow.stdout is not None
        line, deadline = " ", time.monotonic() + 120
        while line and not re.search(r"tick \d+$", line) and time.monotonic() < deadline:
            line = follow.stdout.readline()  # "" once it ended
        follow.send_signal(signal.SIGINT)
        _, said = follow.communicate(timeout=60)
        assert follow.returncode == ExitCode.INTERRUPTED, said
        assert said.strip().splitlines()[-1] == (
            f"clustercheck: interrupted; job {job} goes on running (clustercheck stop {job} stops it); "
            "processes started on the nodes were stopped"
        )
        time.sleep(2)
        for node in torch_cluster.nodes:
            with ssh_client(torch_cluster, node) as client:
                status, out = ssh_run(client, f"systemctl is-active clustercheck-job-{job}.service", timeout=60)
                assert status == 0 and out.strip() == "active", f"{node.name}: {out}"
        listed = cli(torch_cluster, tmp_path, "jobs")
        assert listed.returncode == 0, listed.stderr
        assert re.search(rf"^{job}  \S+ \S+  running on 3/3 node\(s\)$", listed.stdout, re.M), listed.stdout
        shown = subprocess.run([CLUSTERCHECK, "logs", job], capture_output=True, text=True, timeout=120)
        assert shown.returncode == 0, shown.stderr
        for prefix in ("node1/0: rank 0 tick 0", "node2/1: rank 1 tick 0", "node3/2: rank 2 tick 0"):
            assert prefix in shown.stdout.splitlines()
    finally:
        stopped = subprocess.run([CLUSTERCHECK, "stop", job], capture_output=True, text=True, timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    assert sorted(stopped.stdout.splitlines()) == ["node1: stopped", "node2: stopped", "node3: stopped"]
    assert torchruns(torch_cluster) == {}
    for node in torch_cluster.nodes:
        with ssh_client(torch_cluster, node) as client:
            status, _ = ssh_run(client, f"systemctl is-active --quiet clustercheck-job-{job}.service", timeout=60)
            assert status != 0
    ended = cli(torch_cluster, tmp_path, "jobs", "--all")
    assert re.search(rf"^{job}  .*stopped on 3/3 node\(s\)$", ended.stdout, re.M), ended.stdout
    assert leftovers(torch_cluster) == {}
