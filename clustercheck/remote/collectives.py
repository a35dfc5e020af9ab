"""Collective correctness and all_reduce bandwidth worker, run under torchrun on every node.

Standard library and torch only, started by torchrun with the node's own environment python. Every rank
checks its own results against known values and writes one JSON line to
OUT_DIR/rank-<rank>.json, counting wrong elements like nccl-tests' #wrong.

Then an all_reduce bandwidth sweep over message sizes by powers of two, with
warm-up and timed iterations, in nccl-tests' terms: algbw = bytes / time and
busbw = algbw * 2(n-1)/n, where time is the slowest rank's mean time per call.
The timed calls are made in --repeats timed repetitions (each the slowest rank's
mean time per call in it), so that the controller knows the figure's noise: the
median and spread of the repetitions, which a baseline comparison allows for.
On multi-GPU nodes of a multi-node job the same sweep also runs inside each
node (a group of the node's local ranks), for intra-node bandwidth.
"""

from __future__ import annotations

import argparse
import os
import socket
import time
import zlib

from . import fabricpairs
from .common import exit_now, progress, rank_identity, run_rank, start_process_group
from .endpoints import tcp_endpoints


def count_wrong(actual, expected) -> int:
    return int((actual != expected).sum().item())


def run_checks(torch, dist, device, elements: int, group=None) -> dict:
    """The collectives across every rank, or across GROUP's (a node's own ranks in a job over several nodes)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    dtype = torch.float64 if device.type == "cpu" else torch.float32
    results = {}

    # all_reduce: rank r contributes (r + 1) * (i % 7 + 1) at index i; the sum is known in closed form.
    pattern = (torch.arange(elements, device=device, dtype=dtype) % 7) + 1
    tensor = pattern * (rank + 1)
    progress(1, "allreduce")
    dist.all_reduce(tensor, group=group)
    results["allreduce"] = {"wrong": count_wrong(tensor, pattern * (world * (world + 1) / 2)), "elements": elements}

    # all_gather: slot s must hold rank s's tensor.
    mine = torch.full((elements,), float(rank), device=device, dtype=dtype)
    gathered = [torch.empty_like(mine) for _ in range(world)]
    progress(2, "allgather")
    dist.all_gather(gathered, mine, group=group)
    results["allgather"] = {
        "wrong": sum(count_wrong(t, torch.full_like(t, float(s))) for s, t in enumerate(gathered)),
        "elements": elements * world,
    }

    # broadcast from the last rank: every rank must end with its values.
    src = world - 1
    values = pattern * 3 if rank == src else torch.zeros(elements, device=device, dtype=dtype)
    progress(3, "broadcast")
    dist.broadcast(values, src=src if group is None else dist.get_global_rank(group, src), group=group)
    results["broadcast"] = {"wrong": count_wrong(values, pattern * 3), "elements": elements}
    return results


GPU_SIZES = (1 << 20, 1 << 30)  # 1 MiB .. 1 GiB, nccl-tests' usual range
CPU_SIZES = (1 << 16, 1 << 22)  # 64 KiB .. 4 MiB: gloo on CPUs is slow, and ranks share cores


def sizes_between(low: int, high: int) -> list[int]:
    """Powers of two from LOW to HIGH bytes (LOW rounded up to a power of two)."""
    size = 1
    while size < low:
        size <<= 1
    sizes = []
    while size <= high:
        sizes.append(size)
        size <<= 1
    return sizes


def bus_factor(n: int) -> float:
    """all_reduce moves 2(n-1)/n of the data per rank in a ring: nccl-tests' busbw factor."""
    return 2 * (n - 1) / n if n > 1 else 1.0


