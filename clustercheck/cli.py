"""The clustercheck command line."""

from __future__ import annotations

import datetime as dt
import socket
import sys
from pathlib import Path

import click
from rich.console import Console

from clustercheck import __version__, localrun, report
from clustercheck.exitcodes import ExitCode
from clustercheck.model import Status, overall_status

LOCAL_NAMES = {"localhost", "127.0.0.1", "::1"}


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="clustercheck")
def cli() -> None:
    """Prove that a cluster of GPU nodes is ready for multi-node PyTorch training."""


@cli.command()
@click.option("--hosts", required=True, help="'localhost' (the local machine as a one-node cluster).")
@click.option(
    "--python",
    "python",
    default=None,
    help="Python of the environment with torch (default: recorded "
    "in /etc/clustercheck/python, else the one running clustercheck).",
)
@click.option(
    "--nproc-per-node",
    type=click.IntRange(min=1),
    default=None,
    help="Ranks per node (default: the GPU count, or 2 without GPUs).",
)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="Write the machine output to FILE instead of stdout.",
)
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where raw outputs are kept (default ./clustercheck-runs/<timestamp>).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=300,
    show_default=True,
    help="Deadline in seconds for the torch job.",
)
@click.option("--master-port", type=click.IntRange(1024, 65535), default=29500, show_default=True)
def run(
    hosts: str,
    python: str | None,
    nproc_per_node: int | None,
    fmt: str,
    output: str | None,
    run_dir: str | None,
    timeout: float,
    master_port: int,
) -> None:
    """Check the hosts and print a verdict."""
    names = [h.strip() for h in hosts.split(",") if h.strip()]
    if not names:
        raise UsageError("--hosts matched no host", ExitCode.NO_HOSTS)
    if any(n not in LOCAL_NAMES for n in names) or len(names) > 1:
        raise UsageError(f"--hosts {hosts}: only 'localhost' is supported in this version")
    run_path = Path(run_dir or Path("clustercheck-runs") / dt.datetime.now().strftime("%Y%m%d-%H%M%S"))
    run_path.mkdir(parents=True, exist_ok=True)
    machine = fmt != "text"
    console = Console(stderr=machine or output is not None)
    with console.status("checking localhost: torch, then collectives on the local ranks"):
        results = localrun.run_local(
            python or localrun.default_python(), run_path, nproc_per_node, timeout, master_port
        )
    host_list = [socket.gethostname()]
    if machine:
        text = report.to_json(results, host_list)
        (run_path / "report.json").write_text(text)
        if output:
            Path(output).write_text(text + "\n")
        else:
            click.echo(text)
    report.print_table(results, console)
    console.print(f"[bold]{report.verdict(results)}[/]  (raw output: {run_path})")
    sys.exit(ExitCode.CHECK_FAILED if overall_status(results) is Status.FAIL else ExitCode.OK)


class UsageError(click.ClickException):
    def __init__(self, message: str, code: ExitCode = ExitCode.USAGE_ERROR) -> None:
        super().__init__(message)
        self.exit_code = int(code)


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except click.ClickException as exc:
        click.echo(f"clustercheck: error: {exc.format_message()}", err=True)
        code = exc.exit_code
        sys.exit(ExitCode.USAGE_ERROR if code == 2 else code)  # click's own usage errors exit 2
    except click.exceptions.Abort:
        click.echo("clustercheck: interrupted", err=True)
        sys.exit(ExitCode.INTERRUPTED)
    except KeyboardInterrupt:
        click.echo("clustercheck: interrupted", err=True)
        sys.exit(ExitCode.INTERRUPTED)
    except Exception as exc:  # a bug: one line, and where to report it
        click.echo(f"clustercheck: internal error: {type(exc).__name__}: {exc}", err=True)
        sys.exit(ExitCode.INTERNAL_ERROR)
