"""The clustercheck command line."""

from __future__ import annotations

import datetime as dt
import signal
import sys
import threading
import time
from pathlib import Path

import click
from rich.console import Console

from clustercheck import __version__, catalog, inventory, report
from clustercheck.checks.collectives import ThresholdError, parse_min_busbw
from clustercheck.config import DEFAULT_MAX_CLOCK_OFFSET, RunConfig, SshSettings
from clustercheck.exitcodes import ExitCode
from clustercheck.model import Status, overall_status
from clustercheck.report import Report, text
from clustercheck.run.pipeline import Pipeline
from clustercheck.run.selection import STAGES, Selection, SelectionError
from clustercheck.transport import TransportError, factory
from clustercheck.transport.params import Timeouts, load_config


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="clustercheck")
def cli() -> None:
    """Prove that a cluster of GPU nodes is ready for multi-node PyTorch training."""


@cli.command()
@click.option(
    "--hosts",
    required=True,
    help="An Ansible inventory (file or directory), a comma-separated list (node1,user@node2:2222), or localhost.",
)
@click.option("--limit", default=None, help="Only these groups or hosts (Ansible --limit patterns).")
@click.option(
    "--python",
    "python",
    default=None,
    help="Environment python on every node (default: clustercheck_python from the inventory, else "
    "/etc/clustercheck/python on the node, else python3; on localhost, the python running clustercheck).",
)
@click.option(
    "--nproc-per-node",
    type=click.IntRange(min=1),
    default=None,
    help="Ranks per node for the torch jobs (default: the GPU count, or 2 without GPUs).",
)
@click.option("--format", "fmt", type=click.Choice(report.FORMAT_NAMES), default="text", show_default=True)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="Write the report to FILE instead of stdout.",
)
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where every node's raw output is kept (default ./clustercheck-runs/<timestamp>).",
)
@click.option("--forks", type=click.IntRange(min=1), default=32, show_default=True, help="Hosts checked at once.")
@click.option("--connect-timeout", type=click.FloatRange(min=1), default=10, show_default=True, help="Seconds.")
@click.option(
    "--command-timeout",
    type=click.FloatRange(min=5),
    default=120,
    show_default=True,
    help="Deadline in seconds for the facts collector on each node.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=300,
    show_default=True,
    help="Deadline in seconds for each torch job (node-local collectives, collectives, DDP); when it passes, "
    "or a node's job fails, the job is stopped on every node.",
)
@click.option(
    "--stall-timeout",
    type=click.FloatRange(min=5),
    default=60,
    show_default=True,
    help="Seconds a node's ranks may make no progress while the others wait for them; the node is then named "
    "and the job stopped on every node.",
)
@click.option(
    "--min-busbw",
    default=None,
    metavar="FAIL[:WARN]",
    help="all_reduce bus bandwidth threshold in GB/s: FAIL under the first number, WARN under the second "
    "(default: the inventory's clustercheck_min_busbw, else report only).",
)
@click.option(
    "--only",
    multiple=True,
    type=click.Choice(STAGES),
    help="Run only these stages (repeatable); core always collects the facts the others need.",
)
@click.option("--master-port", type=click.IntRange(1024, 65535), default=29500, show_default=True)
@click.option(
    "--accept-new-host-keys",
    is_flag=True,
    help="Record host keys of nodes not yet in known_hosts (like StrictHostKeyChecking=accept-new); "
    "a changed key is always refused.",
)
@click.option(
    "--known-hosts",
    "known_hosts",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="known_hosts file to use instead of ~/.ssh/known_hosts (repeatable).",
)
@click.option(
    "--ssh-config", type=click.Path(dir_okay=False), default=None, help="SSH config file (default ~/.ssh/config)."
)
@click.option(
    "--skip",
    multiple=True,
    help="Skip a stage (network, collectives, ddp) or the checks whose name matches this glob, e.g. 'local.*' "
    "(repeatable).",
)
@click.option(
    "--max-clock-offset",
    type=click.FloatRange(min=0),
    default=DEFAULT_MAX_CLOCK_OFFSET,
    show_default=True,
    help="Seconds the nodes' clocks may differ.",
)
def run(
    hosts: str,
    limit: str | None,
    python: str | None,
    nproc_per_node: int | None,
    fmt: str,
    output: str | None,
    run_dir: str | None,
    forks: int,
    connect_timeout: float,
    command_timeout: float,
    timeout: float,
    stall_timeout: float,
    master_port: int,
    accept_new_host_keys: bool,
    known_hosts: tuple[str, ...],
    ssh_config: str | None,
    skip: tuple[str, ...],
    max_clock_offset: float,
    min_busbw: str | None,
    only: tuple[str, ...],
) -> None:
    """Check every node, the consistency between them, and print a verdict."""
    if min_busbw is not None:
        try:
            parse_min_busbw(min_busbw)
        except ThresholdError as exc:
            raise UsageError(str(exc)) from exc
    try:
        selection = Selection(only=only, skip=skip)
    except SelectionError as exc:
        raise UsageError(str(exc)) from exc
    try:
        nodes = inventory.load(hosts, limit)
    except inventory.InventoryError as exc:
        raise UsageError(str(exc)) from exc
    if not nodes:
        raise UsageError(f"no host matched --hosts {hosts}" + (f" --limit {limit}" if limit else ""), ExitCode.NO_HOSTS)
    if ssh_config and not Path(ssh_config).exists():
        raise UsageError(f"--ssh-config {ssh_config}: no such file")
    try:
        config = load_config(ssh_config) if any(not n.is_local for n in nodes) else None
    except TransportError as exc:
        raise UsageError(str(exc)) from exc
    run_path = Path(run_dir or Path("clustercheck-runs") / dt.datetime.now().strftime("%Y%m%d-%H%M%S"))
    run_path.mkdir(parents=True, exist_ok=True)
    machine = fmt != "text"
    console = Console(stderr=machine or output is not None)
    settings = RunConfig(
        run_dir=run_path,
        selection=selection,
        python=python,
        forks=forks,
        command_timeout=command_timeout,
        job_timeout=timeout,
        stall_timeout=stall_timeout,
        nproc_per_node=nproc_per_node,
        master_port=master_port,
        ssh=SshSettings(
            timeouts=Timeouts(connect=connect_timeout, banner=connect_timeout + 5, auth=connect_timeout + 5),
            accept_new_host_keys=accept_new_host_keys,
            known_hosts=known_hosts,
            config=config,
        ),
        clock_bound=max_clock_offset,
        min_busbw=min_busbw or next((n.min_busbw for n in nodes if n.min_busbw), None),
    )
    started_at = time.time()
    host_stages: dict[str, str] = {n.name: "waiting" for n in nodes}
    lock = threading.Lock()
    with console.status(f"checking {len(nodes)} host(s)") as status:

        def progress(host: str, stage: str) -> None:
            with lock:
                host_stages[host] = stage
                busy = [f"{h}: {s}" for h, s in host_stages.items() if s != "done"]
                done = sum(1 for s in host_stages.values() if s == "done")
                status.update(f"{done}/{len(host_stages)} host(s) done  " + "  ".join(busy[:6]))

        pipeline = Pipeline(nodes, settings, factory.default(settings.ssh), progress)
        outcome = pipeline.run()
    results = outcome.results
    document = Report(results, [n.name for n in nodes], pipeline.run_id, started_at, time.time() - started_at)
    (run_path / "report.json").write_text(report.render(document, "json") + "\n")
    (run_path / "report.xml").write_text(report.render(document, "junit") + "\n")
    if output:
        report.write_atomic(Path(output), report.render(document, fmt) + "\n")
    elif machine:
        click.echo(report.render(document, fmt))
    text.print_table(results, console)
    console.print(f"[bold]{report.verdict(results)}[/]  (raw output: {run_path})")
    if outcome.unclean:
        click.echo(f"clustercheck: {cleanup_message(outcome.unclean)}", err=True)
    if outcome.host_key_error:
        click.echo(
            "clustercheck: error: host key verification failed (see the connect check); nothing was run there",
            err=True,
        )
        sys.exit(ExitCode.USAGE_ERROR)
    sys.exit(ExitCode.CHECK_FAILED if overall_status(results) is Status.FAIL else ExitCode.OK)


