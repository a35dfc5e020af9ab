"""Every GPU on its own clock, without CUDA: the node-side programs' threads (remote/gputhreads.py, gpubench's phases,
gpuburn's samples and load) driven with fakes: a worker that hangs given as a callable, a torch stand-in for the TF32
setting, a fake nvidia-smi on PATH that cannot read one GPU. Before, gpubench and gpuburn joined their threads and
waited on a threading.Barrier without a timeout (a hung GPU stalled the program to the controller's deadline and
every GPU's figures were lost), and a sample where nvidia-smi exited non-zero was dropped whole."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
from wording import says

from clustercheck.facts.burn import GpuBurn
from clustercheck.remote import gpubench, gpuburn, gputhreads

# nvidia-smi 610.57.04 with one GPU fallen off the bus: the line it printed for that GPU (tests/unit/data/README.md)
UNREADABLE = "Unable to determine the device handle for GPU1: 0000:34:00.0: Unknown Error"


def test_a_gpu_that_hangs_is_named_with_its_phase_and_the_others_are_kept():
    stuck = threading.Event()

    def work(index: int, entry: dict) -> None:
        entry["bus_id"] = f"00000000:{0x18 + index:02X}:00.0"
        entry["phase"] = "tf32 multiply"
        if index == 1:
            stuck.wait(30)  # a CUDA call that never returns
        entry["tflops"] = 700.0

    began = time.monotonic()
    out, hung = gputhreads.run_each(3, work, deadline=0.5)
    stuck.set()
    assert time.monotonic() - began < 5  # the deadline, not the hung thread, ends the wait
    assert hung == [1]
    assert out[1] == {"index": 1, "bus_id": "00000000:19:00.0", "name": None, "phase": "tf32 multiply", "hung": True}
    assert out[0]["tflops"] == out[2]["tflops"] == 700.0 and "phase" not in out[0] and "hung" not in out[2]


def test_a_gpu_whose_work_raises_keeps_its_error_and_the_phase_it_failed_in():
    def work(index: int, entry: dict) -> None:
        entry["phase"] = "allocating the load's matrices"
        raise RuntimeError("CUDA error: out of memory\nmore")

    out, hung = gputhreads.run_each(1, work, deadline=5)
    assert hung == [] and out[0]["error"] == "RuntimeError: CUDA error: out of memory"  # verbatim: its first line
    assert out[0]["phase"] == "allocating the load's matrices"  # verbatim: the phase the work set


def fake_torch(**matmul) -> SimpleNamespace:
    return SimpleNamespace(backends=SimpleNamespace(cuda=SimpleNamespace(matmul=SimpleNamespace(**matmul))))


def test_tf32_is_set_through_fp32_precision_where_torch_has_it_and_allow_tf32_on_an_older_torch():
    new = fake_torch(fp32_precision="ieee")
    assert gpubench.set_tf32(new, True) == "torch.backends.cuda.matmul.fp32_precision"
    assert new.backends.cuda.matmul.fp32_precision == "tf32"
    gpubench.set_tf32(new, False)
    assert new.backends.cuda.matmul.fp32_precision == "ieee" and not hasattr(new.backends.cuda.matmul, "allow_tf32")
    old = fake_torch(allow_tf32=False)
    assert gpubench.set_tf32(old, True) == "torch.backends.cuda.matmul.allow_tf32"
    assert old.backends.cuda.matmul.allow_tf32 is True


def test_the_tf32_override_variables_are_recorded_as_the_node_has_them(monkeypatch):
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    monkeypatch.delenv("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", raising=False)
    assert gpubench.tf32_overrides() == {"NVIDIA_TF32_OVERRIDE": "0", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": None}


def test_gpubench_s_phases_go_on_without_a_hung_gpu_and_run_the_tf32_phases_one_at_a_time():
    """Three GPUs; GPU 2 hangs in its bf16 multiply. The other two wait for it at the next phase at most the
    phase's wait, then measure alone: each TF32 phase with its own setting, never two at once."""
    torch = fake_torch(fp32_precision="ieee")
    phases = gpubench.Phases(torch, 3, wait=0.3)
    stuck, inside, overlap = threading.Event(), [], []
    lock = threading.Lock()

    def plan(torch_, device, sizes, phases_, figures):
        def work(name: str, tf32):
            def run() -> None:
                if device == 2:
                    stuck.wait(30)
                with lock:  # two phases that need a TF32 setting at once, once the GPUs are apart: a wrong setting
                    if tf32 is not None and phases.apart and inside:
                        overlap.append(name)
                    if tf32 is not None:
                        inside.append(device)
                    setting = torch.backends.cuda.matmul.fp32_precision
                if tf32 is not None:
                    assert setting == ("tf32" if tf32 else "ieee"), (name, setting)
                time.sleep(0.02)
                with lock:
                    if tf32 is not None:
                        inside.remove(device)
                figures.setdefault("done", []).append(name)

            return run

        return [(name, tf32, work(name, tf32)) for name, tf32 in gpubench_plan()]

    def gpubench_plan():
        return [("bf16 multiply", False), ("tf32 multiply", True), ("fp32 multiply", False), ("memory copy", None)]

    def work(index: int, entry: dict) -> None:
        gpubench.measure(torch, index, None, phases, entry, plan=plan)

    out, hung = gputhreads.run_each(3, work, deadline=1.5)
    stuck.set()
    assert hung == [2] and out[2]["phase"] == "bf16 multiply"
    assert phases.apart and not overlap
    for index in (0, 1):
        assert out[index]["done"] == ["bf16 multiply", "tf32 multiply", "fp32 multiply", "memory copy"]


