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
import contextlib
import hashlib
import os
import time

from .common import exit_now, progress, rank_identity, run_rank, start_process_group

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts: deterministic cuBLAS
WARMUP_STEPS = 1  # steps trained before the throughput is timed (train)


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
    torch, model, loader, sampler, steps: int, lr: float, loss_scale_fn, sync, on_step=None, phase: str = "ddp"
) -> tuple[list, list, float]:
    """K SGD steps over LOADER (epochs re-seeded); returns (global loss per step, param hash per step, the seconds of
    each step after the first WARMUP_STEPS). ON_STEP(step, optimizer), when given, runs after every step (untimed);
    PHASE names the heartbeat's phase. The first step is not timed: it pays once for what the process had not done
    yet (CUDA loads each kernel at its first launch, cuBLAS makes its handle), which the reference, trained first,
    would pay alone and the DDP run after it not at all."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses, hashes = [], []
    step, epoch = 0, 0
    progress(step, phase)
    sync()
    timed: list = []
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
            if step >= WARMUP_STEPS:
                timed.append(time.perf_counter() - t0)
            losses.append(loss_scale_fn(loss.detach()))
            hashes.append(param_hash(model.module if hasattr(model, "module") else model))
            step += 1
            progress(step)
            if on_step is not None:
                on_step(step, opt)
        epoch += 1
    return losses, hashes, timed


def samples_per_second(args, seconds: float) -> float | None:
    """Training throughput of the timed steps (all but the first WARMUP_STEPS) that took SECONDS."""
    timed_steps = args.steps - WARMUP_STEPS
    return timed_steps * args.global_batch / seconds if seconds and timed_steps > 0 else None


def run(args, rank: int, device, world: int) -> dict:
    """The reference and the DDP run on DEVICE, the rank's own (start_process_group bound it)."""
    import torch.distributed as dist

    training = Training(args, rank, device, world)
    record = {"dtype": str(training.dtype).replace("torch.", ""), "device": str(device)}
    dist.barrier()
    reference = None
    if rank == 0:  # one process, the full global batch, the same seeds and the same data order
        reference, record["reference"] = training.reference()
    dist.barrier()
    model, checkpoint = training.distributed(record)  # every rank on its slice of the same global batches
    if rank == 0:
        record["ddp"]["accuracy"] = training.accuracy(model)
        record["max_abs_param_diff"], record["max_rel_param_diff"] = training.differences(model, reference)
    dist.barrier()
    if checkpoint.step:
        loader, sampler = training.slices
        record["checkpoint"] = checkpoint.round_trip(
            training.model, loader, sampler, training.global_loss, training.sync
        )
    return record


