"""`--help` is where a user reads what an option does: every option says it, and the usage line names what a
command really takes."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner
from wording import says

from clustercheck.commands import cli


@pytest.mark.parametrize("command", sorted(cli.commands))
def test_every_option_says_what_it_does(command):
    bare = [p.opts[-1] for p in cli.commands[command].params if isinstance(p, click.Option) and not p.help]
    assert bare == [], f"clustercheck {command} --help shows no description for {', '.join(bare)}"


def test_launch_usage_names_the_torchrun_command_line_not_a_job_id():
    """JOB is a job id in logs and stop; launch takes what follows -- (torchrun's options, the script, its args)."""

    def usage(command: str) -> str:
        return CliRunner().invoke(cli, [command, "--help"], prog_name="clustercheck").output.splitlines()[0]

    assert says(usage("launch"), "Usage: clustercheck launch [OPTIONS]", "-- [TORCHRUN OPTIONS] SCRIPT [ARGS]...")
    assert says(usage("stop"), "Usage: clustercheck stop [OPTIONS] JOB")


def test_run_help_lists_every_stage_skip_takes():
    """--skip takes every stage but core (core collects the facts the others need), baseline included."""
    from clustercheck.selection import STAGES, Selection

    option = next(p for p in cli.commands["run"].params if p.name == "skip")
    listed = option.help.split("(")[1].split(")")[0].split(", ")
    assert listed == [s for s in STAGES if s != "core"] and "baseline" in listed
    for stage in listed:
        Selection(skip=(stage,))  # each one accepted
