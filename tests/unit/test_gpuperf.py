"""The per-GPU figures judged (checks/gpuperf.py): against the model's expected values, the node's other GPUs and the
cluster's GPUs of the same model. The figure dicts are constructed inputs of the pure judge, in the shape the
node-side gpubench prints (remote/gpubench.py; tests/local/test_gpubench.py runs it)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from wording import says

from clustercheck import expected
from clustercheck.checks import gpuperf, registry
from clustercheck.facts import collect
from clustercheck.facts.model import GpuBench, GpuFigures
from clustercheck.inventory import Node
from clustercheck.model import Status
from clustercheck.selection import Selection

RECORDS = Path(__file__).parent / "records"

H100 = "NVIDIA H100 80GB HBM3"


def gpu(index: int, bf16: float = 700.0, memory: float = 2900.0, h2d: float = 55.0, **more) -> dict:
    """One GPU's entry as gpubench prints it."""
    entry = {
        "index": index,
        "bus_id": f"00000000:{0x18 + index:02X}:00.0",
        "name": H100,
        "matmul_tflops": {"bf16": bf16, "tf32": 380.0, "fp32": 50.0},
        "memory_gbps": memory,
        "h2d_gbps": h2d,
        "d2h_gbps": 54.0,
        "seconds": 3.1,
    }
    entry.update(more)
    return entry


def bench(*gpus: dict) -> GpuBench:
    return GpuBench.from_answer({"cuda": True, "copy_counts": "read+written", "gpus": list(gpus)})


def h100() -> expected.Match:
    return expected.shipped().match([H100])


def no_model() -> expected.Match:
    return expected.shipped().match(["NVIDIA Unknown GPU"])


def test_gpus_as_fast_as_the_datasheet_allows_and_as_each_other_pass_with_their_figures_as_data():
    found = gpuperf.judge_node(bench(*(gpu(i) for i in range(8))), h100(), gpuperf.MATMUL)
    assert found.status is Status.PASS, found.message
    assert found.message.startswith("8 GPU(s): bf16 multiply 700 TFLOP/s, tf32 multiply 380 TFLOP/s")
    row = found.data["gpus"][3]
    assert row == {
        "index": 3,
        "bus_id": "00000000:1B:00.0",
        "name": H100,
        "matmul_bf16_tflops": 700.0,
        "matmul_tf32_tflops": 380.0,
        "matmul_fp32_tflops": 50.0,
    }
    assert found.data["expected"]["matmul_bf16_tflops"] == 989.5


def test_a_gpu_well_below_its_node_peers_is_named_by_index_and_bus_id_with_what_to_look_at():
    gpus = [gpu(i) for i in range(8)]
    gpus[5] = gpu(5, bf16=510.0)  # still above half the datasheet's 989.5: only its peers show it slow
    found = gpuperf.judge_node(bench(*gpus), h100(), gpuperf.MATMUL)
    assert found.status is Status.WARN
    assert "GPU 5 (00000000:1D:00.0): bf16 multiply 510 TFLOP/s, 73% of the median 700 TFLOP/s" in found.message
    assert "GPU 4" not in found.message
    result = registry.get("gpu.perf.matmul").result("node1", found)
    assert "power cap" in result.remediation and "gpu.processes" in result.remediation


def test_a_figure_under_the_models_datasheet_share_is_named_even_when_every_gpu_is_alike():
    found = gpuperf.judge_node(bench(*(gpu(i, memory=1500.0) for i in range(4))), h100(), gpuperf.MEMORY)
    assert found.status is Status.WARN
    assert "GPU 0 (00000000:18:00.0): memory copy 1500 GB/s, under 60% of H100 SXM's 3350 GB/s" in found.message
    assert found.data["copy_counts"] == "read+written"


def test_a_slow_pcie_link_shows_as_a_host_copy_under_the_floor_and_the_fix_names_the_link():
    gpus = [gpu(0), gpu(1, h2d=26.0)]
    found = gpuperf.judge_node(bench(*gpus), h100(), gpuperf.HOST)
    assert found.status is Status.WARN
    assert "GPU 1 (00000000:19:00.0): host-to-device copy 26 GB/s, under H100 SXM's 52 GB/s" in found.message
    assert "PCIe link width and generation" in registry.get("gpu.perf.host_copy").result("n", found).remediation


def test_a_model_without_the_figure_is_judged_against_the_node_only_and_says_so():
    found = gpuperf.judge_node(bench(gpu(0), gpu(1)), no_model(), gpuperf.MATMUL)
    assert found.status is Status.PASS
    assert "no expected values for NVIDIA Unknown GPU: judged against the node's other GPUs only" in found.message


