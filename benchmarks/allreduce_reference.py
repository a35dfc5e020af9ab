"""A plain torch.distributed all_reduce timing loop: the reference the bandwidth benchmark holds clustercheck's
busbw against. It runs on the nodes under torchrun (torch and the standard library only, Python 3.8+) and shares
no code with clustercheck.

nccl-tests' definitions (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md): for each size S in
bytes, WARMUP untimed calls, then ITERS timed calls; each rank's time t is the mean time per call, and the reported
time is the average over ranks (all_reduce_perf's default, `-a 1`); algbw = S / t, and for all_reduce
busbw = algbw * 2(n-1)/n over n ranks. GB/s are 1e9 bytes per second, as nccl-tests prints them.

    torchrun ... allreduce_reference.py --sizes 65536,131072 --warmup 2 --iters 5 --backend gloo --out FILE

Rank 0 writes the rows to FILE as JSON: [{"bytes", "time_us", "algbw_gbps", "busbw_gbps"}, ...], and beside
them the busbw from the slowest rank's time (all_reduce_perf's `-a 3`), to tell that choice from other differences.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def algbw(size_bytes: int, seconds: float) -> float:
    """nccl-tests' algorithm bandwidth, GB/s: S / t."""
    return size_bytes / seconds / 1e9


def allreduce_busbw(algbw_gbps: float, ranks: int) -> float:
    """nccl-tests' bus bandwidth of all_reduce: algbw * 2(n-1)/n."""
    return algbw_gbps * 2 * (ranks - 1) / ranks


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", required=True, help="message sizes in bytes, comma-separated")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import torch
    import torch.distributed as dist

    if args.backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend=args.backend)
    ranks = dist.get_world_size()

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        data = torch.zeros(size // 4, dtype=torch.float32, device=device)  # float32: 4 bytes per element
        for _ in range(args.warmup):
            dist.all_reduce(data)
        synchronize()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(data)
        synchronize()
        mine = (time.perf_counter() - start) / args.iters
        total = torch.tensor([mine], dtype=torch.float64, device=device)
        slowest = total.clone()
        dist.all_reduce(total)  # sum over ranks, then the average
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # all_reduce_perf -a 3, for comparison
        seconds = total.item() / ranks
        bw = algbw(size, seconds)
        rows.append(
            {
                "bytes": size,
                "time_us": seconds * 1e6,
                "algbw_gbps": bw,
                "busbw_gbps": allreduce_busbw(bw, ranks),
                "busbw_slowest_rank_gbps": allreduce_busbw(algbw(size, slowest.item()), ranks),
            }
        )
    if dist.get_rank() == 0:
        with open(args.out, "w") as fh:
            json.dump({"ranks": ranks, "warmup": args.warmup, "iters": args.iters, "rows": rows}, fh)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # gloo can abort in interpreter teardown after the work is done
