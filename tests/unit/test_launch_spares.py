"""`launch --slurm --spare K`: the nodes the job runs on, chosen from the preflight's results (launcher/spares.py,
pure); the failing ones drained through node-health's update (the one reason format, the breaker), a refused drain
said with the command an administrator would run; the job shrunk to the nodes it runs on, the batch node kept; and
the option's refusals."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from wording import says

from clustercheck.inventory import Node
from clustercheck.launcher import command, leftout, session, spares, start
from clustercheck.launcher.job import LaunchOptions, NotStarted
from clustercheck.launcher.start import LaunchRequest
from clustercheck.model import CheckResult, Status
from clustercheck.reach import Fanout
from clustercheck.slurm import allocation, drain, parse, step, update
from clustercheck.slurm.call import SlurmError
from clustercheck.slurm.parse import SlurmNode
from clustercheck.slurm.request import Request
from clustercheck.transport import CommandResult, srun

DATA = Path(__file__).parent / "data" / "slurm"
ORDER = ["node1", "node2", "node3", "node4", "node5"]


def passed(node: str, check: str = "time.sync") -> CheckResult:
    return CheckResult(check, Status.PASS, "ok", host=node)


def failed(node: str, check: str, message: str, fix: str = "", status: Status = Status.FAIL) -> CheckResult:
    return CheckResult(check, status, message, host=node, remediation=fix)


def test_the_job_runs_on_the_first_healthy_nodes_and_each_other_node_says_why_it_was_left_out():
    results = [
        *(passed(n) for n in ORDER),
        failed("node2", "time.sync", "node2: chronyd does not answer", "systemctl start chrony"),
        failed("node2", "shm.size", "/dev/shm is 64 MiB"),
    ]
    choice = spares.choose(results, ORDER, 3)
    assert choice.enough and choice.kept == ("node1", "node3", "node4")
    node2, node5 = (n.line() for n in choice.left_out)
    assert says(node2, "left out node2", "time.sync", "chronyd does not answer", "systemctl start chrony")  # first
    assert says(node5, "left out node5", "spare")
    assert [n.node for n in choice.failing] == ["node2"]


def test_an_error_leaves_its_node_out_as_a_fail_does_and_a_warning_does_not():
    results = [
        failed("node1", "core.reach", "no job step ran there", status=Status.ERROR),
        CheckResult("shm.size", Status.WARN, "small", host="node2"),
    ]
    choice = spares.choose(results, ORDER[:3], 2)
    assert choice.kept == ("node2", "node3") and choice.left_out == (
        spares.LeftOut("node1", "core.reach", "no job step ran there"),
    )


def test_fewer_healthy_nodes_than_the_job_needs_is_not_enough_and_names_each_failing_node_with_its_check():
    results = [failed("node1", "time.sync", "chronyd does not answer"), failed("node3", "gpu.count", "7 GPUs, not 8")]
    choice = spares.choose(results, ORDER[:3], 2)
    assert not choice.enough and choice.kept == ("node2",)
    refusal = choice.refusal()
    assert says(refusal, "1 of the 3 nodes", "needs 2", "nothing was started", "node1 (time.sync), node3 (gpu.count)")


def test_a_problem_that_names_no_single_node_of_the_allocation_is_unplaced():
    cluster = CheckResult("net.mesh", Status.FAIL, "no route between the nodes")
    elsewhere = failed("login1", "time.sync", "off")
    own = failed("node1", "time.sync", "off")
    assert spares.unplaced([cluster, elsewhere, own, passed("node2")], ORDER) == [cluster, elsewhere]


def test_each_failing_node_gets_its_own_problems_for_its_drain_reason():
    results = [failed("node1", "a.b", "x"), passed("node1"), failed("node2", "c.d", "y"), failed("node1", "e.f", "z")]
    assert spares.problems_by_node(results, ["node1"]) == {"node1": [results[0], results[3]]}


# ------------------------------------------------------------------------------------------ in Slurm


def scontrol(monkeypatch, answers: dict[str, CommandResult]) -> list[list[str]]:
    """update's scontrol, answering by its subcommand (show, update); the commands run, in order."""
    ran: list[list[str]] = []

    def call(argv, timeout):
        ran.append(argv[1:])
        return answers[argv[1]]

    monkeypatch.setattr(update, "call", call)
    monkeypatch.setattr(update.shutil, "which", lambda name: name)
    return ran


SHOWN = CommandResult(0, "NodeName=node3 Arch=x86_64\n   State=ALLOCATED ThreadsPerCore=1\n   Partitions=gpu \n", "")


