"""What every command module shares: how clustercheck speaks for itself (say), and the group class that turns a
Stopped (a UsageError or another outcome of exitcodes.py) raised anywhere below into click's one-line error with
its exit code."""

from __future__ import annotations

import click

from clustercheck.exitcodes import Stopped


def say(line: str) -> None:
    """clustercheck's own line on stderr (a job's output and reports go to stdout)."""
    click.echo(f"clustercheck: {line}", err=True)


class _Refused(click.ClickException):
    def __init__(self, error: Stopped) -> None:
        super().__init__(str(error))
        self.exit_code = int(error.code)


class Group(click.Group):
    """clustercheck's group: a Stopped (UsageError, NoHosts, ...) from a command, or from the package that does its
    work, ends it as click's own errors end it (main() prints the one line, with the error's exit code)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except Stopped as exc:
            raise _Refused(exc) from exc
