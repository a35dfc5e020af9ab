"""The node-side burn (the bundle's `gpuburn`) run for real on this machine: without a CUDA GPU it says so as data
and every gpu.burn.* check SKIPs with that reason; its load and fixed computation, run on CPU devices (the same
function a GPU's thread runs), give the figures and hashes the controller reads, alike on every device; nvidia-smi
and the kernel log that cannot be read are said, not raised."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading

import torch

from clustercheck.checks import gpuburn as checks
from clustercheck.facts.burn import GpuBurn
from clustercheck.model import Status
from clustercheck.remote import gpuburn
from clustercheck.stages import bundle


def test_the_program_says_when_there_is_no_cuda_gpu_and_the_checks_skip_with_that_reason(tmp_path):
    pyz = bundle.write(tmp_path)
    proc = subprocess.run(
        [sys.executable, pyz, "gpuburn", "--seconds", "1"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    if torch.cuda.is_available():  # a GPU machine: every GPU loaded and hashed
        assert answer["cuda"] is True and all(g["hash_before"] == g["hash_after"] for g in answer["gpus"]), answer
        return
    assert answer == {"cuda": False, "reason": answer["reason"], "gpus": [], "torch": torch.__version__}
    assert answer["reason"].endswith("no GPU to measure")
    facts_burn = GpuBurn.from_answer(answer)
    assert facts_burn.problem == answer["reason"]
    from clustercheck.checks import registry
    from clustercheck.facts.model import NodeFacts
    from clustercheck.inventory import Node

    facts = NodeFacts(Node("n1", "10.0.0.1"), "python3", "test", gpu_burn=facts_burn)
    for name in checks.NAMES:
        assert registry.get(name).function(facts).message == answer["reason"]


def test_a_bad_length_is_one_line_on_standard_error_and_exit_2(tmp_path):
    pyz = bundle.write(tmp_path)
    proc = subprocess.run([sys.executable, pyz, "gpuburn", "--seconds", "0"], capture_output=True, text=True)
    assert proc.returncode == 2 and "must be positive" in proc.stderr


def loaded(devices: list[str], seconds: float = 0.3) -> dict:
    """Every device of DEVICES under load at once, one thread each, as the program's threads load the GPUs. The CPU
    stands in for the GPUs with one thread of its own: a CPU multiply split over several threads may sum in another
    order when two callers share the pool (seen on a busy CI machine), where a GPU's cuBLAS gives the same bytes on
    GPUs of one model."""
    gpuburn.deterministic(torch)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _loaded(devices, seconds)
    finally:
        torch.set_num_threads(threads_before)


def _loaded(devices: list[str], seconds: float) -> dict:
    out: dict = {}

    def thread(index: int, device: str) -> None:
        out[index] = entry = {"index": index, "bus_id": None, "name": f"{device} device"}
        gpuburn.load(torch, torch.device(device), 32, seconds, entry)

    threads = [threading.Thread(target=thread, args=(i, d)) for i, d in enumerate(devices)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads)
    return out


def test_every_device_runs_the_load_and_gives_the_same_fixed_result():
    out = loaded(["cpu", "cpu"])
    for entry in out.values():
        assert entry["iterations"] > 0 and entry["tflops"] > 0 and "error" not in entry, entry
        assert entry["hash_before"] == entry["hash_after"] == out[0]["hash_before"]
    burn = GpuBurn.from_answer({"cuda": True, "seconds": 0.3, "fixed": gpuburn.FIXED, "gpus": list(out.values())})
    found = checks.judge_sdc(burn)
    assert found.status is Status.PASS, found.message
    assert found.message == (
        "2 GPU(s) gave the same result before and after the load, the load's product alike in 2 check(s) during it, "
        "2 compared with their peers of the same model"
    )
    assert out[0]["load_hash"] == out[1]["load_hash"] and out[0]["load_mismatches"] == 0  # one seed, one product


def test_a_device_that_fails_has_its_error_and_the_others_go_on():
    out = loaded(["cpu", "meta"])  # a meta tensor has no data: its result cannot be read back
    assert "error" not in out[0] and out[0]["iterations"] > 0
    assert out[1]["error"].startswith("NotImplementedError"), out[1]


def test_without_nvidia_smi_the_samples_say_why():
    if shutil.which("nvidia-smi"):
        return  # a GPU machine answers
    fields, why = gpuburn.first_fields()
    assert fields is None and why == "nvidia-smi not found"
    sampler = gpuburn.Sampler(gpuburn.QUERY, 0.05, 0.0)
    sampler.start()
    sampler.done.wait(0.2)
    stopped = sampler.stop()
    assert stopped["samples"] == [] and stopped["errors"] == ["nvidia-smi not found"]
    assert (
        GpuBurn.from_answer({"cuda": True, "gpus": [{"index": 0}], "smi": stopped, "xids": {}}).smi_problem
        == "nvidia-smi not found"
    )