def test_a_failing_node_is_drained_with_its_first_problem_in_the_one_reason_format(monkeypatch):
    results = [failed("node3", "time.sync", "node3: chronyd does not answer"), failed("node3", "shm.size", "small")]
    ran = scontrol(monkeypatch, {"show": SHOWN, "update": CommandResult(0, "", "")})
    said: list[str] = []
    update.drain_nodes({"node3": results}, said.append, lambda: 5.0)
    reason = drain.drain_reason(results[0], 1)
    assert ran[-1] == ["update", "nodename=node3", "state=drain", f"reason={reason}"]
    assert drain.read_reason(reason) == drain.Reason("time.sync", "chronyd does not answer", 1)
    assert len(said) == 1 and says(said[0], "drained node3", "Slurm", reason)


def test_a_drain_slurm_refuses_is_said_with_the_command_an_administrator_would_run(monkeypatch):
    denied = CommandResult(1, "", (DATA / "update-drain-not-operator.txt").read_text())  # 22.05, not an operator
    scontrol(monkeypatch, {"show": SHOWN, "update": denied})
    said: list[str] = []
    update.drain_nodes({"node3": [failed("node3", "time.sync", "chronyd does not answer")]}, said.append, lambda: 5)
    assert len(said) == 1 and "slurm_update error: Invalid user id" in said[0], said
    assert said[0].endswith(
        "an administrator can run: scontrol update nodename=node3 state=drain "
        "'reason=clustercheck: time.sync: chronyd does not answer'"
    ), said


def choice_of(kept: tuple[str, ...], *left: spares.LeftOut) -> spares.Choice:
    return spares.Choice(kept, left, len(kept))


def test_the_job_is_shrunk_to_the_nodes_it_runs_on_and_slurms_resize_variables_are_taken_on(monkeypatch, tmp_path):
    shrunk: list[tuple[str, list[str], Path]] = []

    def shrink(job, nodes, cwd):
        shrunk.append((job, nodes, cwd))
        return parse.resize_environment((DATA / "resize-script-shrunk.sh").read_text())

    monkeypatch.setattr(leftout.allocation, "shrink", shrink)
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)  # salloc on the login node
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-3]")
    monkeypatch.setenv("SLURM_NTASKS", "3")
    said: list[str] = []
    steps = leftout.give_back(
        "42", choice_of(("node1", "node2"), spares.LeftOut("node3", "time.sync", "off")), tmp_path, said.append
    )
    assert shrunk == [("42", ["node1", "node2"], tmp_path)]
    assert len(said) == 1 and says(said[0], "gave node3 back to Slurm", "job 42", "node1, node2")
    assert steps is not None and steps["SLURM_JOB_NODELIST"] == "node[1-2]" and "SLURM_NTASKS" not in steps
    # Handed on as a value: this process's own environment is no channel between the launch's steps.
    assert os.environ["SLURM_JOB_NODELIST"] == "node[1-3]" and os.environ["SLURM_NTASKS"] == "3"


def test_the_job_steps_after_the_shrink_start_srun_with_the_jobs_resized_variables(monkeypatch, tmp_path):
    monkeypatch.setattr(
        leftout.allocation, "shrink", lambda job, nodes, cwd: {"SLURM_NNODES": "2", "SLURM_NTASKS": None}
    )
    monkeypatch.setattr(leftout.update, "drain_nodes", lambda problems, say, deadline: None)
    monkeypatch.setattr(step, "call", lambda argv, **kw: CommandResult(0, "slurm 23.02.7\n", ""))
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    monkeypatch.setenv("SLURM_NNODES", "3")
    monkeypatch.setenv("SLURM_NTASKS", "3")
    started: list[dict[str, str]] = []

    def run_process(argv, *, timeout, env, **kw):
        started.append(env)
        return CommandResult(0, "", "")

    monkeypatch.setattr(srun, "run_process", run_process)
    leave_out = leftout.handler("42", tmp_path, print)
    reach = leave_out(choice_of(("node1", "node2"), spares.LeftOut("node3", "time.sync", "off")), [])
    assert reach is not None
    reach.connect(Node("node1", "node1"), "run1", lambda transport: None)
    assert started and started[0]["SLURM_NNODES"] == "2" and "SLURM_NTASKS" not in started[0]
    assert os.environ["SLURM_NNODES"] == "3"
    assert leave_out(choice_of(("node1", "node2")), []) is None  # nothing given back: the steps reach on as before


def test_slurms_resize_script_is_read_as_the_variables_it_sets_and_those_it_unsets():
    assert parse.resize_environment((DATA / "resize-script-shrunk.sh").read_text()) == {
        "SLURM_NODELIST": "node[1-2]",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_CPUS_PER_NODE": "1(x2)",
        "SLURM_NPROCS": None,
        "SLURM_NTASKS": None,
        "SLURM_TASKS_PER_NODE": None,
    }


