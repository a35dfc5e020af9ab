"""`clustercheck run`, from what was asked to the exit status: everything the request says is checked before
anything runs (a bad value is a usage error, not a failure half-way), the nodes are found (--hosts, or a Slurm
allocation), one frozen RunConfig is built, the pipeline runs the stages over the nodes, and the report is kept in
the run directory, delivered (-o FILE or stdout) and shown.

The data goes one way: command -> run (here) -> stages -> checks -> report.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from clustercheck import catalog, expected, hosts, inventory, selection
from clustercheck.checks.collectives import ThresholdError, parse_min_busbw
from clustercheck.config import DEFAULT_MASTER_PORT, DEFAULT_SLURM_WAIT, RunConfig, RunOptions, make_run_dir, shared
from clustercheck.exitcodes import ExitCode, NoHosts, UsageError
from clustercheck.hosts import SshOptions
from clustercheck.inventory import Node
from clustercheck.model import Status
from clustercheck.reach import Fanout, cleanup_message
from clustercheck.report import Report, delivery, text
from clustercheck.run import progress
from clustercheck.run.pipeline import Outcome, Pipeline
from clustercheck.selection import Selection, SelectionError
from clustercheck.slurm import allocation, step
from clustercheck.slurm.call import SlurmError
from clustercheck.slurm.request import Request
from clustercheck.transport import factory
from clustercheck.transport.factory import Factory
from clustercheck.transport.params import SshSettings

Echo = Callable[[str], None]


@dataclass(frozen=True)
class SlurmRun:
    """--slurm: the nodes reached with job steps of the allocation this runs in, or of one asked for with REQUEST
    (outside an allocation), Slurm given at most WAIT seconds to grant it."""

    request: Request = field(default_factory=Request)
    wait: int = DEFAULT_SLURM_WAIT


@dataclass(frozen=True, kw_only=True)
class RunRequest(RunOptions):
    """What `clustercheck run` was asked, each field an option of the command line, as given: those the stages take
    as given are RunOptions' (config.py), the others are resolved into the RunConfig (_config)."""

    hosts: str | None = None
    limit: str | None = None
    ssh: SshOptions = field(default_factory=SshOptions)
    slurm: SlurmRun | None = None
    fmt: str = "text"
    fmt_given: bool = False  # --format was given (not its default): -o FILE's extension must agree with it
    output: str | None = None
    run_dir: str | None = None
    min_busbw: str | None = None
    expected_file: str | None = None
    only: tuple[str, ...] = ()
    master_port: int | None = None  # --master-port; None: the default port, or a free port on a one-node run
    skip: tuple[str, ...] = ()
    data_paths: tuple[str, ...] = ()

    @property
    def hosts_args(self) -> tuple[str, ...]:
        """The arguments that chose the nodes, for the next command the report suggests."""
        return (
            *(("--slurm",) if self.slurm else ()),
            *(("--hosts", self.hosts) if self.hosts else ()),
            *(("--limit", self.limit) if self.limit else ()),
        )


def run(request: RunRequest, echo: Echo, say: Echo) -> int:
    """The run REQUEST asks for; its exit status. ECHO: the report on stdout; SAY: clustercheck's own lines."""
    selected, fmt = _asked(request)
    console = Console(stderr=fmt != "text" or request.output is not None)  # people read stderr when stdout carries
    with contextlib.ExitStack() as held:  # an allocation asked for is given back however the run ends
        nodes, ssh, connect = _nodes(request, held, say)
        config = _config(request, nodes, ssh, selected)
        document, outcome = _verify(nodes, config, Fanout(connect), request.hosts_args, console)
    saved = delivery.save(document, config.run_dir)
    if request.output or fmt != "text":
        delivery.deliver(document, fmt, request.output, echo, saved)
    text.print_report(document, console, raw_output=str(config.run_dir))
    if outcome.unclean:
        say(cleanup_message(outcome.unclean))
    if outcome.host_key_error:
        raise UsageError("host key verification failed (see the connect check); nothing was run there")
    return ExitCode.CHECK_FAILED if document.status is Status.FAIL else ExitCode.OK


