"""`clustercheck launch`, from what was asked to the exit status: where the job runs (the nodes over SSH, the Slurm
allocation this runs in, or a batch job submitted from the login node: batchjob.py), the options checked before
anything starts, then the Launch's steps (session.py) in the foreground or detached.
"""

from __future__ import annotations

import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from clustercheck import hosts
from clustercheck.config import DEFAULT_MASTER_PORT, NodeOptions, make_run_dir, shared
from clustercheck.exitcodes import ExitCode, JobNotStarted, UsageError
from clustercheck.hosts import SshOptions
from clustercheck.inventory import Node
from clustercheck.launcher import batchjob, codesync, leftout, records, session, spares
from clustercheck.launcher import command as launch_command
from clustercheck.launcher.job import HostKeysRefused, LaunchOptions, NotStarted
from clustercheck.reach import Fanout
from clustercheck.slurm import allocation, step, update
from clustercheck.slurm.call import DEADLINE, SlurmError
from clustercheck.slurm.request import Request
from clustercheck.stages.launch import LaunchError
from clustercheck.transport import factory
from clustercheck.transport.factory import Factory
from clustercheck.transport.params import SshSettings

Echo = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class LaunchRequest(NodeOptions):
    """What `clustercheck launch` was asked, each field an option of the command line, as given (--python,
    --container and --nproc-per-node: NodeOptions', config.py)."""

    job: tuple[str, ...]  # what follows --: torchrun's options, the script, its arguments
    hosts: str | None = None
    limit: str | None = None
    ssh: SshOptions = field(default_factory=SshOptions)
    slurm: bool = False
    request: Request = field(default_factory=Request)  # with --slurm outside an allocation: the batch job's nodes
    dry_run: bool = False
    master_port: int | None = None  # --master-port; None: the default port, or a free one on this machine alone
    env: tuple[str, ...] = ()
    sync: str | None = None
    chdir: str | None = None
    no_preflight: bool = False
    spare: int = 0  # --spare K: the allocation holds K nodes more than the job runs on
    detach: bool = False
    run_dir: str | None = None
    inner: tuple[str, ...] = ()  # the options given that the launch inside a batch job takes again, as argv


def launch(request: LaunchRequest, echo: Echo, say: Echo) -> int:
    """The launch REQUEST asks for; its exit status (the job's). ECHO: the job's output; SAY: clustercheck's lines."""
    r = request
    if r.sync and r.chdir:
        raise UsageError("--sync and --chdir: the job runs in the synced copy; give one of them")
    try:
        user_command = launch_command.parse(list(r.job))
        user_env = launch_command.parse_env(r.env)
    except LaunchError as exc:
        raise UsageError(str(exc)) from exc
    inside = allocation.inside() if r.slurm else None
    if r.hosts is None and not r.slurm:
        raise UsageError("give the nodes: --hosts INVENTORY, or --slurm (a batch job, or the allocation this runs in)")
    if r.dry_run and (not r.slurm or inside):
        raise UsageError("--dry-run: only with --slurm outside an allocation (it prints the batch script)")
    if r.spare and not r.slurm:
        raise UsageError("--spare: only with --slurm (the spare nodes are Slurm's, and the preflight's to choose)")
    if r.spare and r.no_preflight:
        raise UsageError("--spare and --no-preflight: the preflight chooses the nodes the job runs on; give one")
    if r.slurm and not inside:
        return _batch(r, say, echo)
    if r.slurm and r.detach:
        raise UsageError(
            f"--detach inside Slurm job {inside}: the job lives as long as this allocation; submit a batch job from "
            "the login node instead (clustercheck launch --slurm --nodes N --detach -- ...)"
        )
    nodes, ssh, connect = _nodes(r, inside)
    wanted = _wanted(r, inside, [n.name for n in nodes], say)
    try:
        launch_command.check_nnodes(user_command, wanted)
        if r.sync and not user_command.is_module:
            codesync.sync_script(Path(r.sync), user_command.script)
    except LaunchError as exc:
        raise UsageError(str(exc)) from exc
    _check_script(user_command, r, nodes)
    options = LaunchOptions(
        **shared(r, NodeOptions),
        command=user_command,
        run_dir=make_run_dir(r.run_dir, "launch-%Y%m%d-%H%M%S"),
        ssh=ssh,
        master_port=_master_port(r.master_port, nodes[:wanted]),
        env=user_env,
        sync=Path(r.sync) if r.sync else None,
        chdir=r.chdir,
        preflight=not r.no_preflight,
        spare=len(nodes) - wanted,
        detach=r.detach,
        inventory=hosts.inventory_path(r.hosts),
    )
    leave_out = leftout.handler(inside, options.run_dir, say) if inside and r.spare else None
    job = session.Launch(nodes, options, Fanout(connect), echo=echo, say=say, leave_out=leave_out)
    return _run(job, r, echo, say)


