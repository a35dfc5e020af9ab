"""What a job left on its node when it ended, for Slurm's Epilog (`clustercheck node-health --slurm --epilog`):
processes of the job's user still running where no other job of that user runs, and /dev/shm left filled. Reading
this machine is left_behind() (/proc, /dev/shm); judge() is pure. What the node-health checks find (a GPU whose
memory is still held, a GPU in a bad state) comes with them, and the node is drained as node-health drains it, with
the one reason format of drain.py (`clustercheck: epilog.processes: ...`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from clustercheck.checks import registry
from clustercheck.checks.epilog import PROCESSES, SHM
from clustercheck.model import CheckResult, Status

SHM_USED_PERCENT = 50.0  # of /dev/shm a job may leave used: past it, the next job's NCCL and DataLoader run short
SHOWN = 3  # processes named in the message


@dataclass(frozen=True)
class Job:
    """The job that ended, as slurmd tells its Epilog (SLURM_JOB_ID, SLURM_JOB_UID, SLURM_JOB_USER)."""

    id: str
    uid: int
    user: str


def job_from(environ) -> Job | None:
    """The job of ENVIRON (the Epilog's environment); None when it names none."""
    job, uid = environ.get("SLURM_JOB_ID", ""), environ.get("SLURM_JOB_UID", "")
    if not job or not uid.isdigit():
        return None
    return Job(job, int(uid), environ.get("SLURM_JOB_USER") or uid)


@dataclass(frozen=True)
class Left:
    """What the job's user still runs on the node (pid, name), and /dev/shm's use (bytes used, size)."""

    processes: tuple[tuple[int, str], ...]
    shm_used: int
    shm_size: int


def left_behind(job: Job, proc: Path = Path("/proc"), shm: str = "/dev/shm") -> Left:
    """This machine's processes of JOB's user and /dev/shm's use; a process that ends while read is skipped."""
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != job.uid:
                continue
            name = (entry / "comm").read_text().strip()
        except OSError:
            continue
        found.append((int(entry.name), name))
    try:
        stat = os.statvfs(shm)
        size, used = stat.f_blocks * stat.f_frsize, (stat.f_blocks - stat.f_bfree) * stat.f_frsize
    except OSError:
        size = used = 0
    return Left(tuple(sorted(found)), used, size)


def judge(node: str, job: Job, left: Left, others: bool) -> list[CheckResult]:
    """What JOB left on NODE: its user's processes (a FAIL unless the user is root, whose are the system's, or OTHERS:
    another job of the user runs here), and /dev/shm over SHM_USED_PERCENT used (a FAIL)."""
    results = []
    if job.uid == 0:
        results.append(registry.emit(PROCESSES, Status.SKIP, f"job {job.id} ran as root", host=node))
    elif not left.processes:
        results.append(registry.emit(PROCESSES, Status.PASS, f"{node}: nothing of {job.user}'s runs", host=node))
    elif others:
        said = f"{node}: {len(left.processes)} process(es) of {job.user}, who has another job here"
        results.append(registry.emit(PROCESSES, Status.PASS, said, host=node))
    else:
        named = ", ".join(f"{pid} {name}" for pid, name in left.processes[:SHOWN])
        more = f" and {len(left.processes) - SHOWN} more" if len(left.processes) > SHOWN else ""
        said = f"{node}: {len(left.processes)} process(es) of {job.user} left after job {job.id}: {named}{more}"
        fix = f"Find why they outlived the job (a daemon it started, a setsid); end them (pkill -u {job.user})."
        results.append(registry.emit(PROCESSES, Status.FAIL, said, host=node, remediation=fix))
    if left.shm_size:
        percent = 100.0 * left.shm_used / left.shm_size
        said = f"{node}: /dev/shm is {percent:.0f} % used after job {job.id}"
        if percent > SHM_USED_PERCENT:
            results.append(registry.emit(SHM, Status.FAIL, said, host=node))
        else:
            results.append(registry.emit(SHM, Status.PASS, said, host=node))
    return results