def _asked(request: RunRequest) -> tuple[Selection, str]:
    """What the options alone decide, checked before anything else: the stages, the report's format, the
    threshold and paths."""
    min_busbw(request.min_busbw, "--min-busbw")
    try:
        selected = Selection(only=request.only, skip=request.skip).against(e["name"] for e in catalog.entries())
    except SelectionError as exc:
        raise UsageError(str(exc)) from exc
    given = {"--baseline": request.baseline is not None}
    for name in request.only:  # a stage an option asks for, kept with --only without that option, would be empty
        asked_by = selection.stage(name).asked_by
        if asked_by and not given.get(asked_by):
            raise UsageError(f"--only {name}: the {name} stage runs only with {asked_by}, which was not given")
    if request.hosts is None and request.slurm is None:
        raise UsageError("give the nodes: --hosts INVENTORY, or --slurm inside a Slurm allocation")
    for option, path in [("--shared-dir", request.shared_dir), *(("--data-path", p) for p in request.data_paths)]:
        if path is not None and not path.startswith("/"):
            raise UsageError(f"{option} {path}: give an absolute path (it is a path on the nodes)")
    fmt = delivery.output_format(request.fmt, request.fmt_given, request.output)
    if request.output and not Path(request.output).resolve().parent.is_dir():
        raise UsageError(f"-o {request.output}: no such directory {Path(request.output).resolve().parent}")
    return selected, fmt


def _nodes(request: RunRequest, held: contextlib.ExitStack, say: Echo) -> tuple[list[Node], SshSettings, Factory]:
    """The nodes (--hosts, else the allocation's), the SSH settings, and how the nodes are reached (SSH, or the job
    steps of the Slurm allocation this runs in or asked for)."""
    if request.hosts is not None:
        nodes, ssh = hosts.load(request.hosts, request.limit, request.ssh)
    else:
        nodes, ssh = [], request.ssh.settings()
    if request.slurm is None:
        return nodes, ssh, factory.default(ssh)
    ask = request.slurm.request
    try:
        if allocation.inside() is None and ask.names_nodes:
            job, nodelist = held.enter_context(allocation.allocated(ask, request.slurm.wait, say))
        else:
            job, nodelist = allocation.current()
        return allocation.nodes(nodes, job, nodelist), ssh, step.factory(job)
    except allocation.NotGranted as exc:
        raise NoHosts(f"--slurm: {exc}") from exc
    except SlurmError as exc:
        raise UsageError(f"--slurm: {exc}") from exc


def _config(request: RunRequest, nodes: list[Node], ssh: SshSettings, selected: Selection) -> RunConfig:
    """The run's one frozen configuration: the options, else the values the inventory gives the whole cluster."""
    try:
        agreed = {var: inventory.cluster_value(nodes, var) for var in inventory.CLUSTER_VARS}
    except inventory.InventoryError as exc:
        raise UsageError(str(exc)) from exc
    busbw = request.min_busbw or agreed[inventory.MIN_BUSBW_VAR]
    if not request.min_busbw:
        min_busbw(busbw, f"{inventory.MIN_BUSBW_VAR} (the inventory)")
    models = expected.catalog(request.expected_file or agreed[inventory.EXPECTED_FILE_VAR])
    return RunConfig(
        **shared(request, RunOptions),
        run_dir=make_run_dir(request.run_dir, "%Y%m%d-%H%M%S"),
        selection=selected,
        master_port=request.master_port or DEFAULT_MASTER_PORT,
        master_port_given=request.master_port is not None,
        ssh=ssh,
        min_busbw=busbw,
        data_paths=request.data_paths or agreed[inventory.DATA_PATHS_VAR],
        inventory=hosts.inventory_path(request.hosts),
        models=models,
    )


def _verify(
    nodes: list[Node], config: RunConfig, reach: Fanout, hosts_args: tuple[str, ...], console: Console
) -> tuple[Report, Outcome]:
    """The pipeline over NODES, its progress shown on CONSOLE; the report and the pipeline's outcome."""
    started_at = time.time()
    with progress.shown(console, [n.name for n in nodes]) as display:
        pipeline = Pipeline(nodes, config, reach, display.update)
        outcome = pipeline.run()
    names = [n.name for n in nodes]
    document = delivery.build(
        outcome.results, names, pipeline.run_id, started_at, durations=outcome.durations, hosts_args=hosts_args
    )
    return document, outcome


def min_busbw(text: str | None, source: str) -> None:
    """TEXT, the all_reduce threshold from SOURCE, read now: a bad one is a usage error before anything runs."""
    if text is None:
        return
    try:
        parse_min_busbw(text, source)
    except ThresholdError as exc:
        raise UsageError(str(exc)) from exc
