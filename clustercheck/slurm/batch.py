"""`clustercheck launch --slurm` outside an allocation: the batch script it submits (pure; submitting and following
the job is jobs.py).

The script asks Slurm for whole nodes and runs `clustercheck launch --slurm` inside the job's allocation: there
the launch is the one it is over SSH (the preflight, the same-code check, torchrun on every node with each node's
environment python, the first node as rendezvous, the cluster interface), every command a job step (srun) instead
of an SSH command. So the script is short, readable, and can be kept and submitted again with `sbatch`.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from clustercheck.slurm.request import Request

JOB_NAME = "clustercheck-launch"  # what `clustercheck jobs --slurm` lists
OUTPUT = "slurm-%j.out"  # in the run directory: the job's output, every rank's line with its node/rank prefix


def output_path(run_dir: Path, job: str) -> Path:
    """Where Slurm writes job JOB's output (OUTPUT in RUN_DIR)."""
    return run_dir / OUTPUT.replace("%j", job)


def script(request: Request, clustercheck: list[str], launch_args: list[str], run_dir: Path, cwd: Path) -> str:
    """The batch script: REQUEST's nodes, whole (every CPU and GPU of each, as multi-node training wants, one task
    per node), the output in RUN_DIR, the working directory CWD; then CLUSTERCHECK (the command that runs
    clustercheck, at the same path on the batch node) `launch --slurm` with LAUNCH_ARGS (the launch's own options,
    then -- and the user's torchrun line), its run directory RUN_DIR/job-<job id>."""
    directives = [
        f"--job-name={JOB_NAME}",
        *request.options(),
        "--ntasks-per-node=1",
        "--exclusive",  # sbatch(1), 22.05: every CPU and GRES (GPU) of each node, memory only as requested...
        "--mem=0",  # ...and this asks for all of it
        f"--output={run_dir / OUTPUT}",
        f"--chdir={cwd}",
    ]
    inner = shlex.join([*clustercheck, "launch", "--slurm", "--run-dir", str(run_dir)])
    return "\n".join(
        [
            "#!/bin/sh",
            *(f"#SBATCH {d}" for d in directives),
            "#",
            "# Written by `clustercheck launch --slurm`; submit it again with: sbatch "
            + shlex.quote(str(run_dir))
            + "/launch.sbatch",
            "# Inside the job's allocation clustercheck runs the preflight (the core and network checks) on the job's",
            "# nodes, checks that the script's code is the same on every node, then starts torchrun on every node",
            "# with what it found there (the environment python, the first node as rendezvous, the cluster",
            "# interface), each as a job step (srun); every rank's output is prefixed with its node/rank.",
            f'exec {inner}/job-"$SLURM_JOB_ID" {shlex.join(launch_args)}',
            "",
        ]
    )
