"""What a job left on its node, judged by the Epilog (clustercheck/slurm/epilog.py, pure; left_behind on this
machine's own /proc), node-health --epilog's and --prolog's usage errors outside a job, and the Prolog's exit status
(1 requeues the job)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from wording import says

from clustercheck.exitcodes import UsageError
from clustercheck.model import Status
from clustercheck.run import health
from clustercheck.slurm import epilog
from clustercheck.slurm.drain import drain_reason

ALICE = epilog.Job("812", 4343, "alice")


def test_the_job_is_read_from_the_epilogs_environment_and_its_absence_is_a_usage_error():
    assert epilog.job_from({"SLURM_JOB_ID": "812", "SLURM_JOB_UID": "4343", "SLURM_JOB_USER": "alice"}) == ALICE
    assert epilog.job_from({"SLURM_JOB_ID": "812"}) is None
    with pytest.raises(UsageError, match="--epilog: SLURM_JOB_ID and SLURM_JOB_UID are not set"):
        health.slurm_job({}, "--epilog")


def test_processes_the_job_left_are_a_fail_named_in_the_drain_reason():
    left = epilog.Left(((5120, "sleep"), (5121, "python3"), (5122, "a"), (5123, "b")), 0, 0)
    [processes] = epilog.judge("node2", ALICE, left, others=False)
    assert processes.status is Status.FAIL
    reason = drain_reason(processes)
    assert reason.startswith("clustercheck: epilog.processes: ")  # the reason clustercheck reads back
    assert says(reason, "4 process(es) of alice", "job 812", "5120 sleep, 5121 python3, 5122 a and 1 more")


def test_processes_of_a_user_with_another_job_here_or_of_root_are_not_blamed():
    left = epilog.Left(((5120, "sleep"),), 0, 0)
    assert epilog.judge("node2", ALICE, left, others=True)[0].status is Status.PASS
    root = epilog.Job("813", 0, "root")
    assert epilog.judge("node2", root, left, others=False)[0].status is Status.SKIP
    assert epilog.judge("node2", ALICE, epilog.Left((), 0, 0), others=False)[0].status is Status.PASS


def test_dev_shm_left_more_than_half_full_is_a_fail():
    gib = 1 << 30
    results = {r.name: r for r in epilog.judge("node2", ALICE, epilog.Left((), 3 * gib, 4 * gib), others=False)}
    assert results["epilog.shm"].status is Status.FAIL
    shm_reason = drain_reason(results["epilog.shm"])
    assert shm_reason.startswith("clustercheck: epilog.shm: ") and says(shm_reason, "/dev/shm is 75 % used", "job 812")
    results = {r.name: r for r in epilog.judge("node2", ALICE, epilog.Left((), gib, 4 * gib), others=False)}
    assert results["epilog.shm"].status is Status.PASS


def test_left_behind_finds_this_users_own_process():
    """This machine's /proc: a process of our own user started here is found, with its name."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        left = epilog.left_behind(epilog.Job("1", os.getuid(), "me"))
        assert any(pid == child.pid for pid, _ in left.processes), left.processes
        assert left.shm_size > 0
    finally:
        child.kill()
        child.wait()


def test_the_prolog_fails_the_job_on_a_fail_unless_the_breaker_held_the_drain_back():
    """Exit 1 from the Prolog makes slurmd requeue the job; a check failing on so many nodes that the breaker holds
    the drain back must not keep every job from starting."""
    assert health.exit_code(Status.FAIL, prolog=True) == 1
    assert health.exit_code(Status.FAIL, prolog=True, withheld=True) == 0
    assert health.exit_code(Status.WARN, prolog=True) == 0
    assert health.exit_code(Status.FAIL, withheld=True) == 1  # the health program and the Epilog: the report's status


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        (["--prolog"], {}, "--prolog: SLURM_JOB_ID and SLURM_JOB_UID are not set: it runs as Slurm's Prolog"),
        (["--prolog", "--epilog"], {"SLURM_JOB_ID": "7", "SLURM_JOB_UID": "0"}, "--prolog and --epilog: "),
    ],
)
def test_prolog_outside_a_job_or_with_the_epilog_is_one_line_and_exit_4(args, env, said):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run(
        [sys.executable, "-m", "clustercheck", "node-health", *args],
        capture_output=True,
        text=True,
        env={**environ, **env},
        timeout=60,
    )
    assert proc.returncode == 4 and proc.stdout == "", proc.stderr
    assert proc.stderr.startswith("clustercheck: error: ") and said in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
