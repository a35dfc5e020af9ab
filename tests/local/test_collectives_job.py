"""Collectives and the all_reduce bandwidth sweep for real: two torchrun agents of two gloo ranks each."""

from __future__ import annotations

import json
import subprocess
import sys

import localjob

from clustercheck.checks import collectives
from clustercheck.checks import collectives as bandwidth
from clustercheck.model import Status


def test_two_nodes_of_two_ranks_are_correct_and_report_inter_and_intra_node_bandwidth(tmp_path):
    job = localjob.run_job(
        tmp_path,
        "collectives",
        nnodes=2,
        nproc=2,
        master_port=29685,
        worker_args=["--intra-node", "always", "--max-bytes", str(1 << 20)],
    )
    assert job.exit_codes == [0, 0], job.logs
    assert job.world_size == 4
    checks = collectives.evaluate(job.records, job.world_size)
    assert [(c.name, c.status) for c in checks] == [
        ("allreduce", Status.PASS),
        ("allgather", Status.PASS),
        ("broadcast", Status.PASS),
    ]
    results = bandwidth.evaluate_bandwidth(job.records, job.world_size)
    cluster, *intra = results
    assert cluster.name == "allreduce.bandwidth" and cluster.status is Status.PASS
    assert [row["bytes"] for row in cluster.data["sizes"]] == [1 << p for p in range(16, 21)]
    assert all(row["busbw_gbps"] == row["algbw_gbps"] * 1.5 for row in cluster.data["sizes"])
    assert [r.name for r in intra] == ["allreduce.bandwidth.intra_node"] * 2
    assert sorted(r.data["ranks"] for r in intra) == [2, 2]
    # the intra-node groups are the ranks of each torchrun agent, i.e. of each node
    groups = sorted(tuple(r["bandwidth"]["intra_node"]["ranks"]) for r in job.records)
    assert groups == [(0, 1), (0, 1), (2, 3), (2, 3)]
    # A threshold far above what loopback gives turns the same numbers into a FAIL.
    failed = bandwidth.evaluate_bandwidth(job.records, job.world_size, bandwidth.parse_min_busbw("1000"))
    assert {r.status for r in failed} == {Status.FAIL}


PAIR = """
import json, sys
import torch
import torch.distributed as dist
from clustercheck.remote import fabricpairs

rank, port, budget = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
calls = []
batch = dist.batch_isend_irecv
dist.batch_isend_irecv = lambda ops: calls.append(1) or batch(ops)
send = torch.ones(1 << 18)
seconds = fabricpairs.exchange(torch, dist, torch.device("cpu"), send, torch.empty_like(send), 1 - rank, 50, budget)
print(json.dumps({"exchanges": len(calls), "seconds": seconds}))
dist.destroy_process_group()
"""


def test_a_pair_past_its_time_budget_stops_on_both_sides_after_the_same_exchange():
    """Rank 0 is past its budget from the start, rank 1 never is: both stop after the warm-up and one timed
    exchange (each reads the other's flag), neither waiting on a receive the other never sends."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PAIR, str(rank), "29699", budget], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for rank, budget in ((0, "0"), (1, "1e9"))
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err.decode()[-2000:] for _, err in outs]
    figures = [json.loads(out) for out, _ in outs]
    assert [f["exchanges"] for f in figures] == [2, 2]
    assert all(f["seconds"] > 0 for f in figures)
