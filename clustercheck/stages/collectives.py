"""The collectives stage: torchrun on every node, collective correctness and an all_reduce bandwidth sweep; and the
same worker across one node's own ranks, run by the core stage (local.allreduce, ...)."""

from __future__ import annotations

from clustercheck.checks import collectives
from clustercheck.model import CheckResult, Status
from clustercheck.stages import Context, Member, launch, torchjob
from clustercheck.transport import TransportError

NAME = "collectives"
NEEDS_TORCH = True
LOCAL_STAGE = "local-collectives"  # the node-local job's directory on the node and in the run directory


def run(members: list[Member], ctx: Context) -> list[CheckResult]:
    hosts = [m.name for m in members]
    try:
        thresholds = collectives.parse_min_busbw(ctx.config.min_busbw)
        outcome = torchjob.run(members, "collectives", ctx)
    except (launch.LaunchError, collectives.ThresholdError, TransportError, OSError) as exc:
        return [
            CheckResult(name, Status.ERROR, f"{name}: {exc}")
            for name in (*collectives.COLLECTIVES, "allreduce.bandwidth")
        ]
    results = collectives.evaluate(outcome.records, outcome.world_size)
    results += collectives.evaluate_bandwidth(outcome.records, outcome.world_size, thresholds, hosts)
    return torchjob.judged(results, outcome)


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
            CheckResult(
                f"{collectives.LOCAL_PREFIX}{n}",
                Status.ERROR,
                f"{member.name}: {exc}",
                host=member.name,
            )
            for n in collectives.COLLECTIVES
        ]
    results = collectives.evaluate(outcome.records, outcome.world_size, collectives.LOCAL_PREFIX, member.name)
    return torchjob.judged(results, outcome)
