"""node-health's judgement and its Slurm side, pure: the per-node checks on recorded collector outputs as node-health
judges its node, the node's state read from `scontrol show node` (recorded outputs, tests/unit/data/slurm/), and
what is done with it (drain on a FAIL, resume only from a drain of clustercheck's own)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from wording import says

from clustercheck.checks import registry
from clustercheck.facts import collect
from clustercheck.inventory import Node
from clustercheck.model import Status
from clustercheck.run import health
from clustercheck.slurm import parse as slurm
from clustercheck.slurm.drain import REASON_CHARS, Action, Reason, decide, drain_reason, read_reason, reason
from clustercheck.slurm.parse import ParseError, SlurmNode, parse_show_node

DATA = Path(__file__).parent / "data" / "slurm"
RECORDS = Path(__file__).parent / "records"


def recorded(name: str) -> str:
    return (DATA / name).read_text()


def node3_results():
    """The per-node checks on node3's recorded facts (/dev/shm at 64 MiB, a 32 MiB /tmp, chrony stopped)."""
    raw = json.loads((RECORDS / "facts-node3-shm-tmp-chrony.json").read_text())
    facts = collect.build(
        Node(name="node3", address="node3"), raw, python="/usr/bin/python3", python_source="test", cluster_size=3
    )
    return registry.run_node_checks(facts)


def passing(results):
    return [r for r in results if not r.status.is_problem]


def test_slurms_own_documentation_sample_is_an_idle_node_without_a_reason():
    node = parse_show_node(recorded("show-nodes-slurm-doc-mcs.txt"), "node0001")
    assert node == SlurmNode("node0001", ("IDLE",), None)
    assert not node.drained and not node.ours


def test_a_node_that_is_not_in_the_answer_is_an_error_naming_what_was_there():
    with pytest.raises(ParseError, match=r"no node node7 in scontrol's answer \(node0001\)"):
        parse_show_node(recorded("show-nodes-slurm-doc-mcs.txt"), "node7")
    with pytest.raises(ParseError, match="no node record"):
        parse_show_node("", "node7")


def test_the_drain_reason_names_the_first_failed_check_and_its_message_on_one_short_line():
    results = node3_results()
    failed = [r for r in results if r.status.is_problem]
    assert [r.name for r in failed] == ["shm.size", "time.sync"]
    reason = drain_reason(failed[0], len(failed) - 1)
    assert reason.startswith("clustercheck: shm.size: /dev/shm is 64 MiB, less than 256 MiB")
    assert reason.endswith(" (+1 more)") and len(reason) <= REASON_CHARS
    assert "node3:" not in reason  # the node is the one being drained: its name is not repeated


def test_the_drain_reason_holds_nothing_that_breaks_scontrol_or_a_log_line():
    check = registry.get("time.sync")
    result = check.result("n1", registry.fail("chronyd said \"no\"\nand 'stopped'\tnow; `x` $HOME"))
    reason = drain_reason(result)
    assert (
        reason == "clustercheck: time.sync: chronyd said no and stopped now; x HOME"
    )  # contract: what scontrol gets, each unsafe character gone
    assert Action("drain", "n1", reason).argv("/usr/bin/scontrol") == [
        "/usr/bin/scontrol",
        "update",
        "nodename=n1",
        "state=drain",
        f"reason={reason}",
    ]


def test_every_drain_reason_is_one_format_that_reads_back_as_check_message_and_more():
    """The format docs/slurm.md gives other tools: `clustercheck: CHECK: MESSAGE (+N more)`, read back whole."""
    results = node3_results()
    failed = [r for r in results if r.status.is_problem]
    made = drain_reason(failed[0], 2)
    assert made == reason("shm.size", failed[0].message.removeprefix("node3: "), 2)
    read = read_reason(made)
    assert read is not None and (read.check, read.more) == ("shm.size", 2)
    assert read.message.startswith("/dev/shm is 64 MiB, less than 256 MiB")
    assert read_reason("clustercheck: epilog.processes: 2 processes of alice left") == Reason(
        "epilog.processes", "2 processes of alice left"
    )
    long = reason("epilog.processes", "x" * 300)
    assert len(long) == REASON_CHARS and long.endswith("...") and read_reason(long).check == "epilog.processes"
    assert reason("a check: odd", "m") == "clustercheck: a_check__odd: m"  # the check's name stays one token
    assert read_reason("disk swap") is None and read_reason(None) is None
    assert read_reason("clustercheck:time.sync no space") is None


