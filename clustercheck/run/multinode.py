"""The multi-node stages, in their declared order (selection.DISTRIBUTED), over every node the core stage reached:
each stage run or said SKIP with why (the selection, a node missing, torch missing, an earlier gating stage failed),
the run's one torch job planned as the first torch stage is about to run, and each stage's time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from clustercheck.checks import registry
from clustercheck.inventory import Node
from clustercheck.model import CheckResult, Skip
from clustercheck.run.abort import Abort
from clustercheck.run.record import RunRecord
from clustercheck.run.results import deselect
from clustercheck.selection import DISTRIBUTED, Selection
from clustercheck.selection import stage as declared
from clustercheck.stages import Context, Member, core, localjob, modules, shared


@dataclass(frozen=True)
class StagesRan:
    results: list[CheckResult]
    members: list[Member]  # the nodes of the multi-node stages (none when a node was missing)
    job: shared.SharedJob | None  # the run's torch job, when a torch stage planned one
    ctx: Context  # the run's context as the stages had it: a master port of its own for a node alone
    durations: dict[str, float]  # stage -> seconds it ran, for the stages that ran


def run_stages(nodes: list[Node], record: RunRecord, ctx: Context, abort: Abort, later: bool) -> StagesRan:
    """Every multi-node stage over NODES, from what the core stage left in RECORD. LATER: a multi-node stage is
    selected (a node alone then gets a master port of its own)."""
    config = ctx.config
    members: list[Member] = []
    blocked = _blocked(nodes, record)
    if not blocked:
        members = core.members(nodes, record.transports, record.facts)
    if len(members) == 1 and later and not config.master_port_given:  # alone: a port of its own
        port = localjob.local_port(members[0].transport, members[0].facts.python)
        config = replace(config, master_port=port)
        ctx = replace(ctx, config=config)
    no_torch = [m.name for m in members if m.facts.torch_problem]
    results: list[CheckResult] = []
    durations: dict[str, float] = {}
    job: shared.SharedJob | None = None
    staged = ctx  # with the torch job, once planned
    for stage in DISTRIBUTED:
        module = modules()[stage]
        checks = registry.of_stage(stage)
        why = why_not(config.selection, stage, blocked)
        if not why and declared(stage).needs_torch and no_torch:
            why = f"torch does not import on {', '.join(no_torch)}"
        if why:
            for check in checks:
                results += registry.skipped(check, list(ctx.hosts), why)
            continue
        abort.check()
        if declared(stage).needs_torch and job is None:
            job = _plan_torch_job(stage, members, ctx)
            staged = replace(ctx, torch_job=job)
        for m in members:
            ctx.progress(m.name, stage)
        started = time.monotonic()
        stage_results = [deselect(r, config.selection) for r in module.run(members, staged)]
        durations[stage] = time.monotonic() - started
        results += stage_results
        problems = [r for r in stage_results if r.status.is_problem]
        if problems and declared(stage).gates:
            blocked = f"the {stage} stage failed ({problems[0].message})"
            if stage == "network":
                blocked = f"the network stage failed, so no torch job was started ({problems[0].message})"
    _torch_durations(job, durations)
    return StagesRan(results, members, job, ctx, durations)


def _blocked(nodes: list[Node], record: RunRecord) -> str | None:
    """Why a multi-node job cannot run (None: every node is ready for it)."""
    missing = {
        n.name: f"the same machine as {record.same[n.name]} (nodes.distinct)"
        if n.name in record.same
        else "not reached, or its facts were not collected"
        for n in nodes
        if not record.ready(n.name)
    }
    if not missing:
        return None
    return "; ".join(f"{name}: {why}" for name, why in sorted(missing.items())) + " (a multi-node job needs every node)"


def why_not(selection: Selection, stage: str, blocked: str | None) -> str | Skip | None:
    """Why multi-node STAGE does not run (None: it runs), as far as the SELECTION and the nodes (BLOCKED: why
    a multi-node job cannot run) decide it."""
    checks = registry.of_stage(stage)
    if not selection.stage_selected(stage):
        return selection.why_not_stage(stage)
    if not any(selection.check_selected(c.name) for c in checks):
        return selection.why_not_checks(c.name for c in checks)
    return blocked


def _plan_torch_job(first: str, members: list[Member], ctx: Context) -> shared.SharedJob:
    """The run's torch job, as torch stage FIRST is about to run: the node-local collectives when the core
    stage left them to it, and the part of FIRST and of every torch stage after it that is to run (a stage
    that cannot take part says why when it runs)."""
    selection = ctx.config.selection
    parts: dict[str, list[str]] = {}
    if shared.defers_local(ctx.hosts, selection) and any(selection.check_selected(n) for n in localjob.LOCAL_NAMES):
        parts[shared.LOCAL] = []
    for stage in DISTRIBUTED[DISTRIBUTED.index(first) :]:
        if declared(stage).needs_torch and not why_not(selection, stage, None):
            args = modules()[stage].part_args(members, ctx)
            if args is not None:
                parts[stage] = args
    return shared.SharedJob(parts)


def _torch_durations(job: shared.SharedJob | None, durations: dict[str, float]) -> None:
    """The torch stages' times from the run's torch JOB: the first stage that ran it waited for all of it;
    each later stage's time is its own part's on its slowest rank, taken off the first's, which keeps the job's
    start (torchrun, torch's import, the process group), the node-local part and the results' collection."""
    if job is None:
        return
    ran = [s for s in DISTRIBUTED if s in job.parts and s in durations]
    for stage in ran[1:]:
        seconds = job.seconds(stage)
        if seconds is not None:
            durations[stage] = seconds
            durations[ran[0]] = max(durations[ran[0]] - seconds, 0.0)
