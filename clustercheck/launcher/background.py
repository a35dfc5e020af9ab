"""A launched job under a systemd unit per node (--detach): started on every node, or stopped again on all of
them when one node cannot start it."""

from __future__ import annotations

from clustercheck.launcher import detached
from clustercheck.launcher.job import NotStarted, work_dir
from clustercheck.reach import Reach
from clustercheck.stages import Member, nodeprogram
from clustercheck.stages.launch import NodeLaunch


def start(
    reach: Reach, plans: list[NodeLaunch], members: list[Member], job_id: str, cwd: str | None, code: str | None
) -> list[str]:
    """The job's unit on every node (CODE: the synced archive in each node's work directory); returns the nodes.
    Raises NotStarted, after stopping the units that did start."""
    by_name = {m.name: m for m in members}
    problems: list[str] = []

    def begin(p: NodeLaunch) -> None:
        m = by_name[p.node.name]
        archive_path = f"{m.transport.workdir.rstrip('/')}/{code}" if code else None
        argv = detached.start_command(job_id, p.command, p.env, work_dir(m.node, cwd), archive_path)
        got = nodeprogram.run(m.transport, argv, timeout=60)
        if not got.ok:
            problems.append(f"{m.name}: {detached.start_problem(got.exit_status, got.stderr or got.cause())}")

    reach.each(begin, plans, timeout=90, name=lambda p: p.node.name)
    if problems:
        reach.each(
            lambda m: nodeprogram.run(m.transport, detached.discard_command(job_id), timeout=60),
            members,
            timeout=90,
            name=lambda m: m.name,
        )
        where = (
            "on any node"
            if len(problems) == len(plans)
            else f"on {len(problems)} of {len(plans)} node(s), so it was stopped on the others"
        )
        raise NotStarted(f"the detached job could not start {where}: " + "; ".join(sorted(problems)))
    return [p.node.name for p in plans]
