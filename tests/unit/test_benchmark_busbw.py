"""The bandwidth benchmark's reference (benchmarks/allreduce_reference.py) computes nccl-tests' algbw and busbw
(doc/PERFORMANCE.md of NVIDIA/nccl-tests), and agrees with clustercheck's own sweep where both are defined."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from clustercheck.remote import collectives as worker

REFERENCE = Path(__file__).resolve().parents[2] / "benchmarks" / "allreduce_reference.py"


def reference():
    spec = importlib.util.spec_from_file_location("allreduce_reference", REFERENCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # torch is imported only when it runs
    return module


def test_algbw_is_size_over_time_in_gb_per_s():
    ref = reference()
    assert ref.algbw(4 << 20, 0.004194304) == pytest.approx(1.0)  # 4 MiB in 4.19 ms: 1e9 bytes/s
    assert ref.algbw(1 << 30, 0.1) == pytest.approx(10.737418240)


@pytest.mark.parametrize(("ranks", "factor"), [(2, 1.0), (4, 1.5), (6, 10 / 6), (8, 1.75), (16, 1.875)])
def test_allreduce_busbw_is_algbw_times_2_n_minus_1_over_n(ranks, factor):
    assert reference().allreduce_busbw(10.0, ranks) == pytest.approx(10.0 * factor)


@pytest.mark.parametrize("ranks", range(2, 33))
def test_reference_and_clustercheck_use_the_same_factor(ranks):
    """On the same time and size, the benchmark's reference and clustercheck's sweep give the same busbw."""
    size, seconds = 1 << 22, 0.0123
    ours = size / seconds / 1e9 * worker.bus_factor(ranks)  # as remote/collectives.sweep computes it
    ref = reference()
    assert ref.allreduce_busbw(ref.algbw(size, seconds), ranks) == pytest.approx(ours)
