"""local.* (the node-local collectives) where the core stage left them to the run's torch job (shared.defers_local):
the job's node-local part when it ran one, else each node's own node-local job, all nodes at once (the run's
multi-node stages did not get as far as the torch job).
"""

from __future__ import annotations

import contextlib

from clustercheck.checks import registry
from clustercheck.inventory import Node
from clustercheck.model import CheckResult, Status
from clustercheck.reach import Reach
from clustercheck.run.abort import Abort
from clustercheck.run.multinode import StagesRan
from clustercheck.run.record import RunRecord
from clustercheck.run.results import deselect
from clustercheck.stages import core, localjob, shared


def node_local(
    nodes: list[Node], record: RunRecord, ran: StagesRan, reach: Reach, abort: Abort
) -> dict[str, list[CheckResult]]:
    """Node -> its local.* results, for every node whose facts were collected (none where the core stage ran
    them itself)."""
    ctx = ran.ctx
    config = ctx.config
    if not shared.defers_local(ctx.hosts, config.selection):
        return {}
    job = ran.job
    members = {m.name: m for m in ran.members}
    part = None
    if job is not None and shared.LOCAL in job.parts and job.ran:
        with contextlib.suppress(Exception):  # it did not start: each node runs its own job below
            part = job.outcome(shared.LOCAL, ran.members, ctx)
    names = [n.name for n in nodes if record.ready(n.name)]

    def local(name: str) -> list[CheckResult]:
        if part is not None and name in members:
            return [deselect(r, config.selection) for r in shared.local_results(members[name], part)]
        abort.step(name, "collectives on the node")
        return localjob.local_collectives(record.facts[name], record.transports[name], ctx)

    found = reach.each(local, names, limit=config.forks, name=lambda n: n)
    results: dict[str, list[CheckResult]] = {}
    for i, name in enumerate(names):
        got = found.get(i)
        if isinstance(got, core.Aborted):
            raise got
        if isinstance(got, BaseException):
            got = [
                registry.get("internal").result(
                    name, registry.Finding(Status.ERROR, f"clustercheck failed: {type(got).__name__}: {got}")
                )
            ]
        results[name] = got
    return results
