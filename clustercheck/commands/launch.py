"""`clustercheck launch`: its options, and the request they make for clustercheck/launcher/start.py. A launch
submitted as a Slurm batch job runs `clustercheck launch --slurm` again inside it, with the options given here:
inner_args derives them from what click parsed, so every option the launch inside takes goes with it.
"""

from __future__ import annotations

import os
import sys

import click
from click.core import ParameterSource

from clustercheck.commands import options
from clustercheck.commands.common import say
from clustercheck.config import DEFAULT_MASTER_PORT
from clustercheck.launcher.start import LaunchRequest, launch

# The options that shape the batch job itself, not the launch inside it: where it runs and how it is submitted.
OUTSIDE = frozenset({"hosts", "limit", "use_slurm", *options.SLURM_REQUEST, "dry_run", "detach", "run_dir"})


@click.command("launch")
@options.hosts()
@options.slurm(
    "Through Slurm, not SSH: outside an allocation, submit the launch as a batch job (--nodes or --nodelist) "
    "and follow it (--detach: print its job id); inside one (salloc, sbatch), run on its nodes with job steps."
)
@options.slurm_request
@click.option(
    "--dry-run",
    is_flag=True,
    help="With --slurm outside an allocation: write and print the batch script, submit nothing.",
)
@options.nproc_per_node("Ranks per node (default: the node's GPU count, or 2 without GPUs, as run).")
@options.master_port(
    "torchrun's --master-port on the first node (the c10d rendezvous endpoint's port in an elastic job). "
    f"Default: {DEFAULT_MASTER_PORT}; a job on this machine alone (--hosts localhost), a free port."
)
@click.option("--env", "env", multiple=True, metavar="K=V", help="Environment variable for every rank (repeatable).")
@click.option(
    "--sync",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="Upload this local directory to every node first and run the script from the copy (the script's path "
    "is relative to it).",
)
@click.option(
    "--chdir",
    default=None,
    metavar="DIR",
    help="Working directory on every node (default: the remote user's home over SSH, the current directory on "
    "localhost; with --sync, the synced copy).",
)
@options.python
@options.container
@click.option("--no-preflight", is_flag=True, help="Start without the core and network checks first.")
@click.option(
    "--spare",
    type=click.IntRange(min=0),
    default=0,
    metavar="K",
    help="With --slurm: K spare nodes. The preflight runs on every node, a node failing a check of its own is left "
    "out (and drained in Slurm), and the job runs on the first healthy ones; the nodes not used are given back to "
    "Slurm. Outside an allocation --nodes N is what the job runs on (the batch job asks N+K, or N to N+K where "
    "nodes are drained or down, so that they cost a spare, not the job) and --nodelist lists every node; inside "
    "one, the job runs on its nodes less K (or on --nodes N of them). Too few healthy nodes: nothing starts (exit 6).",
)
@click.option(
    "--detach",
    is_flag=True,
    help="Run the job under a transient systemd unit on every node (with --slurm: submit the batch job) and "
    "return; see jobs, logs and stop.",
)
@options.run_dir("launch-<timestamp>")
@options.ssh
@click.argument(
    "job", nargs=-1, required=True, type=click.UNPROCESSED, metavar="-- [TORCHRUN OPTIONS] SCRIPT [ARGS]..."
)
def command(use_slurm: bool, **given) -> None:
    """Run a training script on every node under torchrun: clustercheck launch --hosts INV -- [TORCHRUN OPTIONS]
    train.py [ARGS], or as a Slurm batch job: clustercheck launch --slurm --nodes N -- train.py. The exit status is
    the job's."""
    inner = tuple(inner_args(click.get_current_context()))
    sys.exit(launch(LaunchRequest(slurm=use_slurm, inner=inner, **given), click.echo, say))


def inner_args(ctx: click.Context) -> list[str]:
    """The launch options the user gave in CTX (not their defaults), as argv for the launch inside a batch job:
    every one but those that shape the batch job (OUTSIDE); a local path made absolute (the job may start
    elsewhere), every value as --option=VALUE (a value may begin with a dash)."""
    argv: list[str] = []
    for param in ctx.command.params:
        if not isinstance(param, click.Option) or param.name in OUTSIDE:
            continue
        if ctx.get_parameter_source(param.name) in (None, ParameterSource.DEFAULT):
            continue
        name = next(opt for opt in param.opts if opt.startswith("--"))
        value = ctx.params[param.name]
        if param.is_flag:
            argv += [name] if value else []
            continue
        for one in value if param.multiple else (value,):
            if isinstance(param.type, click.Path):
                one = os.path.abspath(one)
            argv.append(f"{name}={one}")
    return argv
