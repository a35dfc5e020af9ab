"""What clustercheck said on a real GPU: the records of `clustercheck run --hosts localhost` on a virtual machine with
one NVIDIA H200 (driver 580.159.04, torch 2.11.0+cu130, NCCL 2.28.9), judged again here (records/README.md)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from wording import says

from clustercheck.checks import collectives, ddp, registry
from clustercheck.facts import collect
from clustercheck.inventory import Node
from clustercheck.model import Status

RECORDS = Path(__file__).parent / "records"


def record(name: str):
    return json.loads((RECORDS / name).read_text())


def judged(gpus_expected: int | None = None) -> dict:
    facts = collect.build(
        Node(name="localhost", address="localhost", connection="local", gpus_expected=gpus_expected),
        record("facts-h200-vm.json"),
        python="/opt/torch/.venv/bin/python3",
        python_source="the python running clustercheck",
        cluster_size=1,
    )
    return {r.name: r for r in registry.run_node_checks(facts)}


def test_the_h200_passes_its_gpu_and_torch_checks_against_its_models_values():
    results = judged()
    assert results["torch.cuda"].status is Status.PASS
    assert "CUDA 13.0, 1 device(s), NCCL 2.28.9" in results["torch.cuda"].message
    assert results["torch.driver"].status is Status.PASS
    assert "built for CUDA 13.0; driver 580.159.04 supports CUDA 13.0" in results["torch.driver"].message
    memory = results["gpu.memory"]
    assert memory.status is Status.PASS and "143771 MiB per GPU, the 141 GB of H200 SXM" in memory.message
    assert (
        results["gpu.power_clocks"].status is Status.PASS and "power cap 700 W" in results["gpu.power_clocks"].message
    )
    assert results["pcie.link"].status is Status.PASS and "(x16)" in results["pcie.link"].message
    for name in ("gpu.driver", "gpu.persistence", "gpu.ecc", "gpu.throttle", "gpu.remapped_rows", "gpu.identity"):
        assert results[name].status is Status.PASS, (name, results[name].message)


def test_one_gpu_of_a_board_skips_nvlink_and_warns_of_the_boards_count_until_the_inventory_says_one():
    """nvidia-smi nvlink -s printed nothing in the VM: with one GPU there is no peer to link to, so no NVLink is not
    a fault; the count is a WARN against the 8 GPUs of an H200 SXM board until gpus_per_node says 1."""
    results = judged()
    assert results["gpu.nvlink"].status is Status.SKIP
    assert says(results["gpu.nvlink"].message, "localhost: ", "one GPU on this node", "no NVLink", "none reported")
    count = results["gpu.count"]
    assert count.status is Status.WARN and "1 GPU(s) found, where H200 SXM boards carry 8" in count.message
    assert judged(gpus_expected=1)["gpu.count"].status is Status.PASS


def test_one_ranks_collectives_pass_and_its_bandwidth_is_not_judged():
    """One NCCL rank "reached" 64 TB/s at 1 GiB: all_reduce moved nothing. That is a SKIP, not a bandwidth."""
    records = record("collectives-h200-1rank.json")
    assert max(row["busbw_gbps"] for row in records[0]["bandwidth"]["world"]) > 10_000  # what was measured
    assert all(r.status is Status.PASS for r in collectives.evaluate(records, 1))
    threshold = collectives.Thresholds(fail_below=100.0)
    bandwidth = {r.name: r for r in collectives.evaluate_bandwidth(records, 1, threshold, ["localhost"])}
    assert bandwidth["allreduce.bandwidth"].status is Status.SKIP
    assert bandwidth["allreduce.bandwidth"].message.startswith("one rank: all_reduce moves no data")


def test_ddp_on_one_h200_equals_single_process_training():
    result = ddp.evaluate(record("ddp-h200-1rank.json"), 1)
    assert result.status is Status.PASS
    assert "DDP on 1 ranks (nccl, float32), 20 steps matches single-process training: max param diff 0" in (
        result.message
    )


def test_the_h200_s_figures_are_judged_against_its_own_datasheet_not_against_peers_it_does_not_have():
    """The recorded one-GPU H200 with gpubench's figures (in the program's shape, at the levels measured on lent
    H200s: bf16 about 780 TFLOP/s, a copy about 4.3 TB/s): before, h200-sxm.yml gave no such figure and the checks
    PASSed 'judged against the node's other GPUs only', on a node with no other GPU."""
    from clustercheck.facts.model import GpuBench

    facts = collect.build(
        Node(name="localhost", address="localhost", connection="local"),
        record("facts-h200-vm.json"),
        python="/opt/torch/.venv/bin/python3",
        python_source="the python running clustercheck",
        cluster_size=1,
    )
    entry = {"index": 0, "bus_id": facts.smi.gpus[0].bus_id, "name": "NVIDIA H200", "memory_gbps": 4300.0}
    entry |= {"matmul_tflops": {"bf16": 780.0, "tf32": 380.0, "fp32": 50.0}, "h2d_gbps": 55.0, "d2h_gbps": 55.0}
    facts = replace(
        facts, gpu_bench=GpuBench.from_answer({"cuda": True, "copy_counts": "read+written", "gpus": [entry]})
    )
    results = {r.name: r for r in registry.run_node_checks(facts)}
    for name in ("gpu.perf.matmul", "gpu.perf.memory", "gpu.perf.host_copy"):
        assert results[name].status is Status.PASS, results[name].message
        assert "expected values of H200 SXM" in results[name].message
        assert "judged against the node's other GPUs only" not in results[name].message
    facts = replace(
        facts,
        gpu_bench=GpuBench.from_answer(
            {"cuda": True, "copy_counts": "read+written", "gpus": [entry | {"memory_gbps": 2000.0}]}
        ),
    )
    slow = {r.name: r for r in registry.run_node_checks(facts)}["gpu.perf.memory"]
    assert slow.status is Status.WARN and "under 60% of H200 SXM's 4800 GB/s" in slow.message
