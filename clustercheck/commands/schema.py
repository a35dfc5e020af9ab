"""`clustercheck schema`: the JSON report's schema (clustercheck/report/report.schema.json)."""

from __future__ import annotations

import click

from clustercheck import report


@click.command("schema")
def command() -> None:
    """Print the JSON Schema of the --format json report."""
    click.echo(report.schema_text(), nl=False)