def test_a_model_whose_file_gives_no_such_figure_says_it_has_no_expected_value():
    l40s = expected.shipped().match(["NVIDIA L40S"])
    found = gpuperf.judge_node(bench(gpu(0, name="NVIDIA L40S"), gpu(1, name="NVIDIA L40S")), l40s, gpuperf.HOST)
    assert found.status is Status.PASS
    assert found.message.endswith(
        "(expected values of L40S in clustercheck/expected/l40s.yml, which give no host_copy_gbps: judged "
        "against the node's other GPUs only)"
    )
    assert found.data["expected"] == {"host_copy_gbps": None}


def test_a_gpu_that_could_not_be_measured_fails_unless_it_ran_out_of_memory():
    broken = gpu(1, error="RuntimeError: CUDA error: an illegal memory access was encountered")
    found = gpuperf.judge_node(bench(gpu(0), broken), h100(), gpuperf.MATMUL)
    assert found.status is Status.FAIL
    assert "GPU 1 (00000000:19:00.0): not measured: RuntimeError: CUDA error" in found.message
    crowded = gpu(1, error="OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB")
    assert gpuperf.judge_node(bench(gpu(0), crowded), h100(), gpuperf.MATMUL).status is Status.WARN


def test_no_cuda_gpu_for_torch_is_a_skip_with_the_programs_reason_and_a_failed_program_a_fail():
    answer = {"cuda": False, "reason": "torch 2.13.0+cpu is built without CUDA: no GPU to measure", "gpus": []}
    found = gpuperf.judge_node(GpuBench.from_answer(answer), h100(), gpuperf.MATMUL)
    assert (found.status, found.message) == (Status.SKIP, answer["reason"])
    unmeasured = gpuperf.judge_node(None, h100(), gpuperf.HOST)
    assert unmeasured.status is Status.SKIP and "not measured" in unmeasured.message
    failed = gpuperf.judge_node(GpuBench(failure="timed out after 120 s"), h100(), gpuperf.HOST)
    assert failed.status is Status.FAIL and "timed out after 120 s" in failed.message


def test_a_node_whose_gpus_are_all_slow_is_named_against_the_clusters_gpus_of_its_model():
    fast = bench(*(gpu(i) for i in range(4)))
    slow = bench(*(gpu(i, bf16=400.0) for i in range(4)))
    found = gpuperf.judge_cluster({"node1": fast, "node2": fast, "node3": slow})
    assert found.status is Status.WARN
    assert "node3 GPU 2 (00000000:1A:00.0): bf16 multiply 400 TFLOP/s, 57% of the median 700 TFLOP/s" in found.message
    assert "node1" not in found.message
    assert found.data["cluster_median"]["matmul_bf16_tflops"] == {H100: 700.0}
    assert gpuperf.judge_cluster({"node1": fast, "node2": fast}).status is Status.PASS
    alone = gpuperf.judge_cluster({"node1": fast, "node2": GpuBench(problem="torch does not import (x)")})
    assert alone.status is Status.SKIP


def test_the_measurement_runs_only_when_a_check_that_judges_it_is_selected():
    assert gpuperf.wanted(Selection())
    assert gpuperf.wanted(Selection(skip=("gpu.perf.matmul", "gpu.perf.memory")))
    assert not gpuperf.wanted(Selection(skip=("gpu.perf.*",)))  # the monitoring timer's: no GPU work while users train
    assert not gpuperf.wanted(Selection(skip=("gpu.*",)))


def test_on_a_node_without_a_gpu_the_figure_checks_skip_with_the_reason():
    raw = json.loads((RECORDS / "facts-debian12-localhost.json").read_text())
    facts = collect.build(Node(name="localhost", address="localhost"), raw, python="python3", python_source="x")
    results = {r.name: r for r in registry.run_node_checks(facts)}
    for name in ("gpu.perf.matmul", "gpu.perf.memory", "gpu.perf.host_copy"):
        assert results[name].status is Status.SKIP
        assert says(results[name].skip.reason, "no NVIDIA GPU", "none expected")
    (cluster,) = [r for r in registry.run_cluster_checks([facts], None) if r.name == "gpu.perf.cluster"]
    assert cluster.status is Status.SKIP and says(cluster.message, "no NVIDIA GPU", "any node")


def test_figures_are_read_by_their_report_names():
    figures = GpuFigures.from_answer(gpu(0))
    assert figures.figure("matmul_tf32_tflops") == 380.0 and figures.figure("d2h_gbps") == 54.0
    assert figures.label == "GPU 0 (00000000:18:00.0)"


