"""benchmarks/gpu_figures.py, the comparison of gpubench's figures with torch's own timing: without a CUDA GPU it
says so in one line and exits 2 (nothing measured is never a pass); its figures count what gpubench counts."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_figures.py"


def gpu_figures():
    spec = importlib.util.spec_from_file_location("gpu_figures", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_a_cuda_gpu_it_says_so_in_one_line_and_exits_2(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU: the benchmark measures it")
    assert gpu_figures().main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpu_figures: torch ") and "no GPU to measure" in err, err


def test_the_copy_loop_counts_every_byte_read_and_written_as_gpubench_does(monkeypatch):
    torch = pytest.importorskip("torch")
    module = gpu_figures()
    assert module.gpubench.COPY_COUNTS == "read+written"
    clock = iter([10.0, 12.0])  # the loop took 2 s
    monkeypatch.setattr(module.time, "perf_counter", lambda: next(clock))
    # 4 copies of 1 MiB, each read and written: 8 MiB in 2 s
    assert module.torch_copy_gbps(torch, torch.device("cpu"), 1, loops=4) == pytest.approx(8 * 2**20 / 2 / 1e9)
