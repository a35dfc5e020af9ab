"""The lightning stage: its part of the run's torch job (stages/shared.py). Every rank imports Lightning there; where
it imports on every rank, Trainer(num_nodes=N, devices=K, strategy="ddp") trains on the job's process group, judged
against a single-process Lightning run (checks/lightning.py). Where it does not import, the stage is SKIP with the
reason, or FAIL when --only lightning asked for it."""

from __future__ import annotations

from clustercheck.checks import lightning, registry
from clustercheck.model import CheckResult, Status
from clustercheck.stages import Context, Member, launch, torchjob
from clustercheck.transport import TransportError

NAME = "lightning"


def devices(members: list[Member], ctx: Context) -> set[int]:
    """The ranks per node of the torch job on MEMBERS: Lightning's devices, one number when every node has as many."""
    backend = launch.choose_backend([m.gpus for m in members])
    return {launch.ranks_per_node(m.gpus, backend, ctx.config.nproc_per_node) for m in members}


def part_args(members: list[Member], ctx: Context) -> list[str] | None:
    """Its part's arguments in the run's torch job: the job's shape as Trainer(num_nodes, devices) takes it; None
    when the nodes run different numbers of ranks (run says so)."""
    per_node = devices(members, ctx)
    if len(per_node) > 1:
        return None
    return ["--num-nodes", str(len(members)), "--devices", str(per_node.pop())]


def imports(members: list[Member], outcome: torchjob.JobOutcome, required: bool) -> list[CheckResult]:
    """lightning.import per node: what its first rank's import of Lightning said in the job, or why there is none."""
    check = lightning.IMPORT_CHECK
    results = []
    for m in members:
        said = next((r["import"] for r in outcome.of_node(m.name) if "import" in r), None)
        if said is None and outcome.failure:
            results.append(check.not_run(m.name, "the torch job ended before its ranks imported Lightning here"))
            continue
        why = None if said else "no rank of this node reported its import of Lightning"
        results.append(check.result(m.name, lightning.import_finding(said, why, required)))
    return results


def run(members: list[Member], ctx: Context) -> list[CheckResult]:
    required = NAME in ctx.config.selection.only
    per_node = devices(members, ctx)
    if len(per_node) > 1:
        return [
            *[lightning.IMPORT_CHECK.not_run(m.name, "Lightning needs as many ranks on every node") for m in members],
            registry.emit(
                lightning.NAME,
                Status.FAIL,
                f"Lightning needs the same number of devices on every node; these nodes have {sorted(per_node)}",
                remediation="Give every node the same GPUs, or run with --nproc-per-node.",
            ),
        ]
    try:
        outcome = ctx.torch_job.outcome(NAME, members, ctx)
    except (launch.LaunchError, TransportError, OSError) as exc:
        return [
            *[lightning.IMPORT_CHECK.not_run(m.name, f"the torch job did not start: {exc}") for m in members],
            registry.emit(lightning.NAME, Status.ERROR, f"{lightning.NAME}: {exc}", remediation=launch.launch_fix(exc)),
        ]
    results = imports(members, outcome, required)
    missing = [r.host for r in results if r.status is not Status.PASS]
    if missing and not outcome.failure:
        why = f"Lightning does not import on {', '.join(str(h) for h in missing)}"
        if not required:
            return [*results, registry.get(lightning.NAME).not_run(None, why)]
        failed = registry.emit(
            lightning.NAME, Status.FAIL, f"{lightning.NAME} failed: {why}", remediation=lightning.INSTALL
        )
        return [*results, failed]
    return torchjob.judged([*results, lightning.evaluate(outcome.records, outcome.world_size, len(members))], outcome)
