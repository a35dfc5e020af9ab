#!/usr/bin/env python3
"""gpubench's figures against torch's own timing of the same work, on this machine's GPUs (issue: each within 5 %).

    benchmarks/gpu_figures.py [--gpu INDEX] [--rounds 5] [--matmul-n 8192] [--copy-mib 1024] [--json FILE]
    benchmarks/gpu_figures.py --cpu [--matmul-n 1024] [--copy-mib 64]   (the plumbing, on this machine's CPU)

Per GPU, in alternating rounds (gpubench first, then torch, then the other way round), medians over the rounds:
- the dense multiply: gpubench's `matmul_tflops_median` (the median of its repeats, CUDA events: like for like with
  torch's median; the best, which the checks judge, is the other figure gpubench gives) against
  `torch.utils.benchmark.Timer("torch.mm(a, b, out=out)").blocked_autorange()` on the same N x N bf16 matrices
  (its median time per call), both as 2 N^3 / seconds;
- device memory bandwidth: gpubench's `memory_gbps_median` against a plain torch loop of `dst.copy_(src)` over the same
  number of bytes, timed with the wall clock around torch.cuda.synchronize(), both counting every byte read and
  written (gpubench's COPY_COUNTS).
It prints each figure, the ratio gpubench / torch and whether it is within 5 %; exit 0 when every figure is, 1 when
one is not, 2 when there is nothing to measure (no CUDA GPU, said in one line). With --cpu the same comparison runs
on the CPU (gpubench's Timer falls back to the wall clock there): it proves the benchmark's plumbing, not a GPU.
The levels' times per node are `benchmarks/node_health.py` (level 1) and `clustercheck run --only core` with and
without gpubench (the standard level's per-GPU part); docs/benchmarks.md has the figures where a GPU was at hand.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clustercheck.remote import gpubench

TOLERANCE = 0.05


def torch_matmul_tflops(torch, device, n: int) -> float:
    """torch.utils.benchmark's median time of one N x N bf16 (fp32 on a CPU) multiply, as TFLOP/s."""
    from torch.utils import benchmark

    kind = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=kind)
    b = torch.randn(n, n, device=device, dtype=kind)
    out = torch.empty(n, n, device=device, dtype=kind)
    timer = benchmark.Timer("torch.mm(a, b, out=out)", globals={"torch": torch, "a": a, "b": b, "out": out})
    return 2 * n**3 / timer.blocked_autorange(min_run_time=1.0).median / 1e12


def torch_copy_gbps(torch, device, mib: int, loops: int = 20) -> float:
    """A plain loop of dst.copy_(src) over MIB MiB, every byte read and written counted, as GB/s."""
    size = mib * 2**20
    src = torch.empty(size, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    sync()
    began = time.perf_counter()
    for _ in range(loops):
        dst.copy_(src)
    sync()
    return 2 * size * loops / (time.perf_counter() - began) / 1e9


def gpubench_matmul(torch, device, sizes: gpubench.Sizes) -> float:
    """gpubench's median multiply figure (the median of its repeats, as torch's Timer takes a median)."""
    if device.type == "cuda":
        return gpubench.matmul_tflops(torch, device, "bf16", sizes)[1]
    return gpubench.matmul_tflops(torch, device, "fp32", sizes)[1]  # a CPU has no fast bf16 multiply to compare


def compare(torch, device, sizes: gpubench.Sizes, rounds: int) -> dict:
    """The medians over ROUNDS alternating rounds, and their ratios."""
    ours = {"matmul_tflops": [], "memory_gbps": []}
    theirs = {"matmul_tflops": [], "memory_gbps": []}
    for round_ in range(rounds):
        pairs = [
            (ours, lambda: (gpubench_matmul(torch, device, sizes), gpubench.memory_gbps(torch, device, sizes)[1])),
            (
                theirs,
                lambda: (
                    torch_matmul_tflops(torch, device, sizes.matmul_n),
                    torch_copy_gbps(torch, device, sizes.copy_mib),
                ),
            ),
        ]
        for figures, measure in pairs if round_ % 2 == 0 else reversed(pairs):
            matmul, memory = measure()
            figures["matmul_tflops"].append(matmul)
            figures["memory_gbps"].append(memory)
    result = {}
    for name in ours:
        mine, torch_own = statistics.median(ours[name]), statistics.median(theirs[name])
        ratio = mine / torch_own
        result[name] = {"gpubench": mine, "torch": torch_own, "ratio": ratio, "within": abs(ratio - 1) <= TOLERANCE}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", type=int, default=None, help="one GPU's index (default: every GPU, one at a time)")
    parser.add_argument("--cpu", action="store_true", help="compare on the CPU: the benchmark's plumbing only")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--matmul-n", type=int, default=None, help="N of the N x N multiply (8192; 1024 with --cpu)")
    parser.add_argument("--copy-mib", type=int, default=None, help="MiB copied (1024; 64 with --cpu)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures as JSON to this file")
    args = parser.parse_args(argv)
    import torch

    sizes = gpubench.Sizes(
        matmul_n=args.matmul_n or (1024 if args.cpu else 8192), copy_mib=args.copy_mib or (64 if args.cpu else 1024)
    )
    if args.cpu:
        devices = [torch.device("cpu")]
    else:
        why = gpubench.no_cuda(torch)
        if why:
            print(f"gpu_figures: {why} (--cpu compares on the CPU)", file=sys.stderr)
            return 2
        indices = [args.gpu] if args.gpu is not None else range(torch.cuda.device_count())
        devices = [torch.device("cuda", i) for i in indices]
    results, ok = {}, True
    for device in devices:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
        figures = compare(torch, device, sizes, args.rounds)
        results[str(device)] = {"name": name, **figures}
        for figure, f in figures.items():
            ok &= f["within"]
            verdict = "within 5 %" if f["within"] else "NOT within 5 %"
            print(f"{device} ({name}) {figure}: gpubench {f['gpubench']:.4g}, torch {f['torch']:.4g}, "
                  f"ratio {f['ratio']:.3f}: {verdict}")  # fmt: skip
    if args.json:
        args.json.write_text(
            json.dumps({"torch": torch.__version__, "sizes": vars(sizes), "devices": results}, indent=1)
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
