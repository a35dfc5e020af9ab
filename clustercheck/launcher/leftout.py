"""What becomes of the nodes `launch --slurm --spare K` leaves out (spares.py chose them), inside the Slurm job: each
failing node drained as node-health drains its node (slurm/update.py: the one reason format, the circuit breaker;
never resumed from here), then, when the job starts, the job shrunk to the nodes it runs on (slurm/allocation.py)
so that the others go back to Slurm. Either failing is said in one line and the launch goes on. The job steps that
follow a resize reach the nodes with the job's variables as Slurm's resize script sets them, passed to srun as its
environment (this process's own is left as it is).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from clustercheck.launcher import spares
from clustercheck.model import CheckResult
from clustercheck.reach import Fanout, Reach
from clustercheck.slurm import allocation, step, update
from clustercheck.slurm.call import DEADLINE, SlurmError

Echo = Callable[[str], None]


def handler(job: str, run_dir: Path, say: Echo) -> Callable[[spares.Choice, list[CheckResult]], Reach | None]:
    """The Launch's leave_out for Slurm job JOB: scontrol's resize scripts go into RUN_DIR. Returns how the steps
    that follow reach the nodes once the job was shrunk (srun with the job's resized variables), else None."""

    def leave_out(choice: spares.Choice, results: list[CheckResult]) -> Reach | None:
        failing = [n.node for n in choice.failing]
        update.drain_nodes(spares.problems_by_node(results, failing), say, lambda: DEADLINE)
        environ = give_back(job, choice, run_dir, say) if choice.enough else None
        return Fanout(step.factory(job, environ)) if environ is not None else None

    return leave_out


def give_back(job: str, choice: spares.Choice, run_dir: Path, say: Echo) -> dict[str, str] | None:
    """Slurm job JOB shrunk to CHOICE's kept nodes, and to the node running this when it is the job's batch node
    (Slurm cannot take that one from the job: said). Returns the environment of the job steps that follow: this
    process's, with the variables Slurm's resize script sets and unsets; None when nothing was given back. A refusal
    is said in one line: the nodes then idle in the job until it ends."""
    keep = list(choice.kept)
    here = allocation.this_node()
    if here is not None and any(n.node == here for n in choice.left_out):
        keep.append(here)
        say(f"{here} stays in Slurm job {job} unused: it runs the batch script, which Slurm cannot take from the job")
    released = [n.node for n in choice.left_out if n.node not in keep]
    if not released:
        return None
    try:
        environment = allocation.shrink(job, keep, run_dir)
    except SlurmError as exc:
        say(f"could not give {', '.join(released)} back to Slurm ({exc}): they stay idle in job {job} until it ends")
        return None
    say(f"gave {', '.join(released)} back to Slurm: job {job} holds {', '.join(keep)} now")
    return resized(os.environ, environment)


def resized(environ: Mapping[str, str], changes: Mapping[str, str | None]) -> dict[str, str]:
    """ENVIRON as `. ./slurm_job_<id>_resize.sh` leaves it: CHANGES set (a value) or unset (None)."""
    after = dict(environ)
    for name, value in changes.items():
        if value is None:
            after.pop(name, None)
        else:
            after[name] = value
    return after
