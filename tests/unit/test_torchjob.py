"""The torch-job runner's judgement that needs no node: which node failed first, and what a failed job reports."""

from __future__ import annotations

import io
import tarfile

from wording import says

from clustercheck.model import CheckResult, Status
from clustercheck.stages import runner, torchjob
from clustercheck.transport import CommandResult

# The end of torchrun's report on the node whose rank was killed (torch 2.13, recorded on the test cluster).
KILLED = """[rank1]: step 1200
============================================================
/tmp/clustercheck-0a1b2c3d4e5f/worker/ddp.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-21_20:48:38
  host      : node2
  rank      : 1 (local_rank: 0)
  exitcode  : -9 (pid: 752)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 752
============================================================
"""
# A peer of the killed rank: gloo lost its connection, the rank exited 1.
PEER = """[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer
  host      : node1
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 611)
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
"""


def test_the_node_with_the_killed_rank_is_named_even_when_a_peer_failed_earlier():
    ends = {
        "node1": (10.0, CommandResult(1, PEER, ""), True),
        "node2": (10.3, CommandResult(1, KILLED, ""), True),
        "node3": (15.4, CommandResult(None, "", ""), False),  # stopped by clustercheck: not a failure of its own
    }
    name, result = runner.first_failure(ends)
    assert name == "node2"
    assert torchjob._tail(result)[-1] == "  traceback : Signal 9 (SIGKILL) received by PID 752"  # verbatim: torchrun's
    assert "=====" not in " ".join(torchjob._tail(result))


def test_without_a_killed_rank_the_earliest_failure_is_first_and_a_good_run_has_none():
    ends = {
        "node1": (12.0, CommandResult(1, PEER, ""), True),
        "node3": (11.0, CommandResult(1, "", "ModuleNotFoundError: No module named 'torch'"), True),
        "node2": (11.5, CommandResult(0, "", ""), True),
    }
    assert runner.first_failure(ends)[0] == "node3"
    assert runner.first_failure({"node1": (1.0, CommandResult(0, "", ""), True)}) is None
    deadline = {"node1": (300.0, CommandResult(None, "", "", timed_out=True), True)}
    assert runner.first_failure(deadline) is None  # the deadline is reported as such, naming no node


def test_a_failed_job_turns_its_checks_into_fails_naming_the_node():
    outcome = torchjob.JobOutcome(
        [], 3, "gloo", "torchrun failed on node2 first (exit 1)", {"first_failed_node": "node2"}
    )
    original = CheckResult("ddp_equivalence", Status.FAIL, "missing ranks")
    results = torchjob.judged([original], outcome)
    assert original.message == "missing ranks"  # a new result, nothing changed in place
    assert results[0].status is Status.FAIL
    assert says(results[0].message, "ddp_equivalence did not complete", "torchrun failed on node2 first (exit 1)")
    assert results[0].data["first_failed_node"] == "node2"


def test_a_node_check_of_a_node_the_failure_does_not_name_is_skipped_with_the_reason_not_failed():
    """node2 froze: node1's own per-node check could not run to the end, through no fault of node1's."""
    failure = "node node2 stopped making progress (no answer for 30 s); its SSH connection does not answer"
    outcome = torchjob.JobOutcome([], 6, "gloo", failure, {"stalled_nodes": ["node2"], "first_failed_node": "node2"})
    mine = CheckResult("allreduce.bandwidth.intra_node", Status.SKIP, "no ranks", host="node1")
    frozen = CheckResult("allreduce.bandwidth.intra_node", Status.SKIP, "no ranks", host="node2")
    cluster = CheckResult("allreduce", Status.FAIL, "no result")
    judged = torchjob.judged([mine, frozen, cluster], outcome)
    assert judged[0].status is Status.SKIP and judged[0].message.startswith("node1: did not run to the end: ")
    assert failure in judged[0].message
    assert judged[1].status is Status.FAIL and judged[2].status is Status.FAIL
    no_node = torchjob.JobOutcome([], 6, "gloo", "the job timed out", {"first_failed_node": None})
    assert torchjob.judged([mine], no_node)[0].status is Status.FAIL  # a failure naming no node: every check fails


def _archive(path) -> None:
    """A tar of a node's logs as the collector writes it, with what a hostile or damaged one could add."""
    with tarfile.open(path, "w:gz") as tar:
        for name, kind in [
            ("logs", tarfile.DIRTYPE),
            ("logs/rank-0.log", tarfile.REGTYPE),
            ("../outside.log", tarfile.REGTYPE),
            ("/tmp/absolute.log", tarfile.REGTYPE),
            ("logs/link", tarfile.SYMTYPE),
        ]:
            info = tarfile.TarInfo(name)
            info.type = kind
            data = b"loss 0.5\n" if kind == tarfile.REGTYPE else b""
            info.size = len(data)
            if kind == tarfile.SYMTYPE:
                info.linkname = "/etc/shadow"
            tar.addfile(info, io.BytesIO(data))


def test_only_plain_files_inside_the_target_are_kept_from_a_node_s_archive(tmp_path):
    """A node's logs archive is written under the run directory's host folder: its files only, never a link, an
    absolute name or a name that climbs out; a damaged archive leaves what came before it and no error."""
    _archive(tmp_path / "logs.tgz")
    target = tmp_path / "run" / "node1"
    torchjob.keep_files((tmp_path / "logs.tgz").read_bytes(), target)
    extracted = sorted(str(p.relative_to(target)) for p in target.rglob("*"))
    assert extracted == ["logs", "logs/rank-0.log"]
    assert (target / "logs" / "rank-0.log").read_text() == "loss 0.5\n"
    assert not (tmp_path / "run" / "outside.log").exists() and not (target / "tmp").exists()
    torchjob.keep_files((tmp_path / "logs.tgz").read_bytes()[:40], tmp_path / "cut")
    torchjob.keep_files(b"not an archive", tmp_path / "garbage")


def test_a_job_stopped_at_its_deadline_says_raise_timeout_once_not_a_killed_rank_per_check():
    """--timeout 2: every check of the job FAILs, the cause is the deadline, and the fix (raise --timeout) is said on
    the first of them, the others pointing there; a job that failed otherwise keeps the fix about its ranks' logs."""
    from clustercheck.checks import registry as checks
    from clustercheck.model import Status
    from clustercheck.stages.torchjob import JobOutcome, judged

    names = ("allreduce", "allgather", "broadcast", "allreduce.bandwidth")
    pending = [checks.emit(n, Status.SKIP, f"{n}: no record") for n in names]
    stopped = JobOutcome(
        [], 2, "gloo", "the torch job timed out after 2 s (--timeout)", {"timed_out": True, "job_timeout": 2.0}
    )
    fixes = [r.remediation for r in judged(pending, stopped)]
    assert fixes[0].startswith("Raise --timeout (it was 2 s)")
    assert all("--timeout" not in f and "killed rank" not in f and "allreduce" in f for f in fixes[1:])
    crashed = JobOutcome([], 2, "gloo", "torchrun failed on node1 first (exit 1)", {"first_failed_node": None})
    assert all("killed rank" in r.remediation for r in judged(pending, crashed))
