"""`run --slurm --nodes N` outside an allocation: what Slurm can grant, read before it is asked (slurm/grant.py, pure,
on `scontrol show node` and `show partition` outputs quoted in tests/unit/data/README.md), a request it cannot grant
refused at once naming each node it keeps out with its state, Slurm's reason, who set it and when, and the fix; and a
request that waits said with squeue's reason and the jobs holding the nodes, the last reason in the error
(slurm/allocation.py, with fake salloc, scontrol, squeue and scancel programs on PATH)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from wording import says

from clustercheck.slurm import allocation, grant, parse
from clustercheck.slurm.parse import SlurmPartition
from clustercheck.slurm.request import Request

DATA = Path(__file__).parent / "data" / "slurm"


def recorded(name: str) -> str:
    return (DATA / name).read_text()


def drained_cluster() -> list[parse.SlurmNode]:
    """Slurm 25.05.3, server5 drained by root ("维护中", in maintenance), server2-4 idle (a deployment manual)."""
    return parse.parse_show_nodes(recorded("show-nodes-drained-deploy-manual-25.05.txt"))


# ------------------------------------------------------------------------------------ Slurm's nodes read (pure)


def test_a_drained_node_is_read_with_slurms_reason_and_who_set_it_when():
    nodes = {n.name: n for n in drained_cluster()}
    server5 = nodes["server5"]
    assert (server5.reason, server5.reason_by, server5.reason_at) == ("维护中", "root", "2025-09-23T09:46:15")
    assert server5.unusable == ("DRAIN",) and server5.partitions == ("cpu", "memory")
    assert [name for name, n in nodes.items() if not n.unusable] == ["server2", "server3", "server4"]
    assert says(grant.why(server5), "server5", "drained", "维护中", "root", "2025-09-23T09:46:15")


def test_down_nodes_as_slurm_shows_them_are_unusable_with_slurms_reason():
    """Slurm 21.08's DOWN+DRAIN, and State=DOWN* in Slurm's own quickstart (the `*`: not responding)."""
    down_drain = parse.parse_show_node(recorded("show-node-down-drain-21.08.txt"), "node1")
    assert down_drain.unusable == ("DOWN", "DRAIN") and down_drain.reason_by == "slurm"
    assert says(grant.why(down_drain), "node1", "down", "drained", "Not responding", "slurm 2021-10-19T12:56:19")
    assert says(grant.fix(down_drain), "resume node1", "scontrol update nodename=node1 state=resume")
    assert "slurmd" not in grant.fix(down_drain)  # slurmd answers again: Slurm only keeps it down
    adev1 = parse.parse_show_node(recorded("show-node-down-slurm-doc-quickstart.txt"), "adev1")
    assert adev1.unusable == ("DOWN", "NOT_RESPONDING")
    assert says(grant.fix(adev1), "start slurmd on adev1", "state=resume")
    assert says(grant.why(adev1), "adev1 is down and not responding", "Not responding", "slurm 06/02-14:01:24")


def test_a_node_idle_busy_or_powered_down_is_usable_and_a_reserved_one_is_not():
    """sinfo(1)'s node state codes: RESERVED "not generally available"; a powered-down node is powered up for a job."""
    shown = recorded("show-node-not-responding.txt")  # MIXED+NOT_RESPONDING, recorded on the test cluster
    assert parse.parse_show_node(shown, "node3").unusable == ("NOT_RESPONDING",)
    assert parse.parse_show_node(recorded("show-node-slurmd-stopped.txt"), "node3").unusable == ()  # MIXED
    assert parse.SlurmNode("n1", ("IDLE", "POWERED_DOWN"), None).unusable == ()
    assert parse.SlurmNode("n1", ("IDLE", "RESERVED"), None).unusable == ("RESERVED",)


def test_partitions_are_read_with_the_default_and_their_state():
    partitions = parse.parse_show_partitions(recorded("show-partition-slurm-doc-quickstart.txt"))
    assert partitions == [SlurmPartition("debug", True, "UP"), SlurmPartition("batch", False, "UP")]
    assert grant.partition_name(None, partitions) == "debug" and grant.partition_name("batch", partitions) == "batch"


# --------------------------------------------------------------------------------- what Slurm can grant (pure)


