"""`clustercheck checks`: the check catalog (clustercheck/catalog.py)."""

from __future__ import annotations

import click

from clustercheck import catalog
from clustercheck.commands import options


@click.command("checks")
@options.output_format(
    ["text", "json", "markdown"],
    "text for people, json for scripts, markdown for documentation (docs/checks.md's tables).",
)
def command(fmt: str) -> None:
    """List every check clustercheck can report: its name, stage, scope, what it proves and the fix."""
    click.echo(catalog.render(fmt))
