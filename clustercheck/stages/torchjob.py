"""A torch stage's job: its worker planned on every member (stages/launch.py), run by the one torch-job runner
(stages/runner.py: one deadline, every node stopped when one fails or the progress watchdog names a stall), then
the rank records and logs brought back and the job's end told as the stage's findings.

The outcome names the first node that failed with its last error lines, or the stall the watchdog found. This
module knows which ranks each node runs, so ranks that sent no result are reported as that node's, with why (it
did not answer when the results were collected); a node that does not answer is neither waited for nor asked again.
"""

from __future__ import annotations

import contextlib
import io
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from clustercheck.checks import registry
from clustercheck.model import CheckResult, Status
from clustercheck.remote.common import RAILS_ENV
from clustercheck.stages import Context, Member, bundle, launch, nodeprogram, runner
from clustercheck.transport import CommandResult, TransportError

COLLECT_TIMEOUT = 60.0  # seconds a node gets to hand back its records, and its logs (at most the stall timeout)
ERROR_LINES = 6


@dataclass
class JobOutcome:
    records: list[dict]
    world_size: int
    backend: str
    failure: str | None = None  # why the job did not complete, naming the first node that failed
    data: dict = field(default_factory=dict)
    parts: dict[str, JobOutcome] = field(default_factory=dict)  # a job of several parts: each part's own outcome
    ranks: dict[str, list[int]] = field(default_factory=dict)  # node -> the global ranks it ran
    _by_node: dict[str, list[dict]] | None = field(default=None, init=False, repr=False, compare=False)

    def of_node(self, name: str) -> list[dict]:
        """NAME's records (their "node": the inventory name), in their order, from an index made once: each node's
        judgement filtering every record was nodes x ranks (at 4,000 nodes of 8 ranks, 128 million comparisons
        per judgement; benchmarks/scale_simulation.py)."""
        if self._by_node is None:
            index: dict[str, list[dict]] = {}
            for record in self.records:
                index.setdefault(record.get("node"), []).append(record)
            self._by_node = index
        return self._by_node.get(name, [])


def _tail(result: CommandResult, lines: int = ERROR_LINES) -> list[str]:
    text = (result.stdout + "\n" + result.stderr).splitlines()
    return [line.rstrip() for line in text if line.strip(" =-")][-lines:]


def _exit(result: CommandResult, answers: bool, channel: str) -> str:
    if result.exit_status is not None:
        return f"exit {result.exit_status}"
    return "no exit status: killed or disconnected" if answers else f"no exit status: {channel} does not answer"


def run(
    members: list[Member],
    worker: str,
    ctx: Context,
    *,
    stage: str | None = None,
    worker_args: list[str] | None = None,
    master_port: int | None = None,
    single_node: bool = False,
    parts: list[str] | None = None,
) -> JobOutcome:
    """Run WORKER (a program of the node-side bundle) under torchrun on every member at once. SINGLE_NODE: one
    member runs alone, its ranks meeting on 127.0.0.1 (the node-local collectives). Logs and records land in the
    member's host directory under STAGE (default: WORKER). PARTS: the worker runs these parts one after the other
    (remote/stages.py), each rank's record of each naming its part; each part's outcome is told on its own (a part
    every rank completed has no failure, whatever happened to the job after it)."""
    config = ctx.config
    stage = stage or worker
    backend = launch.choose_backend([m.gpus for m in members])
    plans = plan(members, worker, ctx, stage, backend, worker_args, master_port or config.master_port, single_node)
    by_name = {m.name: m for m in members}
    for p in plans:
        bundle.install(by_name[p.node.name].transport)
        (config.host_dir(p.node.name) / f"{stage}.command").write_text(p.shell() + "\n")
    ran = runner.run(
        plans, members, ctx.reach, timeout=config.job_timeout, watch=runner.Watch(stage, config.stall_timeout)
    )
    world = launch.world_size(plans)
    outcome = JobOutcome([], world, backend, data={"world_size": world, "backend": backend})
    problems = bring_back(members, ran, stage, ctx, outcome)
    ranks = outcome.ranks = launch.ranks_by_node(plans)
    channels = {m.name: m.transport.channel for m in members}
    missing = missing_ranks(outcome.records, ranks) if parts is None else {}
    if missing:
        outcome.data["missing_ranks_by_node"] = missing
    tell(outcome, ran, channels, missing, problems, stage, config)
    for name in parts or []:
        records = [r for r in outcome.records if r.get("part") == name]
        part = JobOutcome(records, world, backend, data=dict(outcome.data), ranks=ranks)
        missing = missing_ranks(part.records, ranks)
        if missing:
            part.data["missing_ranks_by_node"] = missing
            tell(part, ran, channels, missing, problems, stage, config, part=name)
        else:  # every rank completed this part: what happened to the job later is not this part's failure
            for key in ("first_failed_node", "error_lines", "failed_rank", "timed_out", "stalled_nodes", "progress"):
                part.data.pop(key, None)
        outcome.parts[name] = part
    return outcome