def test_fewer_usable_nodes_than_asked_is_refused_naming_each_with_its_state_reason_and_the_fix():
    refused = grant.refusal(4, [], drained_cluster(), [], None)
    assert refused is not None
    assert says(refused, "at most 3 of the 4 nodes", "server5 is drained", "维护中", "root 2025-09-23T09:46:15")
    assert says(refused, "--nodes 3", "scontrol update nodename=server5 state=resume")
    assert grant.refusal(3, [], drained_cluster(), [], None) is None  # three usable: Slurm is asked


def test_nodes_of_another_partition_do_not_count_and_are_named():
    refused = grant.refusal(3, [], drained_cluster(), [], "gpu")
    assert refused is not None
    assert says(refused, "at most 2 of the 3", "partition gpu has 2", "server4 is in partitions cpu,memory, not gpu")
    assert grant.refusal(2, [], drained_cluster(), [], "gpu") is None
    assert grant.refusal(2, [], drained_cluster(), [], "nosuch") is None  # salloc itself refuses it at once


def test_a_nodelist_naming_a_node_slurm_keeps_out_is_refused_and_one_of_usable_nodes_is_not():
    refused = grant.refusal(0, ["server2", "server5"], drained_cluster(), [], None)
    assert refused is not None and says(refused, "--nodelist", "server5 is drained", "state=resume")
    assert "server2" not in refused
    assert grant.refusal(0, ["server2", "server3"], drained_cluster(), [], None) is None


def test_a_partition_that_starts_no_job_is_refused_and_a_down_node_with_slurmds_fix():
    down = SlurmPartition("debug", True, "DOWN")
    refused = grant.refusal(1, [], drained_cluster(), [down], None)
    assert refused is not None and says(refused, "partition debug", "DOWN", "state=up")
    node1 = parse.parse_show_nodes(recorded("show-node-down-drain-21.08.txt"))
    refused = grant.refusal(1, [], node1, [], "batch")
    assert refused is not None and says(refused, "none of the 1 nodes", "node1 is down", "resume node1")


def test_a_request_that_waits_is_said_with_squeues_reason_and_the_jobs_on_the_nodes():
    """squeue on the test cluster: job 3 PENDING (Resources) behind job 2 RUNNING on node[1-3]."""
    queued = parse.parse_squeue(recorded("squeue-launches.txt"))
    running = [q for q in queued if q.state == "RUNNING"]
    line = grant.pending(queued[0].job, queued[0].reason, running)
    assert says(line, "job 3", "Resources", "busy", "job 2 on node[1-3]")


def test_the_job_salloc_waits_for_is_read_from_what_it_says():
    """salloc --no-shell's stderr refused after --immediate=5 (test_slurm.py's recording)."""
    refused = "salloc: Requested partition configuration not available now\nsalloc: Pending job allocation 6\n"
    assert parse.pending_job(refused) == "6" and parse.pending_job("salloc: Granted job allocation 5\n") is None


def test_slurm_22_05_on_debian_12_drained_and_down_nodes_are_refused_and_the_default_partition_found():
    """Recorded on Debian 12's Slurm 22.05.8 (the test cluster's): n1 busy, n2 drained ('PSU swap, ticket 7'), n3
    set down ('fan failure') with no slurmd; the default partition gpu from `scontrol show partition`."""
    nodes = parse.parse_show_nodes(recorded("show-nodes-drained-down-22.05.txt"))
    partitions = parse.parse_show_partitions(recorded("show-partition-22.05.txt"))
    assert partitions == [SlurmPartition("gpu", True, "UP")]
    assert [n.unusable for n in nodes] == [(), ("DRAIN", "NOT_RESPONDING"), ("DOWN", "NOT_RESPONDING")]
    refused = grant.refusal(3, [], nodes, partitions, None)
    assert refused is not None
    assert says(refused, "at most 1 of the 3", "partition gpu", "n2 is drained", "PSU swap, ticket 7", "root")
    assert says(refused, "n3 is down", "fan failure", "--nodes 1", "start slurmd on n3")
    assert grant.refusal(1, [], nodes, partitions, None) is None  # n1 is busy, not kept out: Slurm is asked


def test_slurm_22_05s_own_words_for_a_request_that_waits_and_times_out():
    """salloc's whole stderr for a request behind a running job, --immediate=6, and squeue meanwhile (22.05.8)."""
    salloc = recorded("salloc-pending-timed-out-22.05.txt")
    assert parse.pending_job(salloc) == "3" and parse.granted_job(salloc) is None
    pending, running = parse.parse_squeue(recorded("squeue-pending-behind-running-22.05.txt"))
    assert (pending.state, pending.reason) == ("PENDING", "Resources")
    assert says(grant.pending(pending.job, pending.reason, [running]), "job 3 waits", "Resources", "job 1 on n1")


