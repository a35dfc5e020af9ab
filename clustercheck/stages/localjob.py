"""The node-local collectives (local.*): a torch job over one node's own ranks, on its loopback, run by the core stage
(or by the run's shared torch job: stages/shared.py)."""

from __future__ import annotations

from clustercheck.checks import registry
from clustercheck.checks.collectives import COLLECTIVES, LOCAL_PREFIX
from clustercheck.facts.model import NodeFacts
from clustercheck.model import CheckResult
from clustercheck.stages import Context, Member, collectives, network, nodeprogram
from clustercheck.transport import Transport

LOCAL_NAMES = tuple(LOCAL_PREFIX + n for n in COLLECTIVES)


def local_collectives(facts: NodeFacts, transport: Transport, ctx: Context) -> list[CheckResult]:
    """local.* on one node; not run when deselected, when torch does not import, or on a one-node run whose
    collectives stage is this very job."""
    name = facts.host
    selection = ctx.config.selection
    checks = [registry.get(n) for n in LOCAL_NAMES]
    if len(ctx.hosts) == 1 and selection.stage_selected("collectives"):
        why = "on one node the collectives stage runs this very job"
        return [c.not_run(name, why) for c in checks]
    if not any(selection.check_selected(n) for n in LOCAL_NAMES):
        return [c.not_run(name, selection.why_not_check(c.name)) for c in checks]
    problem = facts.torch_problem
    if problem:
        return [c.not_run(name, "torch does not import") for c in checks]
    member = Member(facts.node, transport, facts, "127.0.0.1", "lo", None, facts.gpus_for_torch)
    results = collectives.run_local(member, ctx, local_port(transport, facts.python))
    return [
        r if selection.check_selected(r.name) else registry.get(r.name).not_run(name, selection.why_not_check(r.name))
        for r in results
    ]


def local_port(transport: Transport, python: str) -> int:
    """A port free on the node's loopback for its node-local job, never the master port: a stale process there is
    the network stage's finding (network.master_port), not the node-local collectives'."""
    answer = nodeprogram.bundled(transport, python, "netprobe", "free-port", timeout=30, kind=int)
    if answer.value is not None and 1024 <= answer.value <= 65535:
        return answer.value
    return network.pick_ephemeral_port()
