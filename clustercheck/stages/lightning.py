"""The lightning stage: where Lightning imports on every node, a Lightning job across every node launched by
torchrun on every node (Trainer(num_nodes=N, devices=K, strategy="ddp")), judged against a single-process Lightning
run (checks/lightning.py). Where it does not import, the stage is SKIP with the reason, or FAIL when
--only lightning asked for it."""

from __future__ import annotations

from clustercheck.checks import lightning, registry
from clustercheck.model import CheckResult, Status
from clustercheck.stages import Context, Member, launch, nodeprogram, torchjob
from clustercheck.transport import TransportError

NAME = "lightning"


def _probe(m: Member, ctx: Context) -> dict:
    """Whether Lightning imports on the node (in the image with --container): the `lightning probe` program's
    answer, or why there is none."""
    box = ctx.config.container
    answer = nodeprogram.bundled(
        m.transport,
        m.facts.torch_python,
        "lightning",
        "probe",
        timeout=ctx.config.command_timeout,
        kept=ctx.config.host_dir(m.name) / "lightning-probe.json",
        wrap=None if box is None else lambda argv: box.run(argv, workdir=m.transport.workdir, gpus=m.gpus > 0),
        name="lightning probe",
        # Lightning's import makes torch's compile cache directory: in the run's work directory, as the torch jobs'.
        env={"TORCHINDUCTOR_CACHE_DIR": launch.inductor_cache(m.transport.workdir)},
    )
    if answer.failure is not None:
        return {"ok": False, "error": answer.failure.cause}
    return answer.value


def run(members: list[Member], ctx: Context) -> list[CheckResult]:
    required = NAME in ctx.config.selection.only
    check = lightning.IMPORT_CHECK
    outcomes = ctx.reach.each(lambda m: _probe(m, ctx), members, name=lambda m: m.name)
    results = []
    for i, m in enumerate(members):
        got = outcomes.get(i)
        error = f"{type(got).__name__}: {got}" if isinstance(got, BaseException) else None
        answer = got if isinstance(got, dict) else None
        results.append(check.result(m.name, lightning.import_finding(answer, error, required)))
    missing = [r.host for r in results if r.status is not Status.PASS]
    if missing:
        why = f"Lightning does not import on {', '.join(str(h) for h in missing)}"
        if not required:
            return [*results, registry.get(lightning.NAME).not_run(None, why)]
        failed = registry.emit(
            lightning.NAME, Status.FAIL, f"{lightning.NAME} failed: {why}", remediation=lightning.INSTALL
        )
        return [*results, failed]

    backend = launch.choose_backend([m.gpus for m in members])
    per_node = {launch.ranks_per_node(m.gpus, backend, ctx.config.nproc_per_node) for m in members}
    if len(per_node) > 1:
        return [
            *results,
            registry.emit(
                lightning.NAME,
                Status.FAIL,
                f"Lightning needs the same number of devices on every node; these nodes have {sorted(per_node)}",
                remediation="Give every node the same GPUs, or run with --nproc-per-node.",
            ),
        ]
    args = ["--num-nodes", str(len(members)), "--devices", str(per_node.pop())]
    try:
        outcome = torchjob.run(members, "lightning", ctx, worker_args=args)
    except (launch.LaunchError, TransportError, OSError) as exc:
        return [
            *results,
            registry.emit(lightning.NAME, Status.ERROR, f"{lightning.NAME}: {exc}", remediation=launch.launch_fix(exc)),
        ]
    return results + torchjob.judged([lightning.evaluate(outcome.records, outcome.world_size, len(members))], outcome)
