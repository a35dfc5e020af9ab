"""`clustercheck node-health`: its options, and the request they make for clustercheck/run/health.py."""

from __future__ import annotations

import sys

import click

from clustercheck.commands import options
from clustercheck.commands.common import say
from clustercheck.run import health
from clustercheck.slurm import breaker


@click.command("node-health")
@options.slurm(
    "Drain this node in Slurm on a FAIL (reason 'clustercheck: CHECK: MESSAGE'); resume it when healthy "
    "if it was drained by clustercheck. The node: SLURMD_NODENAME, else the short hostname.",
    name="slurm",
)
@click.option(
    "--textfile-dir",
    type=click.Path(file_okay=False),
    default=None,
    metavar="DIR",
    help=f"Also write the results as Prometheus metrics to DIR/{health.TEXTFILE} (node_exporter's textfile "
    "directory), replaced atomically.",
)
@options.output_format(["text", "json"], "text: one line per check; json: the JSON report (clustercheck schema).")
@options.expected
@click.option(
    "--torch-max-age",
    type=click.FloatRange(min=0),
    default=health.TORCH_MAX_AGE,
    show_default=True,
    metavar="SECONDS",
    help="Reuse torch's last successful import on this node (about a second each run) while it is younger than "
    "SECONDS and nothing it depends on changed (the environment's packages, torch's files, the NVIDIA driver and "
    "device files, the boot); 0 imports torch every run.",
)
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False),
    default=None,
    metavar="DIR",
    help="Where the last import is kept (default: /var/cache/clustercheck as root, else ~/.cache/clustercheck).",
)
@click.option(
    "--max-drained-percent",
    type=click.FloatRange(min=0, max=100),
    default=breaker.MAX_DRAINED_PERCENT,
    show_default=True,
    metavar="PERCENT",
    help="With --slurm, the circuit breaker: drain this node only while clustercheck holds drained fewer than "
    "PERCENT of its partition's nodes (and --max-drained-nodes); past that, say why and write the metric "
    f"{health.WITHHELD_METRIC} instead.",
)
@click.option(
    "--max-drained-nodes",
    type=click.IntRange(min=0),
    default=breaker.MAX_DRAINED_NODES,
    show_default=True,
    metavar="N",
    help="With --slurm: clustercheck may always hold N of a partition's nodes drained, whatever --max-drained-percent "
    "allows.",
)
@click.option(
    "--budget",
    type=click.FloatRange(min=health.MIN_BUDGET),
    default=health.BUDGET,
    show_default=True,
    metavar="SECONDS",
    help="How long the whole program may take, scontrol included: every step's deadline is cut to what is left of "
    "it. Set it below the scheduler's limit (Slurm kills its health program after 60 s, or HealthCheckTimeout).",
)
@click.option(
    "--epilog",
    is_flag=True,
    help="Run as Slurm's Epilog (implies --slurm): judge what the job that ended (SLURM_JOB_ID, SLURM_JOB_UID) left "
    "on this node: its user's processes still running, /dev/shm filled, the GPUs' checks (memory still held, a GPU "
    "in a bad state); drain the node on a FAIL.",
)
@click.option(
    "--prolog",
    is_flag=True,
    help="Run as Slurm's Prolog (implies --slurm): vet this node before the job (SLURM_JOB_ID) starts, within "
    "--budget; on a FAIL drain it and exit 1, so that slurmd requeues the job (exit 0 when the circuit breaker held "
    "the drain back: the job starts).",
)
def command(**given) -> None:
    """Run the per-node checks on this machine, in seconds (Slurm's HealthCheckProgram). Exit 1 on a FAIL."""
    sys.exit(health.node_health(health.HealthRequest(**given), click.echo, say))
