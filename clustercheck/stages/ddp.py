"""The DDP stage: torchrun on every node, DDP against a single-process reference (checks/ddp.py judges it)."""

from __future__ import annotations

from clustercheck.checks import ddp, registry
from clustercheck.model import CheckResult, Status
from clustercheck.stages import Context, Member, launch, torchjob
from clustercheck.transport import TransportError

NAME = "ddp"


def run(members: list[Member], ctx: Context) -> list[CheckResult]:
    args: list[str] = []
    if ctx.config.shared_dir:  # the checkpoint round trip goes through the shared directory
        args += ["--checkpoint-dir", f"{ctx.config.shared_dir.rstrip('/')}/.clustercheck-{members[0].transport.run_id}"]
    try:
        outcome = torchjob.run(members, "ddp", ctx, worker_args=args or None)
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
