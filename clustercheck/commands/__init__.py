"""The command line: the click group, one module per command or noun, and main() (exit codes, Ctrl-C, one-line
errors). A command module declares its options (those several commands share are options.py's) and hands a request
to the package that does the work:

run.py          clustercheck run          -> run/verify.py
node_health.py  clustercheck node-health  -> run/health.py
diff.py         clustercheck diff         -> report/diff.py
checks.py       clustercheck checks       -> catalog.py
schema.py       clustercheck schema       -> report/report.schema.json
launch.py       clustercheck launch       -> launcher/start.py
jobs.py         clustercheck jobs, logs, stop  -> launcher/jobs.py (a Slurm job: launcher/batchjob.py)
"""

from __future__ import annotations

import signal
import sys

import click

from clustercheck import __version__
from clustercheck.commands import checks, diff, jobs, launch, node_health, run, schema
from clustercheck.commands.common import Group
from clustercheck.exitcodes import ExitCode
from clustercheck.reach import cleanup_message


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="clustercheck")
def cli() -> None:
    """Prove that a cluster of GPU nodes is ready for multi-node PyTorch training."""


for _command in (
    run.command,
    diff.command,
    node_health.command,
    checks.command,
    launch.command,
    jobs.jobs_command,
    jobs.logs_command,
    jobs.stop_command,
    schema.command,
):
    cli.add_command(_command)


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
        note = getattr(cause, "note", "")  # what the command wants said of the interruption
        click.echo(f"clustercheck: interrupted; {note + '; ' if note else ''}{cleanup_message(unclean)}", err=True)
        sys.exit(ExitCode.INTERRUPTED)
    except Exception as exc:  # a bug: one line, and where to report it
        click.echo(f"clustercheck: internal error: {type(exc).__name__}: {exc}", err=True)
        sys.exit(ExitCode.INTERNAL_ERROR)
