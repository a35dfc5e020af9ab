"""What a Slurm job left on its node, judged by the Epilog (`clustercheck node-health --slurm --epilog`,
clustercheck/slurm/epilog.py reads the node and judges): not run by `clustercheck run`, whose nodes run no job of
their own to leave anything behind."""

from __future__ import annotations

from clustercheck.checks.registry import declare

PROCESSES = "epilog.processes"
SHM = "epilog.shm"

declare(
    PROCESSES,
    stage="core",
    scope="node",
    proves="after a Slurm job, none of its user's processes still runs on the node (unless another job of that "
    "user runs there); checked by node-health's Epilog only",
    fix="Find why they outlived the job (a daemon it started, a setsid); end them (pkill -u USER).",
)
declare(
    SHM,
    stage="core",
    scope="node",
    proves="after a Slurm job, /dev/shm is not left filled (at most half used); checked by node-health's Epilog only",
    fix="Remove what the job left in /dev/shm (ls -la /dev/shm), and find which program does not clean up.",
)
