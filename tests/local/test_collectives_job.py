"""Collectives and the all_reduce bandwidth sweep for real: two torchrun agents of two gloo ranks each."""

from __future__ import annotations

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