def test_the_core_stage_runs_gpubench_with_the_environments_python_and_keeps_its_answer(tmp_path):
    from types import SimpleNamespace

    from fakes import FakeNode

    from clustercheck.stages import bundle, gpuwork
    from clustercheck.transport import CommandResult

    raw = json.loads((RECORDS / "facts-debian12-localhost.json").read_text())
    facts = collect.build(Node(name="node2", address="node2"), raw, python="/opt/env/bin/python", python_source="x")
    assert facts.torch_problem is None
    ctx = SimpleNamespace(config=SimpleNamespace(command_timeout=120.0, container=None))
    answer = json.dumps({"cuda": True, "copy_counts": "read+written", "gpus": [gpu(0), gpu(1)]})
    node = FakeNode("gpunode1", CommandResult(0, f"loading\n{answer}\n", ""))  # its own: the bundle goes once
    measured = gpuwork.measure_gpus(facts, node, ctx, tmp_path)
    assert node.sent[-1][:2] == (["/opt/env/bin/python", bundle.path(node.workdir), "gpubench"], 120.0)
    assert [g.label for g in measured.gpus] == ["GPU 0 (00000000:18:00.0)", "GPU 1 (00000000:19:00.0)"]
    assert (tmp_path / "gpubench.json").read_text() == f"loading\n{answer}\n"
    error = "Traceback ...\nRuntimeError: CUDA error: unspecified launch failure\n"
    crashed = FakeNode("gpunode2", CommandResult(1, "", error))
    failed = gpuperf.judge_node(gpuwork.measure_gpus(facts, crashed, ctx, tmp_path), h100(), gpuperf.MATMUL)
    assert failed.status is Status.FAIL
    assert says(failed.message, "could not be measured", "gpubench: exit 1", "CUDA error: unspecified launch failure")


def test_each_gpu_s_figures_are_measures_in_base_units_with_the_node_index_and_bus_id_and_units_in_the_data():
    found = gpuperf.judge_node(bench(gpu(0), gpu(1, h2d=30.0)), h100(), gpuperf.HOST, host="node1")
    assert found.data["units"] == {"h2d_gbps": "GB/s", "d2h_gbps": "GB/s"}
    got = {(m.metric.name, tuple(sorted(m.labels.items()))): m.value for m in found.measures}
    labels = {"host": "node1", "gpu": "1", "bus_id": "00000000:19:00.0", "direction": "host_to_device"}
    assert got[("gpu_host_copy_bytes_per_second", tuple(sorted(labels.items())))] == 30.0e9
    assert len(got) == 4  # two GPUs, two directions
    matmul = gpuperf.judge_node(bench(gpu(0)), h100(), gpuperf.MATMUL, host="node1")
    by_dtype = {m.labels["dtype"]: m.value for m in matmul.measures if m.metric is gpuperf.MATMUL_METRIC}
    assert by_dtype == {"bf16": 700.0e12, "tf32": 380.0e12, "fp32": 50.0e12}
    assert matmul.data["units"]["matmul_bf16_tflops"] == "TFLOP/s"
    memory = gpuperf.judge_node(bench(gpu(0)), h100(), gpuperf.MEMORY, host="node1")
    assert [(m.metric.name, m.labels, m.value) for m in memory.measures] == [
        ("gpu_memory_copy_bytes_per_second", {"host": "node1", "gpu": "0", "bus_id": "00000000:18:00.0"}, 2900.0e9)
    ]
    assert gpuperf.judge_node(GpuBench(failure="timed out"), h100(), gpuperf.MATMUL, host="node1").measures == ()


def test_the_node_checks_label_the_measures_with_their_node():
    raw = json.loads((RECORDS / "facts-h200-vm.json").read_text())
    facts = collect.build(Node(name="gpu01", address="gpu01"), raw, python="python3", python_source="x")
    bus_id = facts.smi.gpus[0].bus_id
    facts = replace(facts, gpu_bench=bench(gpu(0, bus_id=bus_id, name="NVIDIA H200", bf16=800.0)))
    results = {r.name: r for r in registry.run_node_checks(facts)}
    measures = results["gpu.perf.matmul"].measures
    assert {m.labels["host"] for m in measures} == {"gpu01"} and {m.labels["bus_id"] for m in measures} == {bus_id}
    assert results["gpu.perf.matmul"].data["gpus"][0]["matmul_bf16_tflops"] == 800.0


def test_a_report_s_gpu_figures_are_keyed_by_node_bus_id_and_figure_and_shown_with_their_unit():
    from clustercheck.model import CheckResult

    found = gpuperf.judge_node(bench(gpu(0), gpu(1, bus_id=None)), h100(), gpuperf.MATMUL, host="node1")
    checks = [
        CheckResult("gpu.perf.matmul", found.status, found.message, host="node1", data=found.data).to_dict(),
        CheckResult("gpu.perf.memory", Status.SKIP, "not measured", host="node1", data={"gpus": [gpu(0)]}).to_dict(),
    ]
    figures = gpuperf.report_figures(checks)
    assert figures == {  # the GPU without a bus id cannot be matched with a baseline's: left out
        "node1 GPU 00000000:18:00.0 bf16 multiply": 700.0,
        "node1 GPU 00000000:18:00.0 tf32 multiply": 380.0,
        "node1 GPU 00000000:18:00.0 fp32 multiply": 50.0,
    }
    assert gpuperf.shown_in("node1 GPU 00000000:18:00.0 bf16 multiply", 512.4) == "512 TFLOP/s"
    assert gpuperf.shown_in("node1 GPU 00000000:18:00.0 device-to-host copy", 21.37) == "21.4 GB/s"