def test_the_batch_node_stays_in_the_job_and_a_refused_shrink_is_said_and_the_launch_goes_on(monkeypatch, tmp_path):
    def refused(job, nodes, cwd):
        raise SlurmError(f"scontrol update JobId={job} NodeList={','.join(nodes)}: exit 1: Invalid node name")

    monkeypatch.setattr(leftout.allocation, "shrink", refused)
    monkeypatch.setenv("SLURMD_NODENAME", "node1")  # the batch script runs on node1
    said: list[str] = []
    spare = choice_of(("node2", "node3"), spares.LeftOut("node1"), spares.LeftOut("node4"))
    leftout.give_back("7", spare, tmp_path, said.append)
    stays, kept = said
    assert says(stays, "node1 stays in Slurm job 7", "batch script")
    assert says(kept, "could not give node4 back", "scontrol update JobId=7 NodeList=node2,node3,node1", "exit 1")
    assert says(kept, "Invalid node name", "idle in job 7")


def test_the_shrink_asks_scontrol_in_the_run_directory_and_reads_the_resize_script_there(monkeypatch, tmp_path):
    ran = []

    def call(argv, timeout=30.0, cwd=None):
        ran.append((argv, cwd))
        return CommandResult(0, "", "")

    monkeypatch.setattr(allocation, "call", call)
    assert allocation.shrink("42", ["node1", "node2"], tmp_path) == {}  # no resize script written: nothing to take
    assert ran == [(["scontrol", "update", "JobId=42", "NodeList=node1,node2"], str(tmp_path))]


# ------------------------------------------------------------------------------------------ the option


def request(**fields) -> LaunchRequest:
    return LaunchRequest(job=("train.py",), **fields)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"hosts": "node1,node2", "spare": 1}, "--spare: only with --slurm"),
        ({"slurm": True, "spare": 1, "no_preflight": True}, "--spare and --no-preflight: the preflight chooses"),
    ],
)
def test_spare_without_slurm_or_without_the_preflight_is_a_usage_error(monkeypatch, fields, message):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(start.UsageError, match=f"^{message}") as refused:
        start.launch(request(**fields), print, print)
    assert refused.value.code == 4


def test_spares_that_leave_no_node_for_the_job_are_a_usage_error_naming_the_numbers(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-2]")
    nodes = [Node("node1", "10.0.0.1"), Node("node2", "10.0.0.2")]
    monkeypatch.setattr(start.allocation, "nodes", lambda given, job, nodelist: nodes)
    monkeypatch.setattr(start.step, "factory", lambda job: None)
    with pytest.raises(start.UsageError, match=r"^--spare 2: Slurm job 42 has 2 node\(s\), which leaves 0 for the job"):
        start.launch(request(slurm=True, spare=2), print, print)
    with pytest.raises(start.UsageError, match=r"^--nnodes 2: the inventory has 1 node\(s\)"):
        start.launch(LaunchRequest(job=("--nnodes", "2", "train.py"), slurm=True, spare=1), print, print)


def test_a_batch_request_with_spares_asks_slurm_for_a_range_of_nodes():
    """N to N+K nodes in Slurm's own syntax; --nodes alone as before; the range is not an option the user gave."""
    ranged = Request(nodes=2, partition="gpu", nodes_max=3)
    assert ranged.options() == ["--nodes=2-3", "--partition=gpu"]
    assert ranged.given == ["--nodes", "--partition"]
    assert Request(nodes=2).options() == ["--nodes=2"]


def node(name: str, *state: str, reason: str | None = None) -> SlurmNode:
    return SlurmNode(name, state or ("IDLE",), reason, ("gpu",))


def test_a_batch_job_asks_n_plus_k_while_the_partition_has_them_and_a_range_when_nodes_are_drained():
    """All usable: exactly N+K (a range would let Slurm start on N, leaving no spare for a node the preflight fails);
    a node drained or down: N to N+K, Slurm's minimum and maximum, and the node named with Slurm's reason."""
    healthy = [node("node1"), node("node2"), node("node3"), node("node4", reason=None)]
    assert spares.asked(2, 1, healthy, "gpu") == (3, None, "")
    drained = [node("node1"), node("node2"), node("node3", "IDLE", "DRAIN", reason="PSU swap, ticket 7")]
    count, most, said = spares.asked(2, 1, drained, "gpu")
    assert (count, most) == (2, 3)
    assert "2 usable node(s) in partition gpu" in said and "node3" in said and "PSU swap, ticket 7" in said
    down = [node("node1"), node("node2", "DOWN", "NOT_RESPONDING"), node("node3", "IDLE", "DRAIN", reason="x")]
    count, most, said = spares.asked(2, 1, down, "gpu")
    assert (count, most) == (2, 3) and "the job needs 2, so it waits for Slurm" in said
    other = [node("node1"), node("node2"), SlurmNode("cpu1", ("IDLE", "DRAIN"), "x", ("cpu",))]
    assert spares.asked(2, 0, other, "gpu") == (2, None, "")  # another partition's drain is not this job's


