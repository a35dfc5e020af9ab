"""PyTorch Lightning across every node, launched by torchrun on every node as users launch it (standard library,
torch and Lightning only).

    lightning probe                      whether Lightning (`lightning` or `pytorch_lightning`) imports here
    lightning --out DIR --num-nodes N --devices K [...]
                                         one rank of Trainer(num_nodes=N, devices=K, strategy="ddp") under torchrun

The task is the DDP check's (remote/ddp.py): the same seeded data, model and SGD with momentum, in a
LightningModule. Every rank trains on its slice of the same global batches (a DistributedSampler with the check's
seed, which Lightning re-seeds every epoch) and records the global loss per step, a hash of its parameters after
every step, and what Lightning saw: world size, node count, its global, local and node rank, and the cluster
environment. Global rank 0 also runs the single-process reference: the same LightningModule in a Trainer with one
device, on the full global batch, after the distributed fit, in its own process with torchrun's variables out of
its environment (Lightning then sees a plain single process); it then compares its final parameters with the
reference's. Each rank writes OUT/rank-<rank>.json; clustercheck/checks/lightning.py judges. Run alone, the
program joins its own process group first; in the run's torch job (remote/stages.py) it is the `lightning` part.

float64 on CPUs; float32 on GPUs with TF32 off and deterministic algorithms.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

from .common import STARTING, exit_now, progress, rank_identity, run_rank, start_process_group
from .ddp import make_data, make_model, param_hash

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts: deterministic cuBLAS

# What torchrun puts into its ranks' environment: the reference runs without it, as a plain single process.
TORCHRUN_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


FIT = "lightning fit"  # the heartbeat's phase once the Trainer trains (its step: the batches done)


def import_lightning():
    """(the Lightning package under its importable name, that name): `lightning` first, else `pytorch_lightning`."""
    try:
        import lightning.pytorch as pl

        return pl, "lightning"
    except ImportError as first:
        try:
            import pytorch_lightning as pl

            return pl, "pytorch_lightning"
        except ImportError:
            raise first from None


def probe() -> dict:
    try:
        pl, name = import_lightning()
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": True, "package": name, "version": pl.__version__}


def task(pl, torch, args, dtype, device):
    """The DDP check's model and optimizer as a LightningModule that records the global loss and a parameter hash
    after every step, and what Lightning saw when training started."""

    class Task(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_model(torch, args.seed, args.features, args.hidden, args.classes, dtype, device)
            self.losses: list = []
            self.hashes: list = []
            self.seen: dict = {}

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.net(x), y)
            self._loss = loss.detach()
            return loss

        def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
            # The strategy's mean over the ranks: every rank holds the same number of samples.
            self.losses.append(float(self.trainer.strategy.reduce(self._loss.clone(), reduce_op="mean").item()))
            self.hashes.append(param_hash(self.net))
            progress(len(self.losses), FIT)

        def on_train_start(self) -> None:
            progress(0, FIT)
            trainer = self.trainer
            dist = torch.distributed
            environment = getattr(trainer.strategy, "cluster_environment", None)  # none with a single device
            self.seen = {
                "world_size": trainer.world_size,
                "num_nodes": trainer.num_nodes,
                "num_devices": trainer.num_devices,
                "global_rank": trainer.global_rank,
                "local_rank": trainer.local_rank,
                "node_rank": trainer.node_rank,
                "cluster_environment": type(environment).__name__ if environment is not None else None,
                "strategy": type(trainer.strategy).__name__,
                "process_group_backend": dist.get_backend() if dist.is_initialized() else None,
            }

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=args.lr, momentum=0.9)

    return Task()


def fit(args, world: int, rank: int, num_nodes: int, devices: int, strategy) -> tuple[dict, object]:
    """Train ARGS.steps steps with Lightning; the record, and the trained module."""
    import torch
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    pl, package = import_lightning()
    gpu = args.backend == "nccl"
    if gpu:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    dtype = torch.float32 if gpu else torch.float64
    torch.set_num_threads(1)
    if args.global_batch % world:
        raise ValueError(f"global batch {args.global_batch} does not split over {world} ranks")
    samples = args.global_batch * args.batches_per_epoch
    x, y = make_data(torch, args.seed, samples, args.features, args.classes)
    x = x.to(dtype=dtype)
    data = TensorDataset(x, y)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(data, batch_size=args.global_batch // world, sampler=sampler)
    module = task(pl, torch, args, dtype, torch.device("cpu"))
    trainer = pl.Trainer(
        accelerator="gpu" if gpu else "cpu",
        devices=devices,
        num_nodes=num_nodes,
        strategy=strategy,
        precision="32-true" if gpu else "64-true",
        max_steps=args.steps,
        deterministic=True,
        use_distributed_sampler=False,  # our sampler: the DDP check's data order, re-seeded by Lightning per epoch
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=args.out,
    )
    started = time.perf_counter()
    trainer.fit(module, loader)
    record = {
        "lightning": {"package": package, "version": pl.__version__},
        "dtype": str(dtype).replace("torch.", ""),
        "seconds_fit": time.perf_counter() - started,
        "losses": module.losses,
        "param_hashes": module.hashes,
        "final_hash": param_hash(module.net),
        "seen": module.seen,
    }
    return record, module


def compare(torch, module, reference: list, ref: dict) -> dict:
    """MODULE's parameters against the REFERENCE's (CPU tensors), with the reference's record REF."""
    abs_diff, rel_diff = 0.0, 0.0
    with torch.no_grad():
        for mine, ref_p in zip(module.net.parameters(), reference):  # noqa: B905 - runs on Python 3.8 too
            d = (mine.detach().cpu() - ref_p).abs().max().item()
            abs_diff = max(abs_diff, d)
            rel_diff = max(rel_diff, d / max(ref_p.abs().max().item(), 1e-30))
    return {
        "reference": {"losses": ref["losses"], "final_hash": ref["final_hash"], "seen": ref["seen"]},
        "max_abs_param_diff": abs_diff,
        "max_rel_param_diff": rel_diff,
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", nargs="?", choices=["probe"], help="probe: whether Lightning imports here")
    parser.add_argument("--out")
    parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    parser.add_argument("--num-nodes", type=int, default=1, help="Trainer(num_nodes=...): the nodes of the job")
    parser.add_argument("--devices", type=int, default=1, help="Trainer(devices=...): the ranks per node")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--global-batch", type=int, default=96, help="divisible by the world size")
    parser.add_argument("--batches-per-epoch", type=int, default=8)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1234)
    return parser