class Training:
    """One rank's training: the single-process reference (global rank 0 alone) and its DDP copy, on the rank's
    DEVICE: float64 on CPUs; float32 on GPUs with TF32 off and deterministic algorithms."""

    def __init__(self, args, rank: int, device, world: int) -> None:
        import torch

        self.torch, self.args, self.rank, self.device, self.world = torch, args, rank, device, world
        self.dtype, self.sync = precision(torch, device)
        torch.set_num_threads(1)
        if args.global_batch % world:
            raise ValueError(f"global batch {args.global_batch} does not split over {world} ranks")
        self.samples = args.global_batch * args.batches_per_epoch
        self.x_test = self.y_test = None  # the held-out data, once the DDP copy trained
        self.slices: tuple = ()  # the DDP copy's (loader, sampler), which the checkpoint's resumed run trains on

    def tensors(self):
        """The seeded data on the device: (x, y) to train on, then (x, y) held out."""
        args = self.args
        x, y = make_data(self.torch, args.seed, self.samples + args.test_samples, args.features, args.classes)
        x = x.to(device=self.device, dtype=self.dtype)
        y = y.to(self.device)
        return x[: self.samples], y[: self.samples], x[self.samples :], y[self.samples :]

    def model(self):
        """A fresh model, the same weights on every rank."""
        args = self.args
        return make_model(self.torch, args.seed, args.features, args.hidden, args.classes, self.dtype, self.device)

    def loader(self, x, y, replicas: int, rank: int):
        """The global batches of the seeded data order, the slice of rank RANK of REPLICAS."""
        from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

        args = self.args
        sampler = DistributedSampler(
            TensorDataset(x, y), num_replicas=replicas, rank=rank, shuffle=True, seed=args.seed
        )
        return DataLoader(TensorDataset(x, y), batch_size=args.global_batch // replicas, sampler=sampler), sampler

    def reference(self):
        """The reference model trained alone, and its record: losses, seconds, throughput and held-out accuracy."""
        x, y, x_test, y_test = self.tensors()
        loader, sampler = self.loader(x, y, 1, 0)
        reference = self.model()
        args = self.args
        losses, _, step_seconds = train(
            self.torch,
            reference,
            loader,
            sampler,
            args.steps,
            args.lr,
            lambda v: float(v.item()),
            self.sync,
            phase="reference",
        )
        seconds = sum(step_seconds)
        return reference, {
            "losses": losses,
            "seconds": seconds,
            "samples_per_s": samples_per_second(args, seconds),
            "accuracy": accuracy(self.torch, reference, x_test, y_test),
        }

    def distributed(self, record: dict):
        """The DDP copy trained on this rank's slice, its checkpoint saved half-way; its record into RECORD. Returns
        the model and the checkpoint."""
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        torch, args = self.torch, self.args
        x, y, self.x_test, self.y_test = self.tensors()
        record["data_hash"] = hashlib.sha256(_tensor_bytes(x) + _tensor_bytes(y)).hexdigest()[:16]
        loader, sampler = self.loader(x, y, self.world, self.rank)
        model = self.model()
        ddp = DistributedDataParallel(model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        checkpoint = Checkpoint(torch, args, self.rank, self.device)
        losses, hashes, step_seconds = train(
            torch,
            ddp,
            loader,
            sampler,
            args.steps,
            args.lr,
            self.global_loss,
            self.sync,
            on_step=checkpoint.save_at_half_way(model),
        )
        # The slowest rank's time in all, and each step's slowest rank: the steps are the repetitions whose median
        # and spread a baseline comparison allows for (checks/ddp.py).
        elapsed = torch.tensor([sum(step_seconds), *step_seconds], dtype=torch.float64, device=self.device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        slowest = [float(t) for t in elapsed.tolist()]
        record.update(
            losses=losses,
            param_hashes=hashes,
            final_hash=hashes[-1] if hashes else param_hash(model),
            ddp={
                "seconds": slowest[0],
                "samples_per_s": samples_per_second(args, slowest[0]),
                "step_seconds": slowest[1:],
            },
        )
        self.slices = (loader, sampler)
        return model, checkpoint

    def global_loss(self, local) -> float:
        """The global batch's loss: every rank holds the same number of samples, so the global mean is the mean of
        the local means."""
        import torch.distributed as dist

        value = local.clone()
        dist.all_reduce(value)
        return float(value.item()) / self.world

    def accuracy(self, model) -> float:
        return accuracy(self.torch, model, self.x_test, self.y_test)

    def differences(self, model, reference) -> tuple[float, float]:
        """The largest absolute and relative difference between MODEL's parameters and the REFERENCE's."""
        abs_diff, rel_diff = 0.0, 0.0
        with self.torch.no_grad():
            for mine, ref in zip(model.parameters(), reference.parameters()):  # noqa: B905 - runs on Python 3.8 too
                d = (mine - ref).abs().max().item()
                abs_diff = max(abs_diff, d)
                rel_diff = max(rel_diff, d / max(ref.abs().max().item(), 1e-30))
        return abs_diff, rel_diff


def precision(torch, device):
    """(dtype, sync) of a run on DEVICE: float32 with TF32 off, deterministic cuDNN and algorithms, and a CUDA
    synchronisation on GPUs; float64 and deterministic algorithms on CPUs, where nothing needs synchronising."""
    if device.type != "cuda":
        torch.use_deterministic_algorithms(True)
        return torch.float64, lambda: None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True)
    return torch.float32, lambda: torch.cuda.synchronize(device)


def state_hash(state: dict) -> str:
    """A hash of a checkpoint's tensors (model parameters, optimizer state) in a fixed order."""
    import torch

    digest = hashlib.sha256()

    def walk(value):
        if isinstance(value, torch.Tensor):
            digest.update(_tensor_bytes(value))
        elif isinstance(value, dict):
            for key in sorted(value, key=str):
                digest.update(str(key).encode())
                walk(value[key])
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)
        else:
            digest.update(repr(value).encode())

    walk(state)
    return digest.hexdigest()[:16]


class Checkpoint:
    """The checkpoint round trip: half-way through the DDP run, global rank 0 alone saves the model and optimizer
    state (into the shared directory when there is one, else into its own run directory); after the run, every
    rank loads it (read from the shared directory, or sent from rank 0 over the process group), builds a fresh
    model and optimizer from it, and trains the second half again. Bit-identical training resumes exactly where
    the uninterrupted run went on."""

    def __init__(self, torch, args, rank: int, device) -> None:
        self.torch, self.args, self.rank, self.device = torch, args, rank, device
        self.step = args.steps // 2 if args.steps >= 2 else 0
        self.shared = args.checkpoint_dir
        folder = self.shared or args.out
        self.path = os.path.join(folder, "checkpoint.pt")
        self.saved: dict = {}

    def save_at_half_way(self, model):
        def on_step(step: int, opt) -> None:
            if step != self.step or self.rank != 0:
                return
            state = {"step": step, "model": model.state_dict(), "optimizer": opt.state_dict()}
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            t0 = time.perf_counter()
            self.torch.save(state, self.path)
            self.saved = {
                "save_seconds": time.perf_counter() - t0,
                "bytes": os.path.getsize(self.path),
                "saved_hash": state_hash(state),
            }

        return on_step

    def _receive(self) -> tuple[str, float]:
        """The checkpoint file this rank loads, and the seconds it took to get it."""
        import torch.distributed as dist

        torch = self.torch
        t0 = time.perf_counter()
        if self.shared:
            dist.barrier()
            return self.path, time.perf_counter() - t0
        # Sent from rank 0: its size, then its bytes, over the process group.
        size = torch.tensor([self.saved.get("bytes", 0) if self.rank == 0 else 0], dtype=torch.int64)
        size = size.to(self.device)
        dist.broadcast(size, 0)
        if self.rank == 0:
            with open(self.path, "rb") as fh:
                payload = torch.frombuffer(bytearray(fh.read()), dtype=torch.uint8).to(self.device)
        else:
            payload = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)
        dist.broadcast(payload, 0)
        if self.rank == 0:
            return self.path, time.perf_counter() - t0
        path = os.path.join(self.args.out, f"checkpoint-received-rank-{self.rank}.pt")
        with open(path, "wb") as fh:
            fh.write(bytes(payload.cpu().tolist()))
        return path, time.perf_counter() - t0

    def round_trip(self, fresh, loader, sampler, global_loss, sync) -> dict:
        import torch.distributed as dist

        torch = self.torch
        path, transfer_seconds = self._receive()
        out = {"step": self.step, "shared_dir": self.shared, "transfer_seconds": transfer_seconds, **self.saved}
        t0 = time.perf_counter()
        try:
            state = torch.load(path, map_location=self.device)
            out["loaded_hash"] = state_hash(state)
        except Exception as exc:  # this rank's failed load is its result; the others must not wait for it
            state, out["load_error"] = None, f"{type(exc).__name__}: {exc}"
        out["load_seconds"] = time.perf_counter() - t0
        everyone = torch.tensor([0 if state is None else 1], dtype=torch.int64, device=self.device)
        dist.all_reduce(everyone, op=dist.ReduceOp.MIN)
        if everyone.item():
            out.update(self._resume(state, fresh, loader, sampler, global_loss, sync))
        dist.barrier()
        if self.rank == 0 or not self.shared:
            with contextlib.suppress(OSError):
                os.remove(path)
        if self.rank == 0 and self.shared:
            with contextlib.suppress(OSError):
                os.rmdir(self.shared)
        return out

    def _resume(self, state, fresh, loader, sampler, global_loss, sync) -> dict:
        """The second half of the run again, from STATE: the losses and parameter hashes of every step."""
        from torch.nn.parallel import DistributedDataParallel

        torch, args = self.torch, self.args
        model = fresh()
        model.load_state_dict(state["model"])
        ddp = DistributedDataParallel(model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
        opt.load_state_dict(state["optimizer"])
        # DDP buckets gradients in parameter order in its first iteration and in backward order from the second
        # on, and the all_reduce rounds differently over another layout: one backward without a step gives the
        # resumed run the layout the uninterrupted run had at this step.
        xb, yb = next(iter(loader))
        torch.nn.functional.cross_entropy(ddp(xb), yb).backward()
        opt.zero_grad(set_to_none=True)
        losses, hashes = [], []
        per_epoch = len(loader)
        step = self.step
        while step < args.steps:
            epoch, skip = divmod(step, per_epoch)
            sampler.set_epoch(epoch)
            for i, (xb, yb) in enumerate(loader):
                if i < skip:
                    continue
                if step == args.steps:
                    break
                opt.zero_grad(set_to_none=True)
                loss = torch.nn.functional.cross_entropy(ddp(xb), yb)
                loss.backward()
                opt.step()
                sync()
                losses.append(global_loss(loss.detach()))
                hashes.append(param_hash(model))
                step += 1
        return {"losses": losses, "param_hashes": hashes}


def parser() -> argparse.ArgumentParser:
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
    parser.add_argument(
        "--checkpoint-dir", default=None, help="a directory on the shared filesystem (default: sent from rank 0)"
    )
    return parser


def part(args, torch, dist, device, record: dict) -> None:
    """The reference, the DDP run and the checkpoint round trip on the process group, into RECORD."""
    world = dist.get_world_size()
    record.update(world_size=world, backend=args.backend, steps=args.steps, global_batch=args.global_batch)
    record.update(run(args, record["rank"], device, world))


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