def sweep(torch, dist, device, sizes: list[int], warmup: int, iters: int, group=None, repeats: int = 1) -> list[dict]:
    """Time all_reduce (sum, float32) per size; every member of GROUP gets the same numbers. The ITERS timed calls
    are made in REPEATS repetitions (ITERS rounded up to a multiple), each timed on its own (rep_time_us: the
    slowest rank's mean time per call in it); time_us is the mean of all, nccl-tests' figure."""
    n = dist.get_world_size(group)
    repeats = max(1, repeats)
    per_repeat = max(1, -(-iters // repeats))
    results = []
    for step, size in enumerate(sizes, 1):
        progress(step, f"all_reduce sweep{'' if group is None else ' on the node'}, {size} bytes")
        tensor = torch.zeros(size // 4, dtype=torch.float32, device=device)  # sums stay finite over the calls
        for _ in range(warmup):
            dist.all_reduce(tensor, group=group)
        times = []
        for _ in range(repeats):
            times.append(_timed(torch, dist, device, tensor, per_repeat, group))
        elapsed = torch.tensor(times, dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)  # the slowest rank sets the pace
        reps = [float(t) for t in elapsed.tolist()]
        seconds = sum(reps) / len(reps)
        algbw = size / seconds / 1e9 if seconds > 0 else 0.0
        results.append(
            {
                "bytes": size,
                "time_us": round(seconds * 1e6, 3),
                "algbw_gbps": algbw,
                "busbw_gbps": algbw * bus_factor(n),
                "rep_time_us": [round(t * 1e6, 3) for t in reps],
                "calls_per_rep": per_repeat,
            }
        )
        del tensor
    return results


def _timed(torch, dist, device, tensor, calls: int, group) -> float:
    """This rank's mean seconds per all_reduce over CALLS calls, started together (a barrier)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier(group=group)
    started = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(tensor, group=group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - started) / calls


def node_groups(torch, dist, device, node_key: int) -> tuple[list[list[int]], int]:
    """The global ranks of every node (grouped by NODE_KEY), and the index of this rank's node."""
    mine = torch.tensor([node_key], dtype=torch.int64, device=device)
    gathered = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)  # not all_gather_object: it needs numpy, which nodes may lack
    keys = [int(t.item()) for t in gathered]
    order = sorted(set(keys), key=keys.index)
    groups = [[r for r, k in enumerate(keys) if k == key] for key in order]
    return groups, order.index(node_key)


def run_bandwidth(torch, dist, device, args, local_world: int) -> dict:
    low, high = GPU_SIZES if device.type == "cuda" else CPU_SIZES
    sizes = sizes_between(args.min_bytes or low, args.max_bytes or high)
    warmup = args.warmup if args.warmup is not None else (5 if device.type == "cuda" else 2)
    iters = args.iters if args.iters is not None else (20 if device.type == "cuda" else 10)
    repeats = args.repeats
    result = {
        "sizes": sizes,
        "warmup": warmup,
        "iters": iters,
        "repeats": repeats,
        "world": sweep(torch, dist, device, sizes, warmup, iters, repeats=repeats),
    }
    groups, mine = node_groups(torch, dist, device, node_key())
    intra = args.intra_node == "always" or (
        args.intra_node == "auto" and device.type == "cuda" and len(groups) > 1 and local_world > 1
    )
    if intra and all(len(g) > 1 for g in groups):
        result["intra_node"] = {
            "node_index": mine,
            "ranks": groups[mine],
            "results": sweep(
                torch, dist, device, sizes, warmup, iters, group=node_group(dist, groups, mine), repeats=repeats
            ),
        }
    return result


def node_key() -> int:
    """This rank's node, as a number: torchrun's GROUP_RANK (the node rank); the hostname's checksum without it."""
    return int(os.environ.get("GROUP_RANK", zlib.crc32(socket.gethostname().encode())))


def node_group(dist, groups: list[list[int]], mine: int):
    """The process group of this rank's node (GROUPS: every node's ranks, node_groups; MINE: this rank's node):
    every rank creates every node's group, in the same order, as torch asks."""
    return [dist.new_group(ranks=g) for g in groups][mine]


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    parser.add_argument("--elements", type=int, default=1 << 16)
    parser.add_argument("--no-bandwidth", dest="bandwidth", action="store_false", help="correctness only")
    parser.add_argument("--min-bytes", type=int, default=None, help="smallest message (default 1 MiB GPU, 64 KiB CPU)")
    parser.add_argument("--max-bytes", type=int, default=None, help="largest message (default 1 GiB GPU, 4 MiB CPU)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls per size (default 5 GPU, 2 CPU)")
    parser.add_argument("--iters", type=int, default=None, help="timed calls per size (default 20 GPU, 10 CPU)")
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed repetitions the calls are split into (their median and spread)"
    )
    parser.add_argument(
        "--intra-node",
        choices=["auto", "always", "never"],
        default="auto",
        help="also sweep inside each node (auto: on multi-GPU nodes of a multi-node job)",
    )
    fabricpairs.add_arguments(parser)
    return parser


def part(args, torch, dist, device, record: dict) -> None:
    """The collectives and the bandwidth sweep across every rank of the process group, into RECORD."""
    record.update(
        world_size=dist.get_world_size(),
        backend=args.backend,
        torch=torch.__version__,
        checks=run_checks(torch, dist, device, args.elements),
    )
    if args.bandwidth:
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        record["bandwidth"] = run_bandwidth(torch, dist, device, args, local_world)
        groups, mine = node_groups(torch, dist, device, node_key())
        if args.pair_rounds and len(groups) > 1:
            world = record["bandwidth"]["world"]
            busbw = max(row["busbw_gbps"] for row in world) if world else None
            record["fabric"] = fabricpairs.run(torch, dist, device, args, groups, mine, busbw)
    record["endpoints"] = tcp_endpoints()  # the addresses the backend's sockets really bound to
    dist.barrier()


def local_part(args, torch, dist, device, record: dict) -> None:
    """The collectives across this rank's node's own ranks only (the node-local checks, local.*), in a job over
    several nodes: the node's group's size and this rank's place in it go into RECORD (group_rank)."""
    groups, mine = node_groups(torch, dist, device, node_key())
    group = node_group(dist, groups, mine)
    record.update(
        world_size=len(groups[mine]),
        group_rank=dist.get_rank(group),
        backend=args.backend,
        torch=torch.__version__,
        checks=run_checks(torch, dist, device, args.elements, group),
    )
    dist.barrier()


def main() -> int:
    args = parser().parse_args()
    record = rank_identity()

    def work(record: dict) -> None:
        import torch
        import torch.distributed as dist

        device = start_process_group(torch, dist, args.backend, record["local_rank"])
        part(args, torch, dist, device, record)
        dist.destroy_process_group()

    return run_rank(args.out, record, work)


if __name__ == "__main__":
    exit_now(main())