def describe(args, record: dict) -> None:
    """What every rank records about itself first: the job as torchrun described it and as it was asked for."""
    record.update(
        world_size=int(os.environ["WORLD_SIZE"]),
        backend=args.backend,
        steps=args.steps,
        global_batch=args.global_batch,
        expected={"num_nodes": args.num_nodes, "devices": args.devices},
        torchrun={k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "LOCAL_WORLD_SIZE")},
    )


@contextlib.contextmanager
def without_torchrun():
    """torchrun's variables out of this process's environment while the block runs, then back: Lightning reads
    its cluster from them, and the single-process reference must see none."""
    kept = {k: v for k, v in os.environ.items() if k in TORCHRUN_VARS or k.startswith("TORCHELASTIC_")}
    for key in kept:
        del os.environ[key]
    try:
        yield
    finally:
        os.environ.update(kept)


def part(args, torch, dist, device, record: dict) -> None:
    """Lightning on the job's process group, in a job of several parts (remote/stages.py): every rank imports
    Lightning (what the `probe` says alone), and only when it imports on every rank does any rank train; then
    Trainer(num_nodes=N, devices=K, strategy="ddp") on the process group already there, and global rank 0 trains
    the single-process reference after it, in this process (torchrun's variables out of its environment) and
    compares."""
    describe(args, record)
    progress(0, STARTING)  # importing Lightning: its CPU time is the rank's progress
    record["import"] = probe()
    everyone = torch.tensor([1 if record["import"]["ok"] else 0], dtype=torch.int64, device=device)
    dist.all_reduce(everyone, op=dist.ReduceOp.MIN)
    if not everyone.item():
        record["not_run"] = "Lightning does not import on every rank"
        return
    os.makedirs(args.out, exist_ok=True)
    mine, module = fit(args, record["world_size"], record["rank"], args.num_nodes, args.devices, "ddp")
    record.update(mine)
    if record["rank"] == 0:
        progress(args.steps, "the single-process reference")
        with without_torchrun():
            reference, trained = fit(args, world=1, rank=0, num_nodes=1, devices=1, strategy="auto")
        reference["seen"]["process_group_backend"] = None  # a single process: no group of its own
        record.update(compare(torch, module, [p.detach().cpu() for p in trained.net.parameters()], reference))


def main() -> int:
    args = parser().parse_args()
    if args.what == "probe":
        sys.stdout.write(json.dumps(probe()) + "\n")
        return 0
    record = rank_identity()

    def work(record: dict) -> None:
        import torch
        import torch.distributed as dist

        device = start_process_group(torch, dist, args.backend, record["local_rank"])
        part(args, torch, dist, device, record)

    return run_rank(args.out, record, work)


if __name__ == "__main__":
    exit_now(main())
