"""`clustercheck diff`: what changed between two JSON reports (clustercheck/report/diff.py)."""

from __future__ import annotations

import sys

import click

from clustercheck.commands import options
from clustercheck.exitcodes import ExitCode
from clustercheck.report import diff


@click.command("diff")
@click.argument("old", metavar="OLD.json")
@click.argument("new", metavar="NEW.json")
@options.output_format(diff.FORMATS, "text for people, markdown for CI summaries and pull requests, json for scripts.")
@click.option(
    "--tolerance",
    "tolerances",
    multiple=True,
    metavar="FIGURE=WARN[:FAIL]",
    help="As run's --baseline-tolerance: how much worse a figure may get, in percent (repeatable).",
)
def command(old: str, new: str, fmt: str, tolerances: tuple[str, ...]) -> None:
    """What changed between two JSON reports of a cluster: nodes added or gone, versions, check statuses, figures
    worse than their tolerance. Exit 1 when a figure got worse past its FAIL bound."""
    bounds = options.tolerances(tolerances, "--tolerance")
    changes = diff.diff(options.report(old), options.report(new), bounds)
    click.echo(diff.render(changes, fmt))
    sys.exit(ExitCode.CHECK_FAILED if changes.failed else ExitCode.OK)