# ------------------------------------------------------- the allocation asked for (fake Slurm programs on PATH)


def fake_slurm(tmp_path: Path, monkeypatch, nodes: str, salloc: str) -> Path:
    """salloc, scontrol, squeue and scancel as scripts in TMP_PATH/bin, first on PATH; each call logged in calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "nodes.txt").write_text(nodes)
    log = tmp_path / "calls"
    scripts = {
        "scontrol": f'[ "$2" = node ] && cat {tmp_path}/nodes.txt; exit 0',
        "salloc": salloc,
        "squeue": (
            'case "$*" in *RUNNING*) echo "2|RUNNING|2026-11-26T10:03:08|node[1-3]|None";; '
            '*) echo "3|PENDING|2027-11-26T10:03:08||Resources";; esac'
        ),
        "scancel": "exit 0",
        "sbatch": "echo 42",
    }
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\n{body}\n')
        path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


def test_a_request_slurm_cannot_grant_is_refused_at_once_without_asking_slurm(tmp_path, monkeypatch):
    log = fake_slurm(tmp_path, monkeypatch, recorded("show-nodes-drained-deploy-manual-25.05.txt"), "sleep 60")
    began = time.monotonic()
    with pytest.raises(allocation.NotGranted) as refused, allocation.allocated(Request(nodes=4), wait=300):
        pass
    assert time.monotonic() - began < 10
    assert says(str(refused.value), "at most 3 of the 4", "server5 is drained", "维护中", "state=resume")
    assert "salloc" not in log.read_text()


def test_a_request_that_waits_says_slurms_reason_and_the_error_ends_with_it(tmp_path, monkeypatch):
    salloc = (
        'echo "salloc: Pending job allocation 6" >&2; echo "salloc: job 6 queued and waiting for resources" >&2; '
        'sleep 2; echo "salloc: error: Unable to allocate resources: Connection timed out" >&2; exit 1'
    )
    log = fake_slurm(tmp_path, monkeypatch, recorded("show-nodes-drained-deploy-manual-25.05.txt"), salloc)
    said: list[str] = []
    with (
        pytest.raises(allocation.NotGranted) as refused,
        allocation.allocated(Request(nodes=3), wait=5, say=said.append),
    ):
        pass
    assert len(said) == 1 and says(said[0], "Resources", "job 2 on node[1-3]")  # said once: the reason held
    assert says(str(refused.value), "within 5 s", "Resources", "Connection timed out")
    assert "scancel 6" in log.read_text()  # the request is taken back


def test_run_slurm_exits_5_at_once_naming_the_drained_node(tmp_path, monkeypatch):
    """`clustercheck run --slurm --nodes 4` outside an allocation, server5 drained: exit 5 (no nodes), no salloc."""
    from clustercheck.exitcodes import ExitCode, NoHosts
    from clustercheck.run import verify

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    log = fake_slurm(tmp_path, monkeypatch, recorded("show-nodes-drained-deploy-manual-25.05.txt"), "sleep 60")
    request = verify.RunRequest(slurm=verify.SlurmRun(Request(nodes=4)), run_dir=str(tmp_path / "run"))
    with pytest.raises(NoHosts) as stopped:
        verify.run(request, print, print)
    assert stopped.value.code == ExitCode.NO_HOSTS == 5
    assert says(str(stopped.value), "--slurm", "server5 is drained", "维护中", "--nodes 3")
    assert "salloc" not in log.read_text()


def test_a_batch_launch_slurm_cannot_grant_now_is_said_and_submitted_all_the_same(tmp_path, monkeypatch):
    """`launch --slurm --nodes 4` from the login node, server5 drained: the same reading says so before sbatch; a
    batch job may wait for an administrator, so it is submitted (and waits in Slurm's queue)."""
    from clustercheck.launcher import batchjob

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    log = fake_slurm(tmp_path, monkeypatch, recorded("show-nodes-drained-deploy-manual-25.05.txt"), "exit 1")
    said: list[str] = []
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    status = batchjob.submit(
        Request(nodes=4), ["--", "train.py"], run_dir, dry_run=False, detach=True, echo=print, say=said.append
    )
    assert status == 0 and "sbatch" in log.read_text()
    first = said[0]
    assert says(first, "at most 3 of the 4", "server5 is drained", "维护中", "waits in Slurm's queue")
