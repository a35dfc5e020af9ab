"""The foreground launch's orchestration with fake transports: output streamed with prefixes and kept per node,
the first failing node's status passed on, the other nodes stopped."""

from __future__ import annotations

import types
from dataclasses import replace
from pathlib import Path

import pytest
from fakes import FakeNode
from test_checks import recorded_node
from test_torchjob import KILLED, PEER

from clustercheck.checks.network import master_port_check
from clustercheck.inventory import Node
from clustercheck.launcher import command, preflight, session
from clustercheck.launcher.job import LaunchOptions, NotStarted
from clustercheck.reach import Fanout
from clustercheck.run.pipeline import Outcome
from clustercheck.stages import Member, runner
from clustercheck.transport import CommandResult, TransportError, workdir_for


def streaming_node(host: str, status: int | None, lines: list[str], after: float = 0.0) -> FakeNode:
    """Prints its tee-marked lines, then exits with STATUS after AFTER seconds, or (STATUS None) runs until
    stopped."""
    said = CommandResult(status, "".join(line + "\n" for line in lines), "")
    return FakeNode(host, said, stream="lines", delay=after, until_stopped=status is None)


def no_connection(node, run_id, register):
    raise AssertionError(f"{node.name}: the test's members are connected already")


def launch_on(nodes, tmp_path, argv=("train.py",), ranks=1):
    echoed, said = [], []
    # RANKS per node, as `--nproc-per-node` asks (1: each fake node's torchrun prints local rank 0's lines).
    options = LaunchOptions(command=command.parse(list(argv)), run_dir=tmp_path, preflight=False, nproc_per_node=ranks)
    job = session.Launch(
        [n.node for n in nodes], options, reach=Fanout(no_connection), echo=echoed.append, say=said.append
    )
    job.members = nodes
    job.transports = {m.name: m.transport for m in nodes}
    job.plan("train.py", None)
    return job, echoed, said


def member(name, transport):
    facts = types.SimpleNamespace(
        python="/opt/venv/bin/python", torch_python="/opt/venv/bin/python", image=None, torch=None
    )
    address = "10.0.0.1" + name[-1]
    return Member(Node(name, address), transport, facts, address, "eth0", name, 0)


def test_one_failing_node_stops_the_others_and_its_status_is_the_jobs(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "FAILURE_GRACE", 0.2)
    fakes = {
        "node1": streaming_node("node1", None, ["[default0]:step 1"]),
        "node2": streaming_node("node2", 3, ["[default0]:step 1", "[default0]:CUDA error: out of memory"]),
        "node3": streaming_node("node3", None, ["[default0]:step 1"]),
    }
    job, echoed, _ = launch_on([member(n, t) for n, t in fakes.items()], tmp_path)
    finished = job.run_foreground()
    assert finished.status == 3
    assert finished.message.startswith("the job failed on node2 first (exit 3)")
    assert "node2/1: CUDA error: out of memory" in finished.message
    assert fakes["node1"].halted.is_set() and fakes["node3"].halted.is_set()
    assert {"node1/0: step 1", "node2/1: step 1", "node3/2: step 1"} <= set(echoed)
    assert (tmp_path / "hosts" / "node2" / "output.log").read_text().endswith("node2/1: CUDA error: out of memory\n")
    assert "--node-rank=2" in (tmp_path / "hosts" / "node3" / "launch.command").read_text()
    job.close()
    assert all(f.cleaned for f in fakes.values())


def test_every_node_completing_is_exit_0(tmp_path):
    fakes = {n: streaming_node(n, 0, ["[default0]:done"]) for n in ("node1", "node2")}
    job, echoed, _ = launch_on([member(n, t) for n, t in fakes.items()], tmp_path)
    finished = job.run_foreground()
    assert finished.status == 0 and "completed on every node" in finished.message
    assert sorted(echoed) == ["node1/0: done", "node2/1: done"]
    assert not any(f.halted.is_set() for f in fakes.values())


def unreachable(node, run_id, register):
    raise TransportError(f"{node.name} ({node.address}:22): unreachable: Name or service not known")


def test_a_preflight_where_no_node_answers_names_each_node_and_why(tmp_path):
    options = LaunchOptions(command=command.parse(["train.py"]), run_dir=tmp_path / "run")
    nodes = [Node("gpu1", "gpu1.invalid"), Node("gpu2", "gpu2.invalid")]
    said = []
    job = session.Launch(nodes, options, reach=Fanout(unreachable), echo=said.append, say=said.append)
    with pytest.raises(NotStarted) as refused:
        job.preflight()
    message = str(refused.value)
    assert "connect on gpu1: gpu1 (gpu1.invalid:22): unreachable: Name or service not known" in message
    assert "fix: Check that the node is up" in message and "--no-preflight" not in message
    assert any("FAIL connect on gpu2: gpu2 (gpu2.invalid:22): unreachable" in line for line in said)
    assert (tmp_path / "run" / "preflight" / "report.json").exists()


