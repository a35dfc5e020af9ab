"""train_ddp.py: plain PyTorch DDP; one rank per GPU with nccl, or CPU ranks with gloo."""

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--checkpoint", default=None, help="where global rank 0 saves the model at the end")
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")  # torchrun set RANK, WORLD_SIZE, MASTER_ADDR, ...
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    print(f"rank {rank} of world size {world} on {os.uname().nodename}", flush=True)

    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    model = DDP(torch.nn.Linear(32, 1).to(device), device_ids=[local_rank] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own share of the data
    for step in range(args.steps):
        x = torch.randn(64, 32, generator=data).to(device)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()  # DDP averages the gradients over every rank here
        optimizer.step()
        if step % 10 == 0 or step == args.steps - 1:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    if args.checkpoint and rank == 0:  # only the main process writes the checkpoint
        torch.save(model.module.state_dict(), args.checkpoint)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    if not torch.cuda.is_available():
        # With gloo, torch 2.13 can abort the process while Python shuts down ("terminate called without an active
        # exception": 1 run in 4 of three CPU ranks on a busy machine), after the work is done: leave at once.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
