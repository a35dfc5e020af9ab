"""`clustercheck jobs`, `logs` and `stop`: the detached jobs after their start, on their nodes or in Slurm
(clustercheck/launcher/jobs.py)."""

from __future__ import annotations

import click

from clustercheck.commands import options
from clustercheck.commands.common import say
from clustercheck.exitcodes import UsageError
from clustercheck.hosts import SshOptions
from clustercheck.launcher import batchjob, jobs

JOB_HOSTS = "The job's nodes (default: from the job's record on this machine)."


@click.command("jobs")
@options.hosts()
@options.slurm(
    "The launches submitted to Slurm (launch --slurm) by this user, from squeue, instead of the nodes' jobs."
)
@click.option("--all", "show_all", is_flag=True, help="Also the jobs that ended (their output is kept on the nodes).")
@options.ssh
def jobs_command(hosts: str | None, limit: str | None, use_slurm: bool, show_all: bool, ssh: SshOptions) -> None:
    """List the detached jobs on the nodes: their id, state on every node, and when they started."""
    if use_slurm and hosts is not None:
        raise UsageError("--hosts and --slurm: Slurm's jobs are listed by Slurm (squeue), give one of them")
    if use_slurm:
        batchjob.listed(show_all, click.echo, say)
    else:
        jobs.listed(hosts, limit, ssh, show_all, click.echo, say)


@click.command("logs")
@click.argument("job")
@click.option("--follow", "-f", is_flag=True, help="Keep showing new output until the job ends on every node.")
@options.hosts(JOB_HOSTS)
@options.ssh
def logs_command(job: str, follow: bool, hosts: str | None, limit: str | None, ssh: SshOptions) -> None:
    """Show a detached job's output from every node, each line prefixed with node/rank (a Slurm job's, for a Slurm
    job id)."""
    try:
        jobs.logs(job, follow, hosts, limit, ssh, click.echo, say)
    except KeyboardInterrupt as exc:  # Ctrl-C stops the following, not the job: say so
        exc.note = f"job {job} goes on running (clustercheck stop {job} stops it)"
        raise


@click.command("stop")
@click.argument("job")
@options.hosts(JOB_HOSTS)
@options.ssh
def stop_command(job: str, hosts: str | None, limit: str | None, ssh: SshOptions) -> None:
    """Stop a detached job on every node (SIGTERM, then SIGKILL after 15 s); its output stays on the nodes. A Slurm
    job id: the job is cancelled (scancel)."""
    jobs.stop(job, hosts, limit, ssh, click.echo)