def _wanted(r: LaunchRequest, inside: str | None, names: list[str], say: Echo) -> int:
    """How many of the nodes (NAMES) the job runs on: --nodes N where given (the batch job of a launch --spare asked
    N to N+K; fewer spares than K granted is said, with the nodes Slurm could not give and why), else the nodes
    less the spares."""
    count = len(names)
    wanted = r.request.nodes or count - r.spare
    if wanted < 1:
        raise UsageError(
            f"--spare {r.spare}: Slurm job {inside} has {count} node(s), which leaves {wanted} for the job; "
            "ask for more nodes than spares"
        )
    if count < wanted:
        raise UsageError(f"--nodes {wanted}: Slurm job {inside} has {count} node(s), fewer than the job runs on")
    if inside and count - wanted < r.spare:
        scontrol = shutil.which("scontrol") or "scontrol"
        nodes, why = update.all_nodes(scontrol, DEADLINE)
        missing = spares.unavailable(nodes, allocation.partition(), names) if nodes is not None else why or "?"
        say(spares.shortfall(count, wanted, r.spare, missing))
    return wanted


def _master_port(given: int | None, nodes: list[Node]) -> int:
    """GIVEN, or for a job on this machine alone a free port of its own (another run, a clustercheck run among them,
    may hold torchrun's default port here), else that default (DEFAULT_MASTER_PORT)."""
    if given is not None:
        return given
    if len(nodes) == 1 and nodes[0].is_local:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return probe.getsockname()[1]
    return DEFAULT_MASTER_PORT


def _check_script(user_command: launch_command.UserCommand, r: LaunchRequest, nodes: list[Node]) -> None:
    """The script checked here before anything runs, where this machine holds the copy the job runs: the --sync
    directory, or this directory (--chdir's) when every node is this machine. A missing script is a usage error,
    one that does not compile a job not started."""
    if r.sync:
        base = r.sync
    elif nodes and all(n.is_local for n in nodes):
        base = r.chdir or str(Path.cwd())
    else:
        return  # the nodes' own copy runs (the same-code check compares them), not this machine's
    found = launch_command.script_problem(user_command, str(Path(base).expanduser().resolve()))
    if found is not None:
        why, missing = found
        raise (UsageError if missing else JobNotStarted)(why)


def _batch(r: LaunchRequest, say: Echo, echo: Echo) -> int:
    """--slurm outside an allocation: the launch as a batch job (batchjob.py)."""
    if r.hosts is not None:
        raise UsageError("--hosts: a batch job runs on the nodes Slurm gives it (--nodes, --nodelist)")
    if not r.request.names_nodes:
        raise UsageError(
            "--slurm: give the batch job's nodes (--nodes N or --nodelist NODES), or run inside an allocation "
            "(salloc --nodes=N clustercheck launch --slurm -- ...)"
        )
    run_dir = make_run_dir(r.run_dir, "launch-%Y%m%d-%H%M%S").resolve()
    inner = [*r.inner, "--", *r.job]  # --spare K among them: the launch inside leaves K of the job's nodes out
    request = r.request
    if r.request.nodes and r.spare:
        # The launch inside is told N (--nodes inside an allocation with --spare): the rest it gets are spares.
        request = _spare_request(r, say)
        inner = [*r.inner, f"--nodes={r.request.nodes}", "--", *r.job]
    return batchjob.submit(request, inner, run_dir, dry_run=r.dry_run, detach=r.detach, echo=echo, say=say)