def test_a_busy_master_port_refuses_with_the_checks_own_fix(tmp_path, monkeypatch):
    busy = master_port_check(
        {
            "listen": [
                {"port": 29500, "ok": False, "error": "address in use", "holders": [{"pid": 4242, "command": "python"}]}
            ]
        },
        "gpu1",
        29500,
    )

    class Busy:
        run_id = "0123456789ab"

        def __init__(self, *args, **kwargs):
            pass

        def run(self):
            return Outcome([busy])

    monkeypatch.setattr(preflight, "Pipeline", Busy)
    options = LaunchOptions(command=command.parse(["train.py"]), run_dir=tmp_path)
    job = session.Launch([Node("gpu1", "10.0.0.11")], options, reach=Fanout(no_connection), echo=print, say=print)
    with pytest.raises(
        NotStarted,
        match=r"fix: Stop the stale process \(kill 4242\) or choose another "
        r"port with --master-port\.",
    ) as refused:
        job.preflight()
    assert "--no-preflight" not in str(refused.value)


def test_a_detached_job_on_the_control_machine_runs_where_the_script_was_compared(tmp_path, monkeypatch):
    """Without --chdir, the same-code check looks the script up in the current directory on the control machine
    (and in the home directory over SSH); the detached unit must start there too, not in $HOME."""
    monkeypatch.chdir(tmp_path)
    local = streaming_node("localhost", 0, [])
    remote = streaming_node("node2", 0, [])
    here = Member(Node("localhost", "127.0.0.1", connection="local"), local, member("n1", None).facts, "", "lo", "", 0)
    job, _, _ = launch_on([here, member("node2", remote)], tmp_path)
    job.job_id = "0123456789ab"
    job.start_detached(None)
    local_argv, remote_argv = local.commands[-1], remote.commands[-1]
    job_id_at = local_argv.index("0123456789ab")
    assert local_argv[job_id_at + 1] == str(tmp_path)  # the working directory argument of the unit's start
    assert remote_argv[remote_argv.index("0123456789ab") + 1] == ""  # over SSH: the home directory


def test_a_failed_job_quotes_the_failing_ranks_own_error_not_torchruns_report(tmp_path, monkeypatch):
    """node2's real torchrun output (tests/unit/data/torchrun/): rank 3 raised, torchrun's report calls rank 2 the
    root cause. The launch names rank 3 with its own exception."""
    monkeypatch.setattr(runner, "FAILURE_GRACE", 0.2)
    recorded = Path(__file__).parent / "data" / "torchrun" / "ddp-rank3-raised-node2.log"
    fakes = {
        "node1": streaming_node("node1", None, ["[default0]:step 1"]),
        "node2": streaming_node("node2", 1, recorded.read_text().splitlines()),
    }
    job, _, _ = launch_on([member(n, t) for n, t in fakes.items()], tmp_path)
    finished = job.run_foreground()
    assert finished.status == 1
    assert "node2's rank 3 (local rank 1): " in finished.message, finished.message
    assert finished.message.endswith("RuntimeError: CUDA error: an illegal memory access was encountered")
    assert "Root Cause" not in finished.message and "To enable traceback" not in finished.message
    job.close()


def test_the_node_whose_rank_was_killed_is_named_even_when_a_peer_failed_earlier(tmp_path, monkeypatch):
    """The launch tells the first failure as the torch stages do (the same runner): node1's rank lost its peer and
    ended first, node2's rank was killed (real torchrun report lines, tests/unit/test_torchjob.py)."""
    monkeypatch.setattr(runner, "FAILURE_GRACE", 2.0)
    fakes = {
        "node1": streaming_node("node1", 1, PEER.splitlines()),
        "node2": streaming_node("node2", 1, KILLED.splitlines(), after=0.5),
        "node3": streaming_node("node3", None, ["[default0]:step 1"]),
    }
    job, _, _ = launch_on([member(n, t) for n, t in fakes.items()], tmp_path)
    finished = job.run_foreground()
    assert finished.message.startswith("the job failed on node2 first (exit 1)"), finished.message
    assert "Signal 9 (SIGKILL)" in finished.message
    assert fakes["node3"].halted.is_set()
    job.close()


TORCHRUN = Path(__file__).parent / "data" / "torchrun"  # real torchrun outputs (data/README.md)


def test_a_rank_failing_without_a_traceback_is_quoted_and_ranks_failing_alike_give_the_scripts_status(
    tmp_path, monkeypatch
):
    """The README's train_ddp.py --steps ten on two ranks: argparse's error, exit 2 (torchrun's own status: 1)."""
    monkeypatch.setattr(runner, "FAILURE_GRACE", 0.2)
    recorded = (TORCHRUN / "argparse-invalid-int-localhost.log").read_text().splitlines()
    job, _, _ = launch_on([member("localhost", streaming_node("localhost", 1, recorded))], tmp_path, ranks=2)
    finished = job.run_foreground()
    assert finished.status == 2, finished.message
    assert (
        "localhost's rank 1 (local rank 1): exit code 2 | usage: train_ddp.py [-h] [--steps STEPS] [--checkpoint "
        "CHECKPOINT] | train_ddp.py: error: argument --steps: invalid int value: 'ten'" in finished.message
    )
    assert finished.message.endswith("Every rank failed alike: exit 2, the script's own status (torchrun's: 1)")
    job.close()


