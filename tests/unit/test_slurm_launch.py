"""`clustercheck launch --slurm` outside an allocation, its pure parts: the batch script (run by sh as sbatch would
run it), the job's state and exit status read from `scontrol show job` (recorded outputs of the Debian 12 test
cluster, tests/unit/data/slurm/, provenance in tests/unit/data/README.md), and following the job's output file
as the job goes from pending to running to its end."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from wording import says

from clustercheck.slurm import batch
from clustercheck.slurm import jobs as slurmjob
from clustercheck.slurm import parse as slurm
from clustercheck.slurm.request import Request

DATA = Path(__file__).parent / "data" / "slurm"


def test_the_batch_script_asks_for_whole_nodes_and_runs_the_launch_inside_with_every_argument_intact(tmp_path):
    """sh runs the script as slurmstepd would (SLURM_JOB_ID set): clustercheck launch --slurm receives the launch's
    options and the user's torchrun line word for word, spaces and quotes included, its run directory per job."""
    run_dir, cwd = tmp_path / "run dir", tmp_path / "code"
    user = ["--", "--max-restarts", "1", "train_ddp.py", "--note", "it's a 'test' $HOME"]
    request = Request(nodes=3, partition="gpu", time="30")
    text = batch.script(request, ["/usr/bin/printf", "%s\\n"], ["--env", "A=x y", *user], run_dir, cwd)
    directives = [line.removeprefix("#SBATCH ") for line in text.splitlines() if line.startswith("#SBATCH ")]
    assert directives == [
        "--job-name=clustercheck-launch",
        "--nodes=3",
        "--partition=gpu",
        "--time=30",
        "--ntasks-per-node=1",
        "--exclusive",
        "--mem=0",
        f"--output={run_dir}/slurm-%j.out",
        f"--chdir={cwd}",
    ]
    (tmp_path / "launch.sbatch").write_text(text)
    ran = subprocess.run(
        ["sh", str(tmp_path / "launch.sbatch")], env={"SLURM_JOB_ID": "42"}, capture_output=True, text=True, check=True
    )
    assert ran.stdout.splitlines() == [
        "launch",
        "--slurm",
        "--run-dir",
        f"{run_dir}/job-42",
        "--env",
        "A=x y",
        *user,
    ]
    assert batch.output_path(run_dir, "42") == run_dir / "slurm-42.out"


def recorded_job(name: str, job: str) -> slurm.SlurmJob:
    found = slurm.parse_show_job((DATA / name).read_text(), job)
    assert found is not None
    return found


def test_a_running_job_is_read_with_its_nodes_batch_node_and_output_file():
    running = recorded_job("show-job-launch-running.txt", "2")
    assert (running.state, running.name, running.ended) == ("RUNNING", "clustercheck-launch", False)
    assert running.nodes == "node[1-3]" and running.batch_host == "node1"
    assert running.stdout is not None and running.stdout.endswith("/slurm-2.out")


def test_a_pending_job_says_why_it_waits():
    pending = recorded_job("show-job-launch-pending.txt", "3")
    assert pending.state == "PENDING" and not pending.ended
    assert pending.reason == "Resources" and pending.nodes is None and pending.batch_host is None


@pytest.mark.parametrize(
    ("name", "job", "status", "said"),
    [
        ("show-job-launch-completed.txt", "1", 0, "Slurm job 1 completed (exit 0)"),
        ("show-job-launch-failed.txt", "4", 6, "Slurm job 4 failed (exit 6)"),
        ("show-job-launch-cancelled.txt", "2", 1, "Slurm job 2 was cancelled (scancel, or an administrator)"),
    ],
)
def test_an_ended_job_gives_the_exit_status_of_the_launch_inside_it(name, job, status, said):
    """The batch script execs clustercheck launch: its exit status (job 4: 6, not started, as the code differed on
    node3) is the job's ExitCode."""
    ended = recorded_job(name, job)
    assert ended.ended
    assert ended.status() == (status, said)


