"""The collectives stage: its part of the run's torch job (stages/shared.py), collective correctness and an
all_reduce bandwidth sweep; and the same worker across one node's own ranks as a job of its own (local.allreduce,
...), where the run has no torch job over several nodes to do it in (localjob.local_collectives)."""

from __future__ import annotations

import random
import time
from typing import Any

from clustercheck.checks import collectives, fabric_pairs, nccl_net, registry
from clustercheck.model import CheckResult, Status
from clustercheck.stages import Context, Member, launch, torchjob
from clustercheck.transport import TransportError

NAME = "collectives"
LOCAL_STAGE = "local-collectives"  # the node-local job's directory on the node and in the run directory


def part_args(members: list[Member], ctx: Context) -> list[str]:
    """Its part's arguments in the run's torch job: the fabric pair rounds' (their number, a seed drawn for this
    run and written in the report, the floor; the all-node floor under which clean pairs lead to a bisection)."""
    config = ctx.config
    selection = config.selection
    if not (selection.check_selected(fabric_pairs.NODE) or selection.check_selected(fabric_pairs.PATHS)):
        return ["--pair-rounds", "0"]
    rounds = config.pair_rounds if config.pair_rounds is not None else len(members)  # None: every pair
    args = ["--pair-rounds", str(rounds), "--pair-seed", str(random.randrange(1 << 31))]
    if config.min_pair_busbw:
        args += ["--pair-floor", str(config.min_pair_busbw)]
    try:
        fail_below = collectives.parse_min_busbw(config.min_busbw).fail_below
    except collectives.ThresholdError:
        fail_below = None  # the stage reports the bad threshold itself
    if fail_below:
        args += ["--bisect-below", str(fail_below)]
    return args


def run(members: list[Member], ctx: Context) -> list[CheckResult]:
    hosts = [m.name for m in members]
    job = ctx.torch_job
    try:
        thresholds = collectives.parse_min_busbw(ctx.config.min_busbw)
        outcome = job.outcome(NAME, members, ctx)
    except (launch.LaunchError, collectives.ThresholdError, TransportError, OSError) as exc:
        return [
            registry.emit(name, Status.ERROR, f"{name}: {exc}", remediation=launch.launch_fix(exc))
            for name in (*collectives.COLLECTIVES, "allreduce.bandwidth", fabric_pairs.PATHS)
        ] + [
            registry.result(check, m.name, registry.skip(f"the collectives job did not start: {exc}"))
            for m in members
            for check in (nccl_net.TRANSPORT.name, fabric_pairs.NODE)
        ]
    results = collectives.evaluate(outcome.records, outcome.world_size)
    intra = {m.name: collectives.intra_node_thresholds(m.facts, thresholds) for m in members}
    results += collectives.evaluate_bandwidth(outcome.records, outcome.world_size, thresholds, hosts, intra)
    rates = [p.rate_gbps for m in members for p in m.facts.rdma_ports or [] if p.active and p.rate_gbps]
    results += fabric_pairs.evaluate(outcome.records, hosts, ctx.config.min_pair_busbw, rates)
    return torchjob.judged(results, outcome) + transport_results(members, outcome, ctx, job.started or time.time())


def transport_results(members: list[Member], outcome: torchjob.JobOutcome, ctx: Context, started: float):
    """transport.network per node: what NCCL's INFO log of the torch job says (the nccl-*.log files written since
    the job started, not a node-local job's), or for gloo the interface each rank's connections bound to; each
    node judged beside the others' fabrics too (a node whose fabric differs from the majority's FAILs)."""
    config = ctx.config
    seen: dict[str, Any] = {}
    fabrics: dict[str, nccl_net.Fabric | None] = {}
    for m in members:
        if outcome.backend == "nccl":
            since = started + (m.facts.clock_offset or 0.0) - 2.0
            logs = [
                p.read_text(errors="replace")
                for p in sorted(config.host_dir(m.name).glob("nccl-*.log"))
                if p.stat().st_mtime >= since
            ]
            seen[m.name] = parsed = nccl_net.parse_nccl_log("\n".join(logs))
            fabrics[m.name] = nccl_net.nccl_fabric(parsed)
        else:
            seen[m.name] = records = outcome.of_node(m.name)
            bound = nccl_net.gloo_interface(records, m.facts, config.master_port)
            fabrics[m.name] = nccl_net.gloo_fabric(bound)
    grouped = nccl_net.Fabrics(fabrics)
    out = []
    for m in members:
        expect = config.expect_transport or m.node.expect_transport
        if outcome.backend == "nccl":
            finding = nccl_net.judge_nccl(seen[m.name], m.facts, expect, grouped)
        else:
            rails = m.node.rail_interfaces
            finding = nccl_net.judge_gloo(
                seen[m.name], m.facts, m.interface, config.master_port, expect, grouped, rails
            )
        out.append(nccl_net.TRANSPORT.result(m.name, finding))
    return out


def run_local(member: Member, ctx: Context, port: int) -> list[CheckResult]:
    """Collectives across one node's GPUs (or two CPU ranks), its ranks meeting on 127.0.0.1:PORT."""
    try:
        outcome = torchjob.run(
            [member],
            "collectives",
            ctx,
            stage=LOCAL_STAGE,
            worker_args=["--no-bandwidth"],
            master_port=port,
            single_node=True,
        )
    except (launch.LaunchError, TransportError, OSError) as exc:
        return [
            registry.emit(
                f"{collectives.LOCAL_PREFIX}{n}",
                Status.ERROR,
                f"{member.name}: {exc}",
                host=member.name,
                remediation=launch.launch_fix(exc),
            )
            for n in collectives.COLLECTIVES
        ]
    results = collectives.evaluate(outcome.records, outcome.world_size, collectives.LOCAL_PREFIX, member.name)
    return torchjob.judged(results, outcome)