def test_a_cuda_script_on_a_node_without_a_gpu_says_the_node_has_none_and_a_cpu_torch(tmp_path, monkeypatch):
    """A script written for GPUs on this development machine (no GPU, torch 2.13.0+cpu): its ranks' AttributeError
    on torch._C._cuda_setDevice, and what clustercheck collected there (the recorded facts of the same machine)."""
    monkeypatch.setattr(runner, "FAILURE_GRACE", 0.2)
    recorded = (TORCHRUN / "cuda-script-cpu-torch-localhost.log").read_text().splitlines()
    node = member("localhost", streaming_node("localhost", 1, recorded))
    node = replace(node, facts=recorded_node("facts-debian12-localhost.json"))
    job, _, _ = launch_on([node], tmp_path, ranks=2)
    finished = job.run_foreground()
    assert finished.status == 1
    assert "AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'. " in finished.message
    assert "localhost has no GPU, and its torch 2.13.0+cpu is a CPU build: the script asks for CUDA" in finished.message
    job.close()


def test_a_rank_aborted_after_the_work_says_the_work_had_finished_and_what_is_known_of_the_abort(tmp_path, monkeypatch):
    """Six CPU ranks on two nodes: rank 0 printed the result, then node2's rank 3 died of SIGABRT after
    "terminate called without an active exception" and node2's torchrun stopped its other ranks; node1's torchrun
    waits at its exit barrier for node2's (the recording's last lines come 300 s later) and is stopped."""
    monkeypatch.setattr(runner, "FAILURE_GRACE", 0.5)
    node1 = (TORCHRUN / "abort-at-exit-node1.log").read_text().splitlines()
    waiting = node1[: next(i for i, line in enumerate(node1) if "waitForInput" in line)]
    fakes = {
        "node1": streaming_node("node1", None, waiting),
        "node2": streaming_node("node2", 1, (TORCHRUN / "abort-at-exit-node2.log").read_text().splitlines()),
    }
    job, _, _ = launch_on([member(n, t) for n, t in fakes.items()], tmp_path, ranks=3)
    finished = job.run_foreground()
    assert finished.status == 1
    assert (
        "node2's rank 3 (local rank 0): killed by Signal 6 (SIGABRT) | terminate called without an active "
        "exception. No other rank failed on its own (rank 0's last line: 'sum of the ranks: 15'): the job's work "
        "had finished before rank 3 ended. Known of its last words: C++'s std::terminate with no exception in "
        "flight" in finished.message
    ), finished.message
    assert fakes["node1"].halted.is_set()
    job.close()


def test_a_rank_killed_mid_job_is_not_said_to_have_finished_its_work(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "FAILURE_GRACE", 0.2)
    fakes = {
        "node1": streaming_node("node1", None, ["[default0]:step 1"]),
        "node2": streaming_node("node2", 1, KILLED.splitlines()),
    }
    job, _, _ = launch_on([member(n, t) for n, t in fakes.items()], tmp_path)
    finished = job.run_foreground()
    assert "killed by Signal 9 (SIGKILL)" in finished.message
    assert "work had finished" not in finished.message and "Known of" not in finished.message
    job.close()


def test_torchs_compile_cache_goes_in_the_jobs_own_directory_on_each_node(tmp_path):
    """Not $TMPDIR/torchinductor_<user>, left by every job: in the launch's work directory (removed at its end), or
    a detached job's own directory, which outlives the launch; the user's --env still wins."""
    fakes = {n: streaming_node(n, 0, []) for n in ("node1", "node2")}
    job, _, _ = launch_on([member(n, t) for n, t in fakes.items()], tmp_path)
    assert {p.env["TORCHINDUCTOR_CACHE_DIR"] for p in job.plans} == {f"{workdir_for('0123456789ab')}/torchinductor"}
    options = LaunchOptions(command=command.parse(["train.py"]), run_dir=tmp_path, preflight=False, detach=True)
    detached = session.Launch([m.node for m in job.members], options, Fanout(no_connection), print, print)
    detached.members, detached.homes, detached.job_id = job.members, {"node1": "/root", "node2": "/home/u"}, "j1"
    plans = detached.plan("train.py", None)
    assert plans[1].env["TORCHINDUCTOR_CACHE_DIR"] == "/home/u/.local/state/clustercheck/jobs/j1/torchinductor"
    assert "--log-dir=/home/u/.local/state/clustercheck/jobs/j1/ranks" in plans[1].command
    mine = command.job_env("gloo", None, {"TORCHINDUCTOR_CACHE_DIR": "/scratch/inductor"}, job_dir="/tmp/j")
    assert mine["TORCHINDUCTOR_CACHE_DIR"] == "/scratch/inductor"
