"""Fabric pair rounds inside the torch job (torch and the standard library; the collectives part calls them after the
all-node all_reduce sweep).

In each round (remote/pairs.py's schedule, the same on every rank from the seed the controller gives) the nodes
pair off, and local rank i of one node exchanges SIZE bytes with local rank i of the other, both directions at once
(send/recv: nccl-tests' sendrecv, busbw = algbw), a warm-up exchange first and then ITERS timed ones; each rank
records the time its receive took (one direction of its rail, the partner's to its own), the median of the timed
ones. Every rank gathers every figure, so all compute the same confirm round (each node a slow figure touched with
a node none touched, each unexplained slow pair again) and run it. When the pairs are clean but the all-node
all_reduce was below the floor the controller gave, halves of the nodes run all_reduce side by side, down to the
boundary where halves pass that fail together: the switch or spine between them.
"""

from __future__ import annotations

import os
import time

from . import pairs
from .common import progress, rail_interface

GPU_PAIR_BYTES = 1 << 28  # 256 MiB: sendrecv over a 400 Gb/s rail reaches steady bandwidth by then (nccl-tests)
CPU_PAIR_BYTES = 1 << 22  # 4 MiB: gloo on CPU ranks that share cores; a throttled rail still stands out
STEP_BASE = 100  # the heartbeat steps of the pair rounds: after the sweep's
# A pair's exchanges stop once they took this long (after one timed exchange at least): a healthy pair is done long
# before (256 MiB over a 200 Gb/s rail: 11 ms an exchange; 4 MiB between crowded CPU ranks: 0.05 to 0.2 s), a link
# down to a hundredth would otherwise hold every rank for six of its exchanges a round.
PAIR_SECONDS = 1.0


def add_arguments(parser) -> None:
    parser.add_argument(
        "--pair-rounds",
        type=int,
        default=pairs.DEFAULT_ROUNDS,
        help="rounds of node pairs after the all-node sweep (0: none); every pair when the cluster is small enough",
    )
    parser.add_argument("--pair-seed", type=int, default=0, help="the seed that shuffles the pair schedule")
    parser.add_argument(
        "--pair-bytes", type=int, default=None, help="bytes an exchange (default 256 MiB GPU, 4 MiB CPU)"
    )
    parser.add_argument("--pair-iters", type=int, default=None, help="timed exchanges per pair (default 5)")
    parser.add_argument("--pair-floor", type=float, default=0.0, help="GB/s under which a pair figure is slow")
    parser.add_argument(
        "--bisect-below",
        type=float,
        default=0.0,
        help="all-node busbw (GB/s) under which clean pairs lead to halves (bisection); 0: never",
    )


def run(torch, dist, device, args, groups: list[list[int]], mine: int, world_busbw: float | None) -> dict:
    """The pair rounds, the confirm round and any bisection, as this rank's record of them."""
    started = time.monotonic()
    local_rank = groups[mine].index(dist.get_rank())
    cuda = device.type == "cuda"
    size = args.pair_bytes or (GPU_PAIR_BYTES if cuda else CPU_PAIR_BYTES)
    iters = args.pair_iters or 5
    rounds = pairs.schedule(len(groups), args.pair_seed, args.pair_rounds)
    send = torch.ones(size // 4, dtype=torch.float32, device=device)
    recv = torch.empty_like(send)
    mine_times = run_rounds(torch, dist, device, rounds, groups, mine, local_rank, send, recv, iters, "round")
    received = gather(torch, dist, device, groups, mine_times, len(rounds))
    ratio = pairs.SLOW_RATIO.get(args.backend, pairs.SLOW_RATIO["gloo"])
    edges = pairs.edges_from(rounds, received, size)
    slow = pairs.slow_edges(edges, args.pair_floor or None, ratio)
    confirm = pairs.confirm_rounds(len(groups), slow, args.pair_seed, pairs.met(edges))
    confirm_times = run_rounds(torch, dist, device, confirm, groups, mine, local_rank, send, recv, iters, "confirm")
    record = {
        "node": mine,
        "rail": local_rank,
        "interface": rail_interface(local_rank) or os.environ.get("GLOO_SOCKET_IFNAME") or None,
        "bytes": size,
        "iters": iters,
        "seed": args.pair_seed,
        "recv": mine_times,
        "confirm": confirm_times,
    }
    if dist.get_rank() == 0:
        record["schedule"] = rounds
        record["confirm_schedule"] = confirm
    del send, recv
    if not slow and args.bisect_below and world_busbw is not None and world_busbw < args.bisect_below:
        levels = bisect(torch, dist, device, groups, mine, args.bisect_below)
        if dist.get_rank() == 0:
            record["bisection"] = levels
    record["seconds"] = round(time.monotonic() - started, 3)
    return record


def run_rounds(torch, dist, device, rounds, groups, mine, local_rank, send, recv, iters, what) -> list:
    """This rank's receive time (seconds, median of ITERS) in each of ROUNDS, None where it has no partner."""
    times = []
    for number, round_pairs in enumerate(rounds, 1):
        progress(STEP_BASE + number, f"fabric pairs, {what} {number} of {len(rounds)}")
        partner = pairs.partners(round_pairs).get(mine)
        peer = groups[partner][local_rank] if partner is not None and local_rank < len(groups[partner]) else None
        dist.barrier()  # every pair of the round starts together: the rounds measure the fabric under load
        times.append(None if peer is None else exchange(torch, dist, device, send, recv, peer, iters))
    return times


def exchange(torch, dist, device, send, recv, peer: int, iters: int, budget: float = PAIR_SECONDS) -> float:
    """The shortest time the receive from PEER took in ITERS exchanges (a warm-up one first: NCCL connects the pair
    on its first send): what the rail can do. Noise (another process on the core, the scheduler) only ever slows an
    exchange; a slow link slows every one, so a pair past BUDGET seconds stops after its next exchange: each side
    says in its first element whether it is within the budget, and both stop once either is not (both read both
    flags, so they agree), after one timed exchange at least."""
    took = []
    pair_started = time.perf_counter()
    for i in range(iters + 1):
        within = time.perf_counter() - pair_started < budget
        send[0] = 1.0 if within else 0.0
        ops = [dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)]
        started = time.perf_counter()
        requests = dist.batch_isend_irecv(ops)
        requests[1].wait()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:
            took.append(time.perf_counter() - started)
        requests[0].wait()
        if i and not (within and float(recv[0]) > 0):
            break
    return min(took)


