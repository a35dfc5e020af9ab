"""`clustercheck run`: its options, and the request they make for clustercheck/run/verify.py."""

from __future__ import annotations

import argparse
import sys

import click

from clustercheck import inventory, report
from clustercheck.checks.consistency import DEFAULT_MAX_CLOCK_OFFSET
from clustercheck.commands import options
from clustercheck.commands.common import say
from clustercheck.config import (
    DEFAULT_COMMAND_TIMEOUT,
    DEFAULT_FORKS,
    DEFAULT_JOB_TIMEOUT,
    DEFAULT_MASTER_PORT,
    DEFAULT_SLURM_WAIT,
    DEFAULT_STALL_TIMEOUT,
)
from clustercheck.remote.netprobe import DEFAULT_ROUNDS, parse_rounds
from clustercheck.remote.pairs import DEFAULT_ROUNDS as PAIR_ROUNDS
from clustercheck.run.verify import RunRequest, SlurmRun, run
from clustercheck.selection import STAGES


class NetworkRounds(click.ParamType):
    """--network-rounds: a number of rounds (1 or more), or 'all' (None: every pair)."""

    name = "N|all"

    def convert(self, value, param, ctx) -> int | None:
        if value is None or isinstance(value, int):
            return value
        try:
            return parse_rounds(str(value))
        except argparse.ArgumentTypeError as exc:
            self.fail(str(exc), param, ctx)


@click.command("run")
@options.hosts()
@options.slurm(
    "Reach the nodes through Slurm, not SSH: every command is a job step (srun) of the allocation this runs "
    "in (under salloc or sbatch, from the login node). The nodes are the allocation's; with --hosts, the "
    "inventory's, which must all be in it. Outside an allocation, with --nodes or --nodelist, clustercheck asks "
    "for one (salloc) and releases it at the end."
)
@options.slurm_request
@click.option(
    "--slurm-wait",
    type=click.IntRange(min=1),
    default=DEFAULT_SLURM_WAIT,
    show_default=True,
    help="With --slurm outside an allocation: seconds to wait for Slurm to grant it.",
)
@options.python
@options.container
@options.nproc_per_node("Ranks per node for the torch jobs (default: the GPU count, or 2 without GPUs).")
@options.output_format(
    report.FORMAT_NAMES,
    "The report: text for people, json for scripts, junit and markdown for CI, prometheus for node_exporter's "
    "textfile collector.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="Write the report to FILE instead of stdout (a .json, .xml, .md or .prom FILE in the format its "
    "extension names).",
)
@options.run_dir("<timestamp>")
@click.option(
    "--forks", type=click.IntRange(min=1), default=DEFAULT_FORKS, show_default=True, help="Hosts checked at once."
)
@click.option(
    "--command-timeout",
    type=click.FloatRange(min=5),
    default=DEFAULT_COMMAND_TIMEOUT,
    show_default=True,
    help="Deadline in seconds for the facts collector on each node.",
)
@click.option(
    "--timeout",
    "job_timeout",
    type=click.FloatRange(min=1),
    default=DEFAULT_JOB_TIMEOUT,
    show_default=True,
    help="Deadline in seconds for each torch job (node-local collectives, collectives, DDP); when it passes, "
    "or a node's job fails, the job is stopped on every node.",
)
@click.option(
    "--stall-timeout",
    type=click.FloatRange(min=5),
    default=DEFAULT_STALL_TIMEOUT,
    show_default=True,
    help="Seconds a node's ranks may make no progress while the others wait for them; the node is then named "
    "and the job stopped on every node. Ranks still starting (importing torch) progress while they use CPU.",
)
@click.option(
    "--min-busbw",
    default=None,
    metavar="FAIL[:WARN]",
    help="all_reduce bus bandwidth threshold in GB/s: FAIL under the first number, WARN under the second "
    "(default: the inventory's clustercheck_min_busbw, else report only).",
)
@click.option(
    "--dcgm-level",
    type=click.IntRange(1, 3),
    default=None,
    help="Run NVIDIA's DCGM diagnostic (dcgmi diag -r LEVEL) on every node that has dcgmi: 1 takes seconds, "
    "2 minutes, 3 up to an hour (default: off).",
)
@options.burn
@click.option(
    "--expect-transport",
    type=click.Choice(inventory.TRANSPORTS),
    default=None,
    help="The network NCCL must use between nodes (default: the inventory's clustercheck_expect_transport, else "
    "what each node's hardware suggests).",
)
@options.expected
@click.option(
    "--only",
    multiple=True,
    type=click.Choice(STAGES),
    help="Run only these stages (repeatable); core always collects the facts the others need.",
)
@options.master_port(
    "Rendezvous port of the torch jobs, on the first node's cluster address (loopback for the node-local job). "
    f"Default: {DEFAULT_MASTER_PORT}; on one node, a free port of its own."
)
@click.option(
    "--network-rounds",
    type=NetworkRounds(),
    default=str(DEFAULT_ROUNDS),
    show_default=True,
    metavar="N|all",
    help="Rounds of the network stage's round trip and throughput measurement: each node is measured with N "
    "partners, whatever the cluster's size; 'all' measures every pair (N-1 rounds for N nodes).",
)
@click.option(
    "--pair-rounds",
    type=NetworkRounds(),
    default=str(PAIR_ROUNDS),
    show_default=True,
    metavar="N|all",
    help="Rounds of node pairs in the collectives stage's fabric check (each node's rails measured with N "
    "partners, whatever the cluster's size); 'all': every pair. --skip 'fabric.p*' leaves them out.",
)
@click.option(
    "--min-pair-busbw",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="GBPS",
    help="The floor of one rail's send/recv figure between two nodes, in GB/s (default: none; a rail is "
    "also judged against its figure over the cluster).",
)
@options.ssh
@click.option(
    "--skip",
    multiple=True,
    help=f"Skip a stage ({', '.join(s for s in STAGES if s != 'core')}) or the checks whose name matches this glob, "
    "e.g. 'local.*' (repeatable).",
)
@click.option(
    "--max-clock-offset",
    "clock_bound",
    type=click.FloatRange(min=0),
    default=DEFAULT_MAX_CLOCK_OFFSET,
    show_default=True,
    help="Seconds the nodes' clocks may differ.",
)
@click.option(
    "--shared-dir",
    default=None,
    metavar="PATH",
    help="A directory on a filesystem shared by every node: checked to be the same filesystem everywhere and "
    "writable, and the DDP stage's checkpoint is saved there and loaded by every rank.",
)
@click.option(
    "--data-path",
    "data_paths",
    multiple=True,
    metavar="PATH",
    help="A dataset path that must have the same content on every node (file count, total size, a hash of a "
    "sample of its files); repeatable (default: the inventory's clustercheck_data_paths).",
)
@options.baseline
def command(use_slurm: bool, request, slurm_wait: int, **given) -> None:
    """Check every node, the consistency between them, and print a verdict."""
    source = click.get_current_context().get_parameter_source("fmt")
    slurm = SlurmRun(request, slurm_wait) if use_slurm else None
    fmt_given = source is not None and source is not click.core.ParameterSource.DEFAULT
    sys.exit(run(RunRequest(slurm=slurm, fmt_given=fmt_given, **given), click.echo, say))