def _spare_request(r: LaunchRequest, say: Echo) -> Request:
    """The batch job's nodes for --nodes N --spare K, Slurm's nodes read first (spares.asked): N+K, or N to N+K where
    drained or down nodes leave fewer, those nodes said with Slurm's reason; N+K where they cannot be read."""
    wanted, spare = r.request.nodes or 0, r.spare
    nodes, why = update.all_nodes(shutil.which("scontrol") or "scontrol", DEADLINE)
    if nodes is None:
        say(f"--spare {spare}: Slurm's nodes could not be read ({why}): asking for {wanted + spare} nodes")
        return replace(r.request, nodes=wanted + spare)
    count, most, said = spares.asked(wanted, spare, nodes, r.request.partition)
    if said:
        say(f"--spare {spare}: {said}; asking Slurm for {count} to {most} nodes")
    return replace(r.request, nodes=count, nodes_max=most)


def _nodes(r: LaunchRequest, inside: str | None) -> tuple[list[Node], SshSettings, Factory]:
    """The nodes (--hosts, or those of the allocation this runs in), the SSH settings, and how they are reached
    (SSH, or the allocation's job steps)."""
    if r.hosts is not None:
        nodes, ssh = hosts.load(r.hosts, r.limit, r.ssh)
    else:
        nodes, ssh = [], r.ssh.settings()
    if not inside:
        return nodes, ssh, factory.default(ssh)
    try:
        return allocation.nodes(nodes, *allocation.current()), ssh, step.factory(inside)
    except SlurmError as exc:
        raise UsageError(f"--slurm: {exc}") from exc


def _run(job: session.Launch, r: LaunchRequest, echo: Echo, say: Echo) -> int:
    """The Launch's steps: the preflight, every node reached, the code, the plan; then the job in the foreground,
    or detached and recorded. Every node cleaned up at the end; Ctrl-C stops the job on every node first."""
    try:
        try:
            if job.options.preflight:
                job.preflight()
            job.connect()
            script, cwd, code = job.prepare()
            plans = job.plan(script, cwd)
        except HostKeysRefused as exc:
            raise UsageError(f"host key verification failed, nothing was started: {exc}") from exc
        except NotStarted as exc:
            raise JobNotStarted(str(exc)) from exc
        except LaunchError as exc:
            raise UsageError(str(exc)) from exc
        if r.detach:
            try:
                names = job.start_detached(code)
            except NotStarted as exc:
                raise JobNotStarted(str(exc)) from exc
            _record(job, r, names, launch_command.first_ranks(plans, job.options.command.elastic))
            say(f"job {job.job_id} started on {len(names)} node(s) under systemd unit clustercheck-job-{job.job_id}")
            echo(job.job_id)
            say(f"follow it: clustercheck logs {job.job_id} --follow; stop it: clustercheck stop {job.job_id}")
            return ExitCode.OK
        finished = job.run_foreground()
    except KeyboardInterrupt:
        job.stop_all()
        raise
    finally:
        job.close()
    say(finished.message)
    return finished.status


def _record(job: session.Launch, r: LaunchRequest, names: list[str], first_ranks: dict[str, int | None]) -> None:
    """The detached job's record on this machine: how jobs, logs and stop find its nodes again."""
    assert r.hosts is not None  # --detach with --slurm is a batch job, submitted before
    ssh = r.ssh
    records.save(
        records.JobRecord(
            job=job.job_id,
            hosts=str(Path(r.hosts).resolve()) if Path(r.hosts).exists() else r.hosts,
            limit=r.limit,
            nodes=names,
            command=list(r.job),
            started=time.time(),
            run_dir=str(job.options.run_dir.resolve()),
            first_ranks=first_ranks,
            ssh_config=str(Path(ssh.config).resolve()) if ssh.config else None,
            known_hosts=[str(Path(k).resolve()) for k in ssh.known_hosts],
        )
    )