def gather(torch, dist, device, groups, mine_times: list, count: int) -> dict:
    """Every rank's receive times, as {(node, rail): [seconds or None per round]}."""
    world = dist.get_world_size()
    if not count:
        return {}
    mine = torch.tensor([-1.0 if t is None else t for t in mine_times], dtype=torch.float64, device=device)
    gathered = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    out = {}
    for node, ranks in enumerate(groups):
        for rail, rank in enumerate(ranks):
            out[(node, rail)] = [None if t < 0 else t for t in gathered[rank].tolist()]
    return out


def bisect(torch, dist, device, groups, mine: int, floor: float) -> list:
    """Halves of the failing groups of nodes run all_reduce side by side, level by level, while a half is below
    FLOOR; each level's groups with their busbw (GB/s, nccl-tests' all_reduce busbw at 64 MiB or 1 MiB on CPU)."""
    size = (1 << 26) if device.type == "cuda" else (1 << 20)
    levels = []
    failing = [list(range(len(groups)))]
    while failing:
        split = [h for g in failing if len(g) >= 4 for h in pairs.halves(g)]
        if not split:
            break
        progress(STEP_BASE + 90 + len(levels), f"fabric bisection, level {len(levels) + 1}")
        figures = groups_busbw(torch, dist, device, groups, mine, split, size)
        judged = list(zip(split, figures))  # noqa: B905 (Python 3.8 on the node: no strict=)
        levels.append([{"nodes": g, "busbw_gbps": b} for g, b in judged])
        failing = [g for g, b in judged if b < floor]
    return levels


def groups_busbw(torch, dist, device, groups, mine: int, node_sets: list, size: int) -> list:
    """all_reduce busbw of each set of nodes in NODE_SETS, every set at once (disjoint sets)."""
    from .collectives import bus_factor

    handles = [dist.new_group(ranks=[r for n in nodes for r in groups[n]]) for nodes in node_sets]
    figures = torch.full((len(node_sets),), float("inf"), dtype=torch.float64, device=device)
    for i, nodes in enumerate(node_sets):
        if mine in nodes:
            tensor = torch.zeros(size // 4, dtype=torch.float32, device=device)
            dist.all_reduce(tensor, group=handles[i])  # warm-up
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            started = time.perf_counter()
            for _ in range(3):
                dist.all_reduce(tensor, group=handles[i])
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds = (time.perf_counter() - started) / 3
            n = sum(len(groups[x]) for x in nodes)
            figures[i] = size / seconds / 1e9 * bus_factor(n)
    dist.all_reduce(figures, op=dist.ReduceOp.MIN)  # the slowest rank of a set sets its pace
    return [float(f) for f in figures.tolist()]
