"""DDP equivalence worker, run under torchrun on every node (standard library and torch only).

The task is a deterministic synthetic classification problem: seeded data, an MLP without dropout or
batchnorm, plain SGD with momentum. Global rank 0 first trains a reference model alone, in one process, on
the full global batch for K steps. Then every rank trains a DDP copy of the same model, each on its slice
of the same global batches (DistributedSampler with the same seed: rank r takes every W-th sample of
each global batch), for the same K steps. Every rank records the global loss per step and a hash of its
parameters after every step; rank 0 also records the reference curve, the parameter differences and the
held-out accuracies. Each rank writes OUT/rank-<rank>.json; the controller compares (clustercheck/checks/ddp.py).

float64 on CPUs; float32 on GPUs with TF32 off and deterministic algorithms.

"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

from .common import exit_now, progress, rank_identity, run_rank

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts: deterministic cuBLAS


def make_data(torch, seed: int, samples: int, features: int, classes: int):
    """Gaussian inputs; labels from a fixed random linear teacher plus a nonlinearity, all seeded on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    teacher = torch.randn(features, classes, generator=gen, dtype=torch.float64)
    x = torch.randn(samples, features, generator=gen, dtype=torch.float64)
    y = (torch.tanh(x) @ teacher + 0.1 * torch.randn(samples, classes, generator=gen, dtype=torch.float64)).argmax(1)
    return x, y


def make_model(torch, seed: int, features: int, hidden: int, classes: int, dtype, device):
    torch.manual_seed(seed)
    nn = torch.nn
    model = nn.Sequential(
        nn.Linear(features, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, classes)
    )
    return model.to(device=device, dtype=dtype)


def param_hash(model) -> str:
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(_tensor_bytes(p))
    return digest.hexdigest()[:16]


def _tensor_bytes(tensor) -> bytes:
    # Without numpy: view the raw storage as bytes through torch itself.
    import torch

    flat = tensor.detach().cpu().contiguous().view(-1)
    return bytes(flat.view(torch.uint8).tolist())


def accuracy(torch, model, x, y) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).double().mean().item())


def train(
    torch, model, loader, sampler, steps: int, lr: float, loss_scale_fn, sync, phase: str = "ddp"
) -> tuple[list, list, float]:
    """K SGD steps over LOADER (epochs re-seeded); returns (global loss per step, param hash per step, seconds)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses, hashes = [], []
    step, epoch = 0, 0
    progress(step, phase)
    sync()
    timed = 0.0
    while step < steps:
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            if step == steps:
                break
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            sync()
            timed += time.perf_counter() - t0
            losses.append(loss_scale_fn(loss.detach()))
            hashes.append(param_hash(model.module if hasattr(model, "module") else model))
            step += 1
            progress(step)
        epoch += 1
    return losses, hashes, timed


def run(args, rank: int, local_rank: int, world: int) -> dict:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    if args.backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dtype = torch.float32
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
        torch.use_deterministic_algorithms(True)

        def sync():
            torch.cuda.synchronize(device)
    else:
        device = torch.device("cpu")
        dtype = torch.float64
        torch.use_deterministic_algorithms(True)

        def sync():
            pass

    torch.set_num_threads(1)
    if args.global_batch % world:
        raise ValueError(f"global batch {args.global_batch} does not split over {world} ranks")
    samples = args.global_batch * args.batches_per_epoch

    def tensors(seed: int):
        x, y = make_data(torch, seed, samples + args.test_samples, args.features, args.classes)
        x = x.to(device=device, dtype=dtype)
        y = y.to(device)
        return x[:samples], y[:samples], x[samples:], y[samples:]

    record = {"dtype": str(dtype).replace("torch.", ""), "device": str(device)}
    dist.barrier()

    # Reference: one process, the full global batch, same seeds and same data order.
    if rank == 0:
        x, y, x_test, y_test = tensors(args.seed)
        ref_sampler = DistributedSampler(TensorDataset(x, y), num_replicas=1, rank=0, shuffle=True, seed=args.seed)
        ref_loader = DataLoader(TensorDataset(x, y), batch_size=args.global_batch, sampler=ref_sampler)
        reference = make_model(torch, args.seed, args.features, args.hidden, args.classes, dtype, device)
        ref_losses, _, ref_seconds = train(
            torch, reference, ref_loader, ref_sampler, args.steps, args.lr, lambda v: float(v.item()), sync, "reference"
        )
        record["reference"] = {
            "losses": ref_losses,
            "seconds": ref_seconds,
            "samples_per_s": args.steps * args.global_batch / ref_seconds if ref_seconds else None,
            "accuracy": accuracy(torch, reference, x_test, y_test),
        }
    dist.barrier()

    # Distributed: every rank on its slice of the same global batches.
    lr = args.lr
    x, y, x_test, y_test = tensors(args.seed)
    record["data_hash"] = hashlib.sha256(_tensor_bytes(x) + _tensor_bytes(y)).hexdigest()[:16]
    sampler = DistributedSampler(TensorDataset(x, y), num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.global_batch // world, sampler=sampler)
    model = make_model(torch, args.seed, args.features, args.hidden, args.classes, dtype, device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)

    def global_loss(local):
        # Every rank holds the same number of samples, so the global mean is the mean of the local means.
        value = local.clone()
        dist.all_reduce(value)
        return float(value.item()) / world

    losses, hashes, seconds = train(torch, ddp, loader, sampler, args.steps, lr, global_loss, sync)
    elapsed = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    record.update(
        losses=losses,
        param_hashes=hashes,
        final_hash=hashes[-1] if hashes else param_hash(model),
        ddp={
            "seconds": float(elapsed.item()),
            "samples_per_s": args.steps * args.global_batch / float(elapsed.item()) if elapsed.item() else None,
        },
    )
    if rank == 0:
        with torch.no_grad():
            abs_diff, rel_diff = 0.0, 0.0
            for mine, ref in zip(model.parameters(), reference.parameters()):  # noqa: B905 - runs on Python 3.8 too
                d = (mine - ref).abs().max().item()
                abs_diff = max(abs_diff, d)
                rel_diff = max(rel_diff, d / max(ref.abs().max().item(), 1e-30))
        record["ddp"]["accuracy"] = accuracy(torch, model, x_test, y_test)
        record["max_abs_param_diff"] = abs_diff
        record["max_rel_param_diff"] = rel_diff
    dist.barrier()
    return record


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--global-batch", type=int, default=96, help="divisible by the world size")
    parser.add_argument("--batches-per-epoch", type=int, default=8)
    parser.add_argument("--test-samples", type=int, default=512)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    record = rank_identity()
    world = int(os.environ["WORLD_SIZE"])
    record.update(world_size=world, backend=args.backend, steps=args.steps, global_batch=args.global_batch)

    def work(record: dict) -> None:
        import torch
        import torch.distributed as dist

        if args.backend == "nccl":
            torch.cuda.set_device(record["local_rank"])  # before the first collective, so NCCL binds this GPU
        dist.init_process_group(backend=args.backend)
        record.update(run(args, record["rank"], record["local_rank"], world))
        dist.destroy_process_group()

    return run_rank(args.out, record, work)


if __name__ == "__main__":
    exit_now(main())