def granted(monkeypatch, names: list[str], shown: str, partition: str = "gpu") -> list[str]:
    """A launch inside Slurm job 42 on NAMES, asked --nodes 2 --spare 1 (a batch job of launch --spare), Slurm
    showing its nodes as SHOWN; what it said, up to the options it built (the job itself is not started)."""
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_JOB_NODELIST", ",".join(names))
    monkeypatch.setenv("SLURM_JOB_PARTITION", partition)
    nodes = [Node(n, f"10.0.0.{i}") for i, n in enumerate(names, 1)]
    monkeypatch.setattr(start.allocation, "nodes", lambda given, job, nodelist: nodes)
    monkeypatch.setattr(start.step, "factory", lambda job: None)
    monkeypatch.setattr(start.update, "call", lambda argv, timeout=0: CommandResult(0, shown, ""))
    built: list[LaunchOptions] = []

    class Stop(Exception):
        pass

    def launch(nodes_, options, *args, **kwargs):
        built.append(options)
        raise Stop

    monkeypatch.setattr(start.session, "Launch", launch)
    said: list[str] = []
    with pytest.raises(Stop):
        start.launch(request(slurm=True, spare=1, request=Request(nodes=2)), print, said.append)
    return said, built[0]


def test_a_batch_job_granted_fewer_spares_runs_on_the_nodes_asked_and_names_the_nodes_slurm_could_not_give(
    monkeypatch,
):
    """Slurm granted node1 and node2 of the 2-3 asked: the job runs on both with no spare left, and the launch names
    node3 with Slurm's state and reason (recorded: node3 not responding on the test cluster)."""
    shown = (DATA / "show-node-not-responding.txt").read_text()
    said, options = granted(monkeypatch, ["node1", "node2"], shown)
    assert options.spare == 0
    line = next(line for line in said if line.startswith("Slurm granted 2 node(s) of the 2-3 asked: 0 of 1 spare"))
    assert "node3" in line and "NOT_RESPONDING" in line, said
    said, options = granted(monkeypatch, ["node1", "node2", "node3"], shown)
    assert options.spare == 1 and not any("granted" in line for line in said)
    said, _ = granted(monkeypatch, ["node1", "node2"], shown, partition="cpu")
    assert any("no node of the partition is drained or down" in line for line in said), said


def test_fewer_nodes_than_the_job_runs_on_is_a_usage_error_inside_the_allocation(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node1")
    monkeypatch.setattr(start.allocation, "nodes", lambda given, job, nodelist: [Node("node1", "10.0.0.1")])
    monkeypatch.setattr(start.step, "factory", lambda job: None)
    with pytest.raises(start.UsageError, match=r"^--nodes 2: Slurm job 42 has 1 node\(s\)"):
        start.launch(request(slurm=True, spare=1, request=Request(nodes=2)), print, print)


# ------------------------------------------------------------------------------------------ the launch's step


def vetted(monkeypatch, results: list[CheckResult], tmp_path: Path, spare: int = 1):
    """A Launch on node1..node3 with SPARE spares whose preflight found RESULTS; what its leave_out was handed."""
    nodes = [Node(f"node{i}", f"10.0.0.{i}") for i in (1, 2, 3)]
    order = [n.name for n in nodes]

    def vet(nodes_, options, reach, say, wanted):
        return {n: f"facts of {n}" for n in order}, spares.choose(results, order, wanted), results

    monkeypatch.setattr(session.preflight, "vet", vet)
    handed: list[spares.Choice] = []
    options = LaunchOptions(command=command.parse(["train.py"]), run_dir=tmp_path, spare=spare)
    job = session.Launch(nodes, options, Fanout(None), print, print, leave_out=lambda c, r: handed.append(c))
    return job, handed


def test_the_launch_goes_on_with_the_kept_nodes_only_and_their_facts(monkeypatch, tmp_path):
    job, handed = vetted(monkeypatch, [failed("node2", "time.sync", "off")], tmp_path)
    job.preflight()
    assert [n.name for n in job.nodes] == ["node1", "node3"]
    assert set(job.preflight_facts) == {"node1", "node3"}
    assert [c.kept for c in handed] == [("node1", "node3")]


def test_too_few_healthy_nodes_refuse_the_launch_after_the_failing_ones_were_handed_on(monkeypatch, tmp_path):
    job, handed = vetted(monkeypatch, [failed("node2", "time.sync", "off"), failed("node3", "shm.size", "x")], tmp_path)
    with pytest.raises(NotStarted, match=r"^preflight: 1 of the 3 nodes are healthy, the job needs 2: nothing was "):
        job.preflight()
    assert [n.node for n in handed[0].failing] == ["node2", "node3"]  # drained even so
