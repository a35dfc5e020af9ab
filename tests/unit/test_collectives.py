"""Evaluating the collective worker's per-rank records into checks."""

from clustercheck.checks.collectives import evaluate
from clustercheck.model import Status


def record(rank, wrong=0, ok=True, host="node1"):
    checks = {name: {"wrong": wrong, "elements": 16} for name in ("allreduce", "allgather", "broadcast")}
    return {"rank": rank, "host": host, "ok": ok, "backend": "gloo", "checks": checks}


def test_all_ranks_right_passes():
    results = evaluate([record(0), record(1)], world_size=2)
    assert [r.status for r in results] == [Status.PASS] * 3
    assert results[0].data["wrong"] == 0


def test_wrong_elements_are_counted_and_named_by_rank():
    results = evaluate([record(0), record(1, wrong=3, host="node2")], world_size=2)
    allreduce = results[0]
    assert allreduce.status is Status.FAIL
    assert allreduce.data["wrong"] == 3
    assert "rank 1: 3" in allreduce.message


def test_a_failed_rank_names_its_host_and_error():
    failed = {"rank": 1, "host": "node2", "ok": False, "error": "RuntimeError: Connection refused"}
    results = evaluate([record(0), failed], world_size=2)
    assert all(r.status is Status.FAIL for r in results)
    assert "node2" in results[0].message and "Connection refused" in results[0].message


def test_a_missing_rank_fails():
    results = evaluate([record(0)], world_size=3)
    assert results[0].status is Status.FAIL
    assert results[0].data["missing_ranks"] == [1, 2]