def test_the_documented_reason_pattern_is_the_one_clustercheck_reads_with():
    from clustercheck.slurm.drain import REASON_PATTERN

    docs = (Path(__file__).parents[2] / "docs" / "slurm.md").read_text()
    assert f"\n{REASON_PATTERN.pattern}\n" in docs


def test_a_fail_drains_an_idle_node():
    results = node3_results()
    action = decide(SlurmNode("node3", ("IDLE",), None), results)
    assert action is not None and action.state == "drain" and action.node == "node3"
    assert action.reason == drain_reason(results[[r.name for r in results].index("shm.size")], 1)


def test_a_node_someone_else_drained_keeps_its_reason_and_stays_drained():
    admin = SlurmNode("node3", ("IDLE", "DRAIN"), "disk replacement")
    assert decide(admin, node3_results()) is None  # not overwritten by ours
    assert decide(admin, passing(node3_results())) is None  # not resumed


def test_a_healthy_run_resumes_a_node_drained_by_clustercheck_only():
    ours = SlurmNode("node3", ("IDLE", "DRAIN"), "clustercheck: shm.size: /dev/shm is 64 MiB")
    assert decide(ours, passing(node3_results())) == Action("resume", "node3")
    draining = SlurmNode("node3", ("MIXED", "DRAIN"), "clustercheck: time.sync: chronyd does not answer")
    assert decide(draining, passing(node3_results())) == Action("resume", "node3")
    assert decide(SlurmNode("node3", ("IDLE",), None), passing(node3_results())) is None
    assert decide(SlurmNode("node3", ("DOWN",), "Not responding"), passing(node3_results())) is None


def test_a_node_drained_by_clustercheck_for_the_same_reason_is_left_alone_another_failure_updates_it():
    results = node3_results()
    failed = [r for r in results if r.status.is_problem]
    same = SlurmNode("node3", ("IDLE", "DRAIN"), drain_reason(failed[0], 1))
    assert decide(same, results) is None
    older = SlurmNode("node3", ("IDLE", "DRAIN"), "clustercheck: gpu.xid: Xid 79 on GPU 0")
    action = decide(older, results)
    assert action is not None and action.state == "drain" and action.reason == same.reason


def test_an_error_of_a_check_drains_as_a_fail_does():
    check = registry.get("gpu.ecc")
    errored = check.result("n1", registry.Finding(Status.ERROR, "check gpu.ecc failed: KeyError: 'ecc'"))
    action = decide(SlurmNode("n1", ("IDLE",), None), [errored])
    assert action is not None and action.reason.startswith("clustercheck: gpu.ecc: ")  # the reason read back
    assert says(action.reason, "failed", "KeyError: ecc")


def test_the_health_program_finds_the_system_programs_without_a_path_and_keeps_the_one_given():
    assert health.system_path(None) == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert (
        health.system_path("/opt/fake:/usr/bin")
        == "/opt/fake:/usr/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/sbin:/bin"
    )
    assert health.node_name({"SLURMD_NODENAME": "gpu07"}) == "gpu07"
    assert "." not in health.node_name({})


def test_node_health_judges_its_node_as_one_of_a_cluster():
    """A stopped chronyd is a FAIL there (a drain in Slurm), as in a run over several nodes, not the WARN of a
    one-node run."""
    raw = json.loads((RECORDS / "facts-node3-shm-tmp-chrony.json").read_text())
    results = {r.name: r for r in health.judge(Node(name="node3", address="localhost"), raw, python="p", source="s")}
    assert results["time.sync"].status is Status.FAIL and "chronyd does not answer" in results["time.sync"].message
    assert results["shm.size"].status is Status.FAIL
    assert results["gpu.count"].status is Status.SKIP  # no NVIDIA GPU on its PCI bus


def test_a_gpu_on_the_bus_whose_nvidia_smi_hangs_fails_gpu_count():
    """node3's record with one NVIDIA GPU on its PCI bus and nvidia-smi cut at its deadline (two values edited)."""
    raw = json.loads((RECORDS / "facts-node3-shm-tmp-chrony.json").read_text())
    raw["gpu_bridges"]["gpus"] = {"0000:17:00.0": ["0000:15:01.0"]}
    raw["commands"]["nvidia_smi_q"] = {"error": "nvidia-smi timed out after 10 s"}
    results = {r.name: r for r in health.judge(Node(name="node3", address="localhost"), raw, python="p", source="s")}
    count = results["gpu.count"]
    assert count.status is Status.FAIL
    assert "1 GPU(s) expected, but nvidia-smi does not answer: nvidia-smi timed out after 10 s" in count.message
    action = decide(SlurmNode("node3", ("IDLE",), None), list(results.values()))
    assert action is not None and action.state == "drain"


