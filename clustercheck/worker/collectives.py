"""Collective correctness worker, run under torchrun on every node.

Self-contained (standard library and torch only): clustercheck copies this file
to the node and starts it with the node's own environment python. Every rank
checks its own results against known values and writes one JSON line to
OUT_DIR/rank-<rank>.json, counting wrong elements like nccl-tests' #wrong.
"""

import argparse
import json
import os
import socket
import sys
import time
import traceback


def count_wrong(actual, expected) -> int:
    return int((actual != expected).sum().item())


def run_checks(torch, dist, device, elements: int) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = torch.float64 if device.type == "cpu" else torch.float32
    results = {}

    # all_reduce: rank r contributes (r + 1) * (i % 7 + 1) at index i; the sum is known in closed form.
    pattern = (torch.arange(elements, device=device, dtype=dtype) % 7) + 1
    tensor = pattern * (rank + 1)
    dist.all_reduce(tensor)
    results["allreduce"] = {"wrong": count_wrong(tensor, pattern * (world * (world + 1) / 2)), "elements": elements}

    # all_gather: slot s must hold rank s's tensor.
    mine = torch.full((elements,), float(rank), device=device, dtype=dtype)
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    results["allgather"] = {
        "wrong": sum(count_wrong(t, torch.full_like(t, float(s))) for s, t in enumerate(gathered)),
        "elements": elements * world,
    }

    # broadcast from the last rank: every rank must end with its values.
    src = world - 1
    values = pattern * 3 if rank == src else torch.zeros(elements, device=device, dtype=dtype)
    dist.broadcast(values, src=src)
    results["broadcast"] = {"wrong": count_wrong(values, pattern * 3), "elements": elements}
    return results


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    parser.add_argument("--elements", type=int, default=1 << 16)
    args = parser.parse_args()

    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    record = {"rank": rank, "local_rank": local_rank, "host": socket.gethostname(), "ok": False}
    started = time.monotonic()
    try:
        import torch
        import torch.distributed as dist

        if args.backend == "nccl":
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
        else:
            device = torch.device("cpu")
        dist.init_process_group(backend=args.backend)
        record.update(
            world_size=dist.get_world_size(),
            backend=args.backend,
            torch=torch.__version__,
            checks=run_checks(torch, dist, device, args.elements),
        )
        dist.barrier()
        dist.destroy_process_group()
        record["ok"] = True
    except Exception as exc:  # reported to the controller, not raised: the rank's error is the result
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["traceback"] = traceback.format_exc(limit=5)
    record["seconds"] = round(time.monotonic() - started, 3)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank-{rank}.json"), "w") as fh:
        json.dump(record, fh)
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