def plan(
    members: list[Member],
    worker: str,
    ctx: Context,
    stage: str,
    backend: str,
    worker_args: list[str] | None,
    port: int,
    single_node: bool,
) -> list[launch.NodeLaunch]:
    """WORKER's torchrun line on every member (launch.plan), NCCL and Gloo on each node's own cluster interface
    (loopback for a SINGLE_NODE job)."""
    config = ctx.config
    specs = [
        launch.NodeSpec(
            m.name,
            "127.0.0.1" if single_node else m.address,
            m.gpus,
            m.facts.torch_python,
            m.transport.workdir.rstrip("/"),
            config.container,
        )
        for m in members
    ]
    per_node_env = {}
    for m in members:
        iface = "lo" if single_node else m.interface
        if iface:
            per_node_env[m.name] = {"NCCL_SOCKET_IFNAME": iface, "GLOO_SOCKET_IFNAME": iface}
        if m.node.rail_interfaces and not single_node:  # each rank binds its own rail (remote/common.py)
            per_node_env.setdefault(m.name, {})[RAILS_ENV] = ",".join(m.node.rail_interfaces)
    return launch.plan(
        specs,
        worker=worker,
        stage=stage,
        master_port=port,
        interface="lo" if single_node else members[0].interface,
        worker_args=worker_args,
        nproc_override=config.nproc_per_node,
        backend=backend,
        extra_env=per_node_env,
    )


def bring_back(members: list[Member], ran: runner.Ran, stage: str, ctx: Context, outcome: JobOutcome) -> dict[str, str]:
    """Every node's torchrun output into the run directory, and its rank records (into OUTCOME) and logs brought
    back, every node at once (one node after the other grew with the node count); returns why nothing came back
    from a node, by node."""
    brought = ctx.reach.each(lambda m: bring_back_one(m, ran, stage, ctx), members, name=lambda m: m.name)
    problems: dict[str, str] = {}
    for i, m in enumerate(members):
        if isinstance(brought[i], BaseException):
            raise brought[i]
        got, problem = brought[i]
        outcome.records += got
        if problem:
            problems[m.name] = problem
    return problems


def bring_back_one(m: Member, ran: runner.Ran, stage: str, ctx: Context) -> tuple[list[dict], str | None]:
    """M's torchrun output into the run directory, its rank records and logs brought back; with why nothing came
    back from a node that does not answer (it is not asked)."""
    config = ctx.config
    result = ran.ends[m.name][1] if m.name in ran.ends else CommandResult(None, "", "no result")
    (config.host_dir(m.name) / f"{stage}.torchrun.log").write_text(result.stdout + result.stderr)
    if m.name in ran.silent:  # it does not answer: nothing to bring back
        return [], f"{m.transport.channel} does not answer"
    timeout = min(COLLECT_TIMEOUT, config.stall_timeout)
    try:
        got = nodeprogram.run(
            m.transport, launch.collect_command(m.facts.python, m.transport.workdir, stage), timeout=timeout
        )
    except (TransportError, OSError) as exc:
        return [], f"its results could not be collected: {exc}"
    if got.exit_status is None:
        return [], f"{m.transport.channel} did not answer within {timeout:.0f} s when the results were collected"
    records, logs = launch.parse_collected(got.stdout)
    if logs is not None:
        keep_files(logs, config.host_dir(m.name))
    for record in records:
        record["node"] = m.name  # the inventory name (the record's host is the node's hostname)
    return records, None if got.ok else f"its results could not be collected: {got.cause()}"


def missing_ranks(records: list[dict], ranks: dict[str, list[int]]) -> dict[str, list[int]]:
    """Node -> its ranks (RANKS: each node's) that sent no record, for the nodes with any."""
    seen = {r.get("rank") for r in records}
    missing = {name: [r for r in node_ranks if r not in seen] for name, node_ranks in ranks.items()}
    return {name: node_ranks for name, node_ranks in missing.items() if node_ranks}


def tell(
    outcome: JobOutcome,
    ran: runner.Ran,
    channels: dict[str, str],
    missing: dict[str, list[int]],
    problems: dict[str, str],
    stage: str,
    config,
    part: str | None = None,
) -> None:
    """Why the job did not complete, into OUTCOME (nothing when it did): the stall the watchdog named, else the node
    that failed first with its failing rank's own error, else the deadline, else the ranks whose results did not
    come back (MISSING), with why (PROBLEMS). PART: the part of a job of several this outcome is of."""
    first = runner.first_failure(ran.ends)
    timed_out = [name for name, (_, result, _) in ran.ends.items() if result.timed_out]
    if ran.stall is not None:
        stall = ran.stall
        outcome.failure = f"{stall.message}; every node's job was stopped (--stall-timeout {config.stall_timeout:g})"
        outcome.data.update(stall.data)
        outcome.data["first_failed_node"] = stall.nodes[0] if len(stall.nodes) == 1 else None
    elif first is not None:
        name, result = first
        outcome.failure, lines, rank = failed_first(name, result, _exit(result, name not in ran.silent, channels[name]))
        if rank is not None:
            outcome.data["failed_rank"] = rank
        outcome.data.update({"first_failed_node": name, "error_lines": lines})
    elif timed_out or any(not r.ok for _, r, _ in ran.ends.values()):
        outcome.failure = (
            f"the {stage} job timed out after {config.job_timeout:.0f} s (--timeout)"
            + (f" before its {part} part ended" if part else "")
            + "; every node's job was "
            f"stopped (waiting: {', '.join(sorted(timed_out)) or 'all nodes'})"
        )
        outcome.data.update({"timed_out": True, "first_failed_node": None, "job_timeout": config.job_timeout})
    elif missing:  # every torchrun ended well, yet some ranks' results did not come back: say whose, and why
        outcome.failure = "; ".join(
            f"no result from {name}'s rank(s) {', '.join(map(str, node_ranks))}"
            + (
                f": {problems[name]}"
                if name in problems
                else f" (its torchrun's output: hosts/{name}/{stage}.torchrun.log)"
            )
            for name, node_ranks in missing.items()
        )
        outcome.data["first_failed_node"] = next(iter(missing)) if len(missing) == 1 else None


