"""The detached jobs after their start (`clustercheck jobs`, `logs`, `stop`): their nodes reached again (from --hosts,
or the job's record on this machine), each node asked (detached.py's command lines and answers), the nodes that
could not be asked named. A Slurm job id goes to Slurm instead (batchjob.py).
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable, Iterator

from clustercheck import hosts
from clustercheck.exitcodes import UsageError, WorkFailed
from clustercheck.inventory import Node
from clustercheck.launcher import batchjob, detached, records
from clustercheck.launcher.connections import Connections
from clustercheck.launcher.job import HostKeysRefused
from clustercheck.reach import Fanout
from clustercheck.slurm import parse
from clustercheck.transport import CommandResult, factory
from clustercheck.transport.params import SshSettings

Echo = Callable[[str], None]


def listed(
    hosts_spec: str | None, limit: str | None, ssh: hosts.SshOptions, show_all: bool, echo: Echo, say: Echo
) -> None:
    """The detached jobs on the nodes of --hosts: id, when it started, its state on every node (SHOW_ALL: also the
    jobs that ended)."""
    if hosts_spec is None:
        raise UsageError("give the nodes: --hosts INVENTORY (or --slurm for the launches submitted to Slurm)")
    nodes, settings = hosts.load(hosts_spec, limit, ssh)
    with _reached(nodes, settings) as reach:
        answers = reach.run(lambda name: detached.list_command())
    not_asked = _not_asked(reach, answers)
    per_job: dict[str, dict[str, detached.NodeJob]] = {}
    for node in nodes:
        result = answers.get(node.name)
        if result is None or node.name in not_asked:
            continue
        for job in detached.parse_list(result.stdout):
            per_job.setdefault(job.job, {})[node.name] = job
    shown = 0
    for job_id, where in sorted(per_job.items(), key=lambda kv: min(j.started or 0 for j in kv[1].values())):
        if not show_all and not any(j.running for j in where.values()):
            continue
        started = min((j.started for j in where.values() if j.started), default=None)
        when = dt.datetime.fromtimestamp(started).strftime("%Y-%m-%d %H:%M:%S") if started else "?"
        states = {n.name: where.get(n.name) for n in nodes if n.name in where}
        echo(f"{job_id}  {when}  {detached.summary(states)}")
        shown += 1
    if not_asked:
        raise _unasked_error(not_asked, len(nodes), "so their jobs are not listed")
    if not shown:
        say("no running jobs" if not show_all else "no jobs")


def logs(
    job: str, follow: bool, hosts_spec: str | None, limit: str | None, ssh: hosts.SshOptions, echo: Echo, say: Echo
) -> None:
    """Job JOB's output from every node, each line prefixed with node/rank (FOLLOW: until it ends everywhere)."""
    if parse.is_job_id(job):
        batchjob.logs(job, follow, echo, say)
        return
    nodes, settings, record = _job_nodes(job, hosts_spec, limit, ssh)
    with _reached(nodes, settings) as reach:
        for name, error in sorted(reach.errors.items()):
            say(_named({name: error}))
        first_ranks = record.first_ranks if record else None
        results = reach.stream(detached.logs_command(job, follow), echo, first_ranks)
    not_asked = _not_asked(reach, results)
    missing = [name for name, r in results.items() if detached.no_job(r.exit_status)]
    if missing and len(missing) == len(nodes):
        raise UsageError(f"no job {job} on {', '.join(missing)}")
    for name in missing:
        say(f"no job {job} on {name}")
    if not_asked:
        raise _unasked_error(not_asked, len(nodes), "so their output is not shown")


def stop(job: str, hosts_spec: str | None, limit: str | None, ssh: hosts.SshOptions, echo: Echo) -> None:
    """Stop job JOB on every node (SIGTERM, then SIGKILL after detached.STOP_TIMEOUT); its output stays there."""
    if parse.is_job_id(job):
        batchjob.stop(job, echo)
        return
    nodes, settings, _ = _job_nodes(job, hosts_spec, limit, ssh)
    with _reached(nodes, settings) as reach:
        results = reach.run(lambda name: detached.stop_command(job), timeout=detached.STOP_TIMEOUT + 45)
    not_asked = _not_asked(reach, results)
    problems = [f"{len(not_asked)} of {len(nodes)} node(s) not reached: {_named(not_asked)}"] if not_asked else []
    for name, result in results.items():
        if name in not_asked:
            continue
        if detached.no_job(result.exit_status):
            echo(f"{name}: no job {job}")
        elif result.ok:
            echo(f"{name}: {detached.stopped(result.stdout)}")
        else:
            problems.append(f"{name}: {result.cause()}")
    if not not_asked and all(detached.no_job(r.exit_status) for r in results.values()):
        raise UsageError(f"no job {job} on any node")
    if problems:
        raise WorkFailed("could not stop the job everywhere: " + "; ".join(problems))


def _job_nodes(
    job: str, hosts_spec: str | None, limit: str | None, ssh: hosts.SshOptions
) -> tuple[list[Node], SshSettings, records.JobRecord | None]:
    """The nodes of JOB: from --hosts when given, else from the job's record on this machine (its inventory, and
    the SSH files it was launched with unless given again)."""
    if not detached.JOB_ID.match(job):
        raise UsageError(f"{job}: not a job id (12 hexadecimal digits, as clustercheck launch --detach printed)")
    record = None
    if hosts_spec is None:
        try:
            record = records.load(job)
        except records.RecordError as exc:
            raise UsageError(str(exc)) from exc
        hosts_spec, limit = record.hosts, record.limit
        ssh = hosts.SshOptions(
            config=ssh.config or record.ssh_config,
            known_hosts=ssh.known_hosts or tuple(record.known_hosts),
            accept_new_host_keys=ssh.accept_new_host_keys,
            connect_timeout=ssh.connect_timeout,
        )
    nodes, settings = hosts.load(hosts_spec, limit, ssh)
    if record is not None:
        nodes = [n for n in nodes if n.name in record.nodes] or nodes
    return nodes, settings, record


@contextlib.contextmanager
def _reached(nodes: list[Node], settings: SshSettings) -> Iterator[Connections]:
    """Connections to NODES for the block's length; a refused host key is a usage error."""
    connections = Connections(nodes, Fanout(factory.default(settings)))
    try:
        reach = connections.__enter__()
    except HostKeysRefused as exc:
        raise UsageError(f"host key verification failed: {exc}") from exc
    try:
        yield reach
    finally:
        connections.__exit__()


def _not_asked(reach: Connections, results: dict[str, CommandResult]) -> dict[str, str]:
    """The nodes a jobs/logs/stop command could not ask: not reached, or the connection lost (no exit status)."""
    lost = {name: r.cause() for name, r in results.items() if r.exit_status is None}
    unanswered = {n.name: "no answer" for n in reach.nodes if n.name not in results and n.name not in reach.errors}
    return {**unanswered, **reach.errors, **lost}


def _named(errors: dict[str, str]) -> str:
    """node -> error as one clause per node; a transport's message names its node already."""
    return "; ".join(e if e.startswith(name) else f"{name}: {e}" for name, e in sorted(errors.items()))


def _unasked_error(not_asked: dict[str, str], total: int, what: str) -> WorkFailed:
    return WorkFailed(f"could not ask {len(not_asked)} of {total} node(s), {what}: {_named(not_asked)}")
