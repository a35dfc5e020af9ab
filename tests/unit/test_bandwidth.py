"""The all_reduce bandwidth sweep: nccl-tests' definitions, thresholds, and records from a real 2x2 gloo run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clustercheck.checks import collectives as bandwidth
from clustercheck.model import Status
from clustercheck.remote import collectives as worker

RECORDS = Path(__file__).parent / "records"


def load() -> list[dict]:
    return json.loads((RECORDS / "collectives-2x2.json").read_text())


def test_busbw_factor_is_nccl_tests():
    assert worker.bus_factor(2) == 1.0
    assert worker.bus_factor(4) == 1.5
    assert worker.bus_factor(8) == 1.75
    assert worker.bus_factor(1) == 1.0


def test_sizes_are_powers_of_two():
    assert worker.sizes_between(1 << 20, 1 << 30) == [1 << p for p in range(20, 31)]
    assert worker.sizes_between(1000, 4096) == [1024, 2048, 4096]


def test_recorded_sweep_follows_the_definitions():
    rank0 = load()[0]
    for row in rank0["bandwidth"]["world"]:
        algbw = row["bytes"] / (row["time_us"] / 1e6) / 1e9
        assert row["algbw_gbps"] == pytest.approx(algbw, rel=1e-3)
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 2 * 3 / 4)


def test_cluster_and_intra_node_results_without_threshold_pass():
    results = bandwidth.evaluate_bandwidth(load(), world_size=4)
    assert [r.name for r in results] == [
        "allreduce.bandwidth",
        "allreduce.bandwidth.intra_node",
        "allreduce.bandwidth.intra_node",
    ]
    assert all(r.status is Status.PASS for r in results)
    cluster = results[0]
    assert cluster.host is None and cluster.data["ranks"] == 4
    assert len(cluster.data["sizes"]) == 7
    assert cluster.data["peak_busbw_gbps"] == max(r["busbw_gbps"] for r in cluster.data["sizes"])
    assert [r.data["ranks"] for r in results[1:]] == [2, 2]


def test_thresholds_warn_and_fail():
    records = load()
    peak = bandwidth.evaluate_bandwidth(records, 4)[0].data["peak_busbw_gbps"]
    assert bandwidth.evaluate_bandwidth(records, 4, bandwidth.Thresholds(warn_below=peak * 2))[0].status is Status.WARN
    failed = bandwidth.evaluate_bandwidth(records, 4, bandwidth.Thresholds(fail_below=peak * 2))[0]
    assert failed.status is Status.FAIL
    assert "under the threshold (FAIL below" in failed.message
    assert "NCCL_SOCKET_IFNAME" in failed.remediation
    assert bandwidth.evaluate_bandwidth(records, 4, bandwidth.Thresholds(fail_below=peak / 2))[0].status is Status.PASS


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("40", bandwidth.Thresholds(fail_below=40)),
        ("40:80", bandwidth.Thresholds(fail_below=40, warn_below=80)),
        (":80", bandwidth.Thresholds(warn_below=80)),
        (25, bandwidth.Thresholds(fail_below=25)),
        (None, bandwidth.Thresholds()),
    ],
)
def test_parse_min_busbw(text, expected):
    assert bandwidth.parse_min_busbw(text) == expected


@pytest.mark.parametrize("text", ["fast", "80:40", "-1", "1:x"])
def test_bad_min_busbw_is_a_clear_error(text):
    with pytest.raises(bandwidth.ThresholdError, match="--min-busbw"):
        bandwidth.parse_min_busbw(text)


def test_a_failed_job_skips_bandwidth():
    (result,) = bandwidth.evaluate_bandwidth([{"rank": 0, "ok": False, "error": "x"}], 2)
    assert result.status is Status.SKIP