@cli.command("checks")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown"]), default="text", show_default=True)
def list_checks(fmt: str) -> None:
    """List every check clustercheck can report: its name, stage, scope, what it proves and the fix."""
    click.echo(catalog.render(fmt))


class UsageError(click.ClickException):
    def __init__(self, message: str, code: ExitCode = ExitCode.USAGE_ERROR) -> None:
        super().__init__(message)
        self.exit_code = int(code)


def cleanup_message(unclean: dict[str, str]) -> str:
    """What the closing line says about the nodes clustercheck could not clean up."""
    if not unclean:
        return "processes started on the nodes were stopped"
    where = "; ".join(f"{node} ({why})" for node, why in sorted(unclean.items()))
    return (
        f"could not stop the processes started on {where}: they end by themselves at their deadline, and the "
        "next run stops whatever is left"
    )


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    # Ctrl-C and kill -INT/-TERM always stop the run and clean the nodes up, even when clustercheck was
    # started in the background of a script (where the shell makes it ignore SIGINT).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        cli.main(standalone_mode=False)
    except click.ClickException as exc:
        click.echo(f"clustercheck: error: {exc.format_message()}", err=True)
        code = exc.exit_code
        sys.exit(ExitCode.USAGE_ERROR if code == 2 else code)  # click's own usage errors exit 2
    except (click.exceptions.Abort, KeyboardInterrupt) as exc:
        cause = exc.__cause__ if isinstance(exc, click.exceptions.Abort) else exc
        unclean = getattr(cause, "unclean", {})
        click.echo(f"clustercheck: interrupted; {cleanup_message(unclean)}", err=True)
        sys.exit(ExitCode.INTERRUPTED)
    except Exception as exc:  # a bug: one line, and where to report it
        click.echo(f"clustercheck: internal error: {type(exc).__name__}: {exc}", err=True)
        sys.exit(ExitCode.INTERNAL_ERROR)