def failed_first(name: str, result: CommandResult, how: str) -> tuple[str, list[str], int | None]:
    """The failure of the job whose torchrun failed on NAME first (HOW: its exit, in words): the failing rank's
    own error when its output holds one (not torchrun's report about it), else its last lines; with those lines
    and the failing rank."""
    cause = runner.node_cause(result)
    if cause is not None:
        text = f"torchrun failed on {name} first ({how}): {cause.text()}; every node's job was stopped"
        return text, list(cause.lines), cause.rank
    lines = _tail(result)
    text = f"torchrun failed on {name} first ({how}); every node's job was stopped. Last lines from {name}: "
    return text + " | ".join(lines), lines, None


def keep_files(archive: bytes, target: Path) -> None:
    """The regular files of ARCHIVE (a gzipped tar from a node) under TARGET, their directories made as needed, and
    nothing else: no link, device, absolute name or name climbing out, no owner, mode or time taken from the
    archive. An archive that cannot be read is left, as far as it went (the logs are best effort)."""
    made: set[Path] = set()
    with (
        contextlib.suppress(tarfile.TarError, OSError, EOFError, zlib.error),
        tarfile.open(fileobj=io.BytesIO(archive)) as tar,
    ):
        for member in tar:
            parts = member.name.split("/")
            if not member.isfile() or member.name.startswith("/") or ".." in parts:
                continue
            path = target.joinpath(*parts)
            if path.parent not in made:
                path.parent.mkdir(parents=True, exist_ok=True)
                made.add(path.parent)
            source = tar.extractfile(member)
            if source is not None:
                path.write_bytes(source.read())


def judged(results: list[CheckResult], outcome: JobOutcome) -> list[CheckResult]:
    """RESULTS as they stand, or, when the job did not complete, its non-passing results turned into FAILs that
    say why; a per-node result of a node other than the one(s) the failure names becomes a SKIP saying why (new
    results, nothing changed in place)."""
    if not outcome.failure:
        return results
    named = outcome.data.get("stalled_nodes") or [outcome.data.get("first_failed_node")]
    out = []
    first: str | None = None  # the first check the job's failure failed: the fix is said there, once
    for r in results:
        if (
            r.host
            and r.status in (Status.FAIL, Status.ERROR, Status.SKIP)
            and None not in named
            and r.host not in named
        ):
            # A check of a node the failure does not name: it could not run to the end there, through no fault of
            # that node's; its result is kept, as a SKIP saying why.
            r = registry.emit(
                r.name,
                Status.SKIP,
                f"did not run to the end: {outcome.failure}",
                host=r.host,
                data={**r.data, **outcome.data},
            )
        elif r.status in (Status.FAIL, Status.ERROR, Status.SKIP):
            where = f"{r.host}: " if r.host else ""
            r = registry.emit(
                r.name,
                Status.FAIL,
                f"{where}{r.name} did not complete: {outcome.failure}",
                host=r.host,
                remediation=_job_fix(outcome, first),
                data={**r.data, **outcome.data},
            )
            first = first or r.name
        out.append(r)
    return out


def _job_fix(outcome: JobOutcome, first: str | None) -> str:
    """The fix of a check the job's failure failed: for a job stopped at its deadline, raise --timeout, said on the
    first such check only (FIRST: its name; the others point there); for a stall its ranks' connections explain,
    what they say to do (checks/waits.py); else where to read why a rank died."""
    connections = outcome.data.get("connections")
    if isinstance(connections, dict) and connections.get("fix"):
        return connections["fix"]
    if outcome.data.get("timed_out"):
        if first is not None:
            return f"The same job as {first}: see its fix."
        seconds = outcome.data.get("job_timeout")
        given = f" (it was {seconds:g} s)" if isinstance(seconds, (int, float)) else ""
        return (
            f"Raise --timeout{given}: the job was still running when its deadline stopped it, which says nothing "
            "of the cluster; a slow first start (torch's import, NCCL's setup) takes tens of seconds."
        )
    return (
        "Look at the node's rank logs in the run directory (hosts/<node>/torch/ for the run's torch job, "
        "hosts/<node>/local-collectives/ for a node-local job of its own); a killed rank or a node that cannot reach "
        "the master are the usual causes."
    )
