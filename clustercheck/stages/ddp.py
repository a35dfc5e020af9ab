"""The DDP stage: its part of the run's torch job (stages/shared.py), DDP against a single-process reference and the
checkpoint round trip (checks/ddp.py judges them)."""

from __future__ import annotations

from clustercheck.checks import ddp, registry
from clustercheck.model import CheckResult, Status
from clustercheck.stages import Context, Member, launch, torchjob
from clustercheck.transport import TransportError

NAME = "ddp"


def part_args(members: list[Member], ctx: Context) -> list[str]:
    """Its part's arguments in the run's torch job: the checkpoint round trip goes through the shared directory
    when there is one."""
    if not ctx.config.shared_dir:
        return []
    return ["--checkpoint-dir", f"{ctx.config.shared_dir.rstrip('/')}/.clustercheck-{members[0].transport.run_id}"]


def run(members: list[Member], ctx: Context) -> list[CheckResult]:
    try:
        outcome = ctx.torch_job.outcome(NAME, members, ctx)
    except (launch.LaunchError, TransportError, OSError) as exc:
        return [
            registry.emit(name, Status.ERROR, f"{name}: {exc}", remediation=launch.launch_fix(exc))
            for name in (ddp.NAME, ddp.CHECKPOINT)
        ]
    results = [
        ddp.evaluate(outcome.records, outcome.world_size),
        ddp.evaluate_checkpoint(outcome.records, outcome.world_size),
    ]
    return torchjob.judged(results, outcome)