def test_no_step_of_node_health_gets_more_than_what_is_left_of_its_budget():
    budget = health.Budget(3)
    assert 2.5 < budget.give(health.COLLECTOR_DEADLINE) <= 3
    assert budget.give(2) == 2
    assert health.Budget(0).give(health.SCONTROL_DEADLINE) == 1  # a spent budget still lets a step answer
    worst = health.PYTHON_DEADLINE * 2 + health.COLLECTOR_DEADLINE + health.SCONTROL_DEADLINE * 2
    assert worst <= health.BUDGET < 60  # Slurm kills its health program at 60 s


def test_the_slurm_version_is_read_from_what_srun_and_slurmd_print():
    """`slurmd -V` on the Ubuntu 24.04 test node (Ubuntu's slurm-wlm package), recorded in tests/unit/data/README.md."""
    assert slurm.parse_version("slurm-wlm 23.11.4\n") == (23, 11)
    assert slurm.parse_version("srun: command not found\n") is None


def test_steps_share_the_allocation_with_overlap_from_slurm_20_11_on():
    from clustercheck.slurm.step import step_options

    assert step_options((23, 11)) == ("--overlap",)
    assert step_options((19, 5)) == ()  # no --overlap before 20.11: steps shared the allocation by default
    assert step_options(None) == ("--overlap",)  # an unknown version is taken as a current one


def test_the_allocation_nodes_are_scontrols_hostnames_in_order():
    assert slurm.allocation_nodes("node1\nnode2\nnode3\n") == ["node1", "node2", "node3"]


def test_the_granted_job_is_read_from_what_salloc_says():
    """salloc --no-shell's stderr on the Debian 12 test cluster (Slurm 22.05), recorded in tests/unit/data/README.md:
    granted, and refused after --immediate=5 for more nodes than the cluster has."""
    assert slurm.granted_job("salloc: Granted job allocation 5\n") == "5"
    refused = (
        "salloc: Requested partition configuration not available now\n"
        "salloc: Pending job allocation 6\n"
        "salloc: job 6 queued and waiting for resources\n"
        "salloc: error: Unable to allocate resources: Connection timed out\n"
    )
    assert slurm.granted_job(refused) is None


# ------------------------------------------------------------------ a node where srun runs no step (run --slurm)


def test_srun_says_which_task_launch_failed_on_which_node():
    """srun 22.05's own lines (tests/unit/data/slurm/), the task launch picked over the lines around it."""
    from clustercheck.slurm.diagnose import srun_error

    stopped = recorded("srun-step-slurmd-stopped.txt")
    launch_failed = "Task launch for StepId=1.1 failed on node node3: Communication connection failure"
    assert srun_error(stopped) == launch_failed  # verbatim: srun's own line, found
    munge = recorded("srun-step-munge-key.txt")
    said = "Task launch for StepId=1.5 failed on node node3: Zero Bytes were transmitted or received"
    assert srun_error(munge) == said  # verbatim: srun's line, not the slurm_receive_msgs line before it
    outside = recorded("srun-step-outside-allocation.txt")
    not_available = "Unable to create step for job 2: Requested node configuration is not available"
    assert srun_error(outside) == not_available  # verbatim: srun's own line, found
    assert srun_error("") is None


def test_a_node_whose_slurmd_stopped_shows_mixed_then_not_responding():
    assert parse_show_node(recorded("show-node-slurmd-stopped.txt"), "node3") == SlurmNode(
        "node3", ("MIXED",), None, ("gpu",)
    )
    later = parse_show_node(recorded("show-node-not-responding.txt"), "node3")
    assert later == SlurmNode("node3", ("MIXED", "NOT_RESPONDING"), None, ("gpu",))


def refused_step(stderr: str, node):
    from clustercheck.slurm.diagnose import step_refused
    from clustercheck.transport import CommandResult

    return step_refused("node3", CommandResult(233, "", stderr), node)