def test_a_gpu_that_hangs_in_its_host_copy_does_not_hang_the_others_waiting_for_their_turn():
    phases = gpubench.Phases(fake_torch(fp32_precision="ieee"), 2, wait=0.2)
    stuck = threading.Event()

    def work(index: int, entry: dict) -> None:
        entry["phase"] = "host copies"
        if index == 0:
            time.sleep(0.05)  # GPU 1 takes its turn first, and hangs in it
        with phases.holding(phases.turn, "host copy"):
            if index == 1:
                stuck.wait(30)
            entry["h2d_gbps"] = 55.0

    out, hung = gputhreads.run_each(2, work, deadline=1.5)
    stuck.set()
    assert hung == [1]
    assert says(out[0]["error"], "TimeoutError", "host copy", "0.2 s")


def test_the_timer_gives_the_median_beside_the_best():
    torch = pytest.importorskip("torch")
    clock = iter([0.0, 1.0, 1.0, 4.0, 4.0, 6.0])  # three timed calls of 1, 3 and 2 s
    timer = gpubench.Timer(torch, torch.device("cpu"))
    real = gpubench.time.perf_counter
    try:
        gpubench.time.perf_counter = lambda: next(clock)
        best, middle = timer.best(lambda: None, 3)
    finally:
        gpubench.time.perf_counter = real
    assert (best, middle) == (1.0, 2.0)


@pytest.fixture
def smi_on_path(tmp_path, monkeypatch):
    """A fake nvidia-smi that prints GPU 0's and GPU 2's lines, and for GPU 1 what nvidia-smi 610 printed for a GPU
    it could not reach, then exits 15."""
    line = "0, 00000000:18:00.0, 1980, 1980, 59, 631.95, 700.00, 0x0000000000000000, 0, 0, 1024"
    other = line.replace("0, 00000000:18:00.0", "2, 00000000:1A:00.0", 1)
    script = tmp_path / "nvidia-smi"
    script.write_text(f"#!/bin/sh\necho '{line}'\necho '{UNREADABLE}' >&2\necho '{other}'\nexit 15\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    return script


def test_a_sample_that_fails_for_one_gpu_keeps_the_others_and_names_that_one(smi_on_path):
    answer = gpuburn.sample(gpuburn.QUERY)
    assert says(answer["error"], "nvidia-smi exit 15", UNREADABLE)
    assert len(answer["lines"]) == 3 and UNREADABLE in answer["lines"]
    burn = GpuBurn.from_answer(
        {
            "cuda": True,
            "seconds": 60,
            "gpus": [{"index": 0}],
            "smi": {"fields": list(gpuburn.QUERY), "samples": [{"t": 20.0, **answer}]},
        }
    )
    assert [s.bus_id for s in burn.samples] == ["00000000:18:00.0", "00000000:1A:00.0"]
    (problem,) = burn.sample_problems
    assert (problem.bus_id, problem.text) == ("00000000:34:00.0", UNREADABLE)  # verbatim: nvidia-smi's line


def test_the_load_records_its_start_and_end_on_the_samples_clock_and_checks_its_product():
    torch = pytest.importorskip("torch")
    gpuburn.deterministic(torch)
    entries = []
    began = time.monotonic()
    for _ in range(2):
        entry: dict = {}
        gpuburn.load(torch, torch.device("cpu"), 16, 0.05, entry, began)
        entries.append(entry)
    first, second = entries
    assert "error" not in first and first["phase"] == "done"
    assert 0 <= first["load_began"] <= first["load_ended"] <= second["load_began"]
    assert first["load_checks"] >= 1 and first["load_mismatches"] == 0
    assert first["load_hash"] == second["load_hash"] and len(first["load_hash"]) == 64  # the seed fixes the product


def test_the_programs_leave_without_waiting_for_a_hung_thread(capsys, monkeypatch):
    left = []
    monkeypatch.setattr(gputhreads.os, "_exit", left.append)
    assert gputhreads.leave("{}", []) == 0 and left == []
    gputhreads.leave('{"gpus": []}', [3])
    assert left == [0] and capsys.readouterr().out.splitlines()[-1] == '{"gpus": []}'
