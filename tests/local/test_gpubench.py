"""The node-side GPU measurement (the bundle's `gpubench`) run for real on this machine: without a CUDA GPU it says
so as data, and the checks SKIP with that reason; its phases, run on CPU devices (the same code a GPU's thread runs,
CPU timing in place of CUDA events), give every figure in the shape the controller reads, and a device that fails
one phase does not hold the others up."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import torch

from clustercheck import expected
from clustercheck.checks import gpuperf
from clustercheck.facts.model import GpuBench
from clustercheck.model import Status
from clustercheck.remote import gpubench
from clustercheck.stages import bundle


def test_the_program_says_when_there_is_no_cuda_gpu_and_the_checks_skip_with_that_reason(tmp_path):
    pyz = bundle.write(tmp_path)
    argv = [sys.executable, pyz, "gpubench", "--matmul-n", "64", "--copy-mib", "1", "--host-mib", "1", "--repeats", "1"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    if torch.cuda.is_available():  # a GPU machine: every GPU measured
        assert answer["cuda"] is True and answer["copy_counts"] == "read+written"
        assert all(g["matmul_tflops"]["bf16"] > 0 and g["h2d_gbps"] > 0 for g in answer["gpus"]), answer
        return
    assert answer["cuda"] is False and answer["gpus"] == []
    assert answer["reason"].endswith("no GPU to measure")
    found = gpuperf.judge_node(GpuBench.from_answer(answer), expected.shipped().match([]), gpuperf.MATMUL)
    assert (found.status, found.message) == (Status.SKIP, answer["reason"])


def test_a_bad_size_is_one_line_on_standard_error_and_exit_2(tmp_path):
    pyz = bundle.write(tmp_path)
    proc = subprocess.run([sys.executable, pyz, "gpubench", "--repeats", "0"], capture_output=True, text=True)
    assert proc.returncode == 2 and "every size must be at least 1" in proc.stderr


def measured(devices: list[str]) -> dict:
    """Every device of DEVICES measured at once, one thread each, as the program's threads measure the GPUs."""
    phases = gpubench.Phases(torch, len(devices))
    out: dict = {}

    def thread(index: int, device: str) -> None:
        out[index] = entry = {"index": index, "bus_id": None, "name": f"{device} device"}
        gpubench.measure(torch, torch.device(device), gpubench.Sizes(128, 1, 1, 2), phases, entry)

    threads = [threading.Thread(target=thread, args=(i, d)) for i, d in enumerate(devices)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a device's thread is still waiting"
    return out


def test_every_figure_comes_out_in_the_shape_the_checks_read():
    out = measured(["cpu", "cpu"])
    for entry in out.values():
        assert set(entry["matmul_tflops"]) == {"bf16", "tf32", "fp32"}
        assert all(value > 0 for value in entry["matmul_tflops"].values()), entry
        assert entry["memory_gbps"] > 0 and entry["h2d_gbps"] > 0 and entry["d2h_gbps"] > 0, entry
        assert "error" not in entry
        # the median repeat beside the best: never faster than the best
        assert all(entry["matmul_tflops_median"][d] <= entry["matmul_tflops"][d] for d in entry["matmul_tflops"])
        assert 0 < entry["memory_gbps_median"] <= entry["memory_gbps"] and entry["d2h_gbps_median"] <= entry["d2h_gbps"]
    bench = GpuBench.from_answer({"cuda": True, "copy_counts": gpubench.COPY_COUNTS, "gpus": list(out.values())})
    assert [g.figure("matmul_fp32_tflops") for g in bench.gpus] == [e["matmul_tflops"]["fp32"] for e in out.values()]
    assert bench.gpus[1].figure("memory_gbps") == out[1]["memory_gbps"]


def test_a_device_that_fails_a_phase_has_its_error_and_the_others_go_on():
    out = measured(["cpu", "meta"])  # a meta tensor has no data: copying it to the host fails
    assert "error" not in out[0] and out[0]["d2h_gbps"] > 0
    assert out[1]["error"].startswith("NotImplementedError: Cannot copy out of meta tensor")