def test_a_stopped_slurmd_is_named_with_srun_and_slurms_words_and_slurms_fix():
    node = parse_show_node(recorded("show-node-not-responding.txt"), "node3")
    refused = refused_step(recorded("srun-step-slurmd-stopped.txt"), node)
    srun_said = "srun: Task launch for StepId=1.1 failed on node node3: Communication connection failure"
    assert says(refused.said, srun_said, "slurmd on node3 does not answer", "MIXED+NOT_RESPONDING")
    assert refused.fix.startswith("Start slurmd on node3 (systemctl start slurmd;")
    assert "ssh" not in refused.fix.lower()


def test_another_munge_key_is_named_as_an_authentication_failure_with_munges_fix():
    node = parse_show_node(recorded("show-node-slurmd-stopped.txt"), "node3")  # MIXED: Slurm sees nothing wrong yet
    refused = refused_step(recorded("srun-step-munge-key.txt"), node)
    assert refused.said.startswith("srun: Task launch for StepId=1.5 failed on node node3: Zero Bytes were")
    assert "cannot authenticate each other (MUNGE); Slurm shows it MIXED" in refused.said
    assert refused.fix.startswith("Give node3 the cluster's MUNGE key (the same /etc/munge/munge.key")
    assert "sshd" not in refused.fix


def test_a_node_slurm_keeps_out_and_what_nothing_explains_get_slurms_words():
    outside = refused_step(recorded("srun-step-outside-allocation.txt"), "scontrol show node node3: timed out")
    srun_said = "srun: Unable to create step for job 2: Requested node configuration is not available"
    assert says(outside.said, srun_said, "Slurm keeps node3 out", "state in Slurm unknown")
    assert says(outside.said, "scontrol show node node3: timed out")
    assert "scontrol update nodename=node3 state=resume" in outside.fix
    drained = refused_step("srun: error: something new\n", SlurmNode("node3", ("IDLE", "DRAIN"), "disk swap"))
    assert says(drained.said, "srun: something new", "Slurm keeps node3 out", "IDLE+DRAIN (disk swap)")
    unknown = refused_step("srun: error: something new\n", SlurmNode("node3", ("IDLE",), None))
    assert says(unknown.said, "srun: something new", "Slurm shows it IDLE") and "keeps" not in unknown.said
    assert unknown.fix.startswith("Read srun's error, and slurmd's log on node3")


def test_the_connect_check_gives_slurms_fix_for_a_node_no_step_reached(monkeypatch, tmp_path):
    """run --slurm through the pipeline with srun's recorded answer for node3: its connect FAIL names what srun and
    Slurm said, and the fix is Slurm's, not SSH's (sshd, the SSH user and key)."""
    from clustercheck.config import RunConfig
    from clustercheck.reach import Fanout
    from clustercheck.run.pipeline import Pipeline
    from clustercheck.selection import Selection
    from clustercheck.slurm import step
    from clustercheck.transport import CommandResult, srun

    def call(argv, timeout=30.0):
        if argv[:2] == ["srun", "--version"]:
            return CommandResult(0, "slurm-wlm 22.05.8\n", "")
        assert argv == ["scontrol", "show", "node", "node3"]
        return CommandResult(0, recorded("show-node-not-responding.txt"), "")

    monkeypatch.setattr(step, "call", call)
    monkeypatch.setattr(srun.SrunTransport, "run", lambda self, *a, **k: CommandResult(233, "", stopped))
    monkeypatch.setattr(srun.SrunTransport, "cleanup", lambda self: None)
    stopped = recorded("srun-step-slurmd-stopped.txt")
    config = RunConfig(run_dir=tmp_path, selection=Selection(only=("core",)))
    outcome = Pipeline([Node("node3", "node3")], config, Fanout(step.factory("1"))).run()
    connect = next(r for r in outcome.results if r.name == "connect")
    assert connect.status is Status.FAIL
    assert connect.message.startswith("node3: no job step of Slurm job 1 ran there: srun: Task launch for StepId=1.1")
    assert "slurmd on node3 does not answer; Slurm shows it MIXED+NOT_RESPONDING" in connect.message
    assert connect.remediation.startswith("Start slurmd on node3")


def test_node_health_cuts_every_step_to_what_is_left_of_its_budget():
    """--budget (the role's slurm_health_check_timeout less 10 s): the collector's 25 s is cut to a budget of 12."""
    budget = health.Budget(12.0)
    assert 11.0 < budget.give(health.COLLECTOR_DEADLINE) <= 12.0
    assert budget.give(health.SCONTROL_DEADLINE) == health.SCONTROL_DEADLINE
    assert health.HealthRequest().budget == health.BUDGET == 50.0