def test_a_batch_script_slurm_could_not_start_is_not_taken_for_a_signal():
    """Job 8 ran on node2 and node3, the run directory only on node1 (no shared filesystem): slurmd on node2 could
    not open the output file, and Slurm says JobLaunchFailure with ExitCode=0:53, which is no signal."""
    failed = recorded_job("show-job-launch-launch-failure.txt", "8")
    status, said = failed.status()
    assert status == 6 and said.startswith("Slurm job 8 could not start its batch script on node2 (JobLaunchFailure)")
    assert "/root/lc/clustercheck-runs/t8/slurm-8.out" in said and "(/root/lc)" in said


def test_a_job_slurm_no_longer_knows_is_none():
    assert slurm.parse_show_job("", "99") is None
    assert slurm.parse_show_job((DATA / "show-job-launch-running.txt").read_text(), "44") is None


def test_sbatch_parsable_answers():
    assert slurm.submitted_job("42\n") == "42"
    assert slurm.submitted_job("42;cluster1\n") == "42"
    assert slurm.submitted_job("sbatch: error: Batch job submission failed: Invalid partition name specified") is None


def test_slurm_job_ids_are_told_from_clustercheck_job_ids():
    assert slurm.is_job_id("42") and slurm.is_job_id("67043327")
    assert not slurm.is_job_id("3f2a9c1d7e4b") and not slurm.is_job_id("123456789012")


def job(state: str, **fields) -> slurm.SlurmJob:
    return slurm.SlurmJob("9", batch.JOB_NAME, state, **fields)


def test_following_echoes_whole_lines_as_they_come_and_the_last_partial_one_at_the_end(tmp_path):
    """Pending, then running with output growing between looks (a line split across two reads), then ended: every
    line echoed once and in order, the wait and the place told once each."""
    out = tmp_path / "slurm-9.out"
    writes = ["", "node1/0: step 1\nnode2/", "1: step 1\n", "clustercheck: the job completed\nno newline"]
    states = [
        job("PENDING", reason="Resources"),
        job("PENDING", reason="Resources"),
        job("RUNNING", nodes="node[1-2]", batch_host="node1"),
        job("RUNNING", nodes="node[1-2]", batch_host="node1"),
        job("COMPLETED", exit_code=0, signal=0),
    ]
    echoed: list[str] = []
    said: list[str] = []

    def state(_job: str) -> slurm.SlurmJob:
        if writes:
            with out.open("a") as fh:
                fh.write(writes.pop(0))
        return states.pop(0)

    ended = slurmjob.follow("9", slurmjob.OutputFile(out), echoed.append, said.append, state=state, poll=0)
    assert ended is not None and ended.status()[0] == 0
    assert says(ended.status()[1], "Slurm job 9", "completed", "exit 0")
    echoes = ["node1/0: step 1", "node2/1: step 1", "clustercheck: the job completed", "no newline"]
    assert echoed == echoes  # verbatim: the output file's lines, echoed as written
    waiting, runs = said
    assert says(waiting, "Slurm job 9", "waiting (Resources)")
    assert says(runs, "Slurm job 9", "node[1-2]", "batch script on node1", str(out))


def test_an_output_file_that_never_shows_up_here_is_said_once_and_the_end_still_waited_for(tmp_path):
    """The run directory not shared with the batch node: the output cannot be followed, the job's status can."""
    out = tmp_path / "slurm-9.out"
    states = [job("RUNNING", nodes="node[2-3]", batch_host="node2")] * 3 + [job("FAILED", exit_code=6, signal=0)]
    said: list[str] = []
    reader = slurmjob.OutputFile(out)
    ended = slurmjob.follow(
        "9", reader, lambda _: None, said.append, state=lambda _: states.pop(0), poll=0, unshared_after=0
    )
    assert ended is not None and ended.status()[0] == 6
    assert says(ended.status()[1], "Slurm job 9", "failed", "exit 6")
    assert len(said) == 2 and said[1].startswith(f"the job's output file {out} does not show up here: Slurm writes")
    assert "on node2;" in said[1]


def test_squeue_lines_say_where_a_job_runs_or_why_it_waits():
    """A pending job's start time in squeue is Slurm's estimate (a year ahead when it has none): not shown."""
    listed = slurm.parse_squeue((DATA / "squeue-launches.txt").read_text())
    pending, running = (q.line() for q in listed)
    assert pending.startswith("3 ") and says(pending, "not started", "PENDING (Resources)")
    assert running.startswith("2 ") and says(running, "2026-11-26T10:03:08", "RUNNING on node[1-3]")
