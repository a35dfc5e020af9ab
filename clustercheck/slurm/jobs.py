"""A launch's batch job from the login node (`launch --slurm` outside an allocation, `jobs --slurm`, `logs`, `stop`):
submitting it (sbatch), asking how it stands (scontrol), following its output file until it ends, cancelling it
(scancel), and listing this user's (squeue); each command run through call.py, Slurm's own words in a SlurmError.

The output file is written by Slurm on the job's batch node; it is read here, so the run directory must be on a
filesystem the login node shares with the nodes (as the home directories of a Slurm cluster are). When it does
not show up here while the job runs, clustercheck says so once and still waits for the job's end and status.
"""

from __future__ import annotations

import os
import pwd
import time
from collections.abc import Callable
from pathlib import Path

from clustercheck.slurm import parse
from clustercheck.slurm.call import SlurmError, call
from clustercheck.slurm.parse import SlurmJob

Echo = Callable[[str], None]

POLL = 1.0  # seconds between two looks at the job and its output file
NOT_SHARED_AFTER = 20.0  # seconds a running job's output file may take to appear here before clustercheck says so
CANCEL_WAIT = 60.0  # seconds scancel's job may take to end


def submit(script_path: Path) -> str:
    """sbatch SCRIPT_PATH: the job's id. Raises SlurmError with sbatch's own words when Slurm refuses it."""
    answer = call(["sbatch", "--parsable", str(script_path)], timeout=120)
    job = parse.submitted_job(answer.stdout) if answer.ok else None
    if job is None:
        raise SlurmError(f"Slurm did not take the batch job ({script_path}): {answer.cause()}")
    return job


def show(job: str) -> SlurmJob | None:
    """How job JOB stands, as slurmctld knows it (scontrol show job); None once it no longer does (MinJobAge after
    the job's end, 300 s by default: following polls far more often)."""
    answer = call(["scontrol", "show", "job", job])
    return parse.parse_show_job(answer.stdout, job) if answer.ok else None


def cancel(job: str, wait: float = CANCEL_WAIT, seen: SlurmJob | None = None) -> SlurmJob | None:
    """Stop job JOB and wait (at most WAIT seconds for each way) until Slurm says it ended; how it stands then.

    A running job's batch step, `clustercheck launch` itself, gets SIGTERM first (scancel --batch): it stops every
    node's torchrun and cleans the nodes up with job steps, which a cancelled job could no longer start. Only a job
    still running after that, or one that has not started, is cancelled outright. SEEN: how the job stood a moment
    ago (show()), when the caller just asked."""
    found = seen if seen is not None else show(job)
    if found is not None and found.state == "RUNNING":
        _scancel(["--batch", "--signal=TERM", job])
        found = _wait_end(job, wait)
    if found is not None and not found.ended:
        _scancel([job])
        found = _wait_end(job, wait)
    return found


def _scancel(args: list[str]) -> None:
    answer = call(["scancel", *args])
    if not answer.ok:
        raise SlurmError(f"scancel {' '.join(args)}: {answer.cause()}")


def _wait_end(job: str, wait: float) -> SlurmJob | None:
    deadline = time.monotonic() + wait
    while True:
        found = show(job)
        if found is None or found.ended or time.monotonic() > deadline:
            return found
        time.sleep(POLL)


class OutputFile:
    """The job's output file read from where the last read stopped, in whole lines."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def exists(self) -> bool:
        return self.path.exists()

    def read(self, echo: Echo, final: bool = False) -> None:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        if final and self.partial:
            lines.append(self.partial)
            self.partial = b""
        for line in lines:
            echo(line.decode(errors="replace"))


def follow(
    job: str,
    reader: OutputFile,
    echo: Echo,
    say: Echo,
    *,
    state: Callable[[str], SlurmJob | None] = show,
    poll: float = POLL,
    unshared_after: float = NOT_SHARED_AFTER,
) -> SlurmJob | None:
    """Job JOB's output (READER's file) echoed line by line until the job ends; how it ended (None: Slurm no
    longer knows it). SAY tells what the job waits for, where it runs, and when its output is not visible here.
    Interrupted, READER goes on from where it stopped (the job's last lines, once it is stopped)."""
    output = reader.path
    told: set[str] = set()
    running_since: float | None = None

    def once(key: str, line: str) -> None:
        if key not in told:
            told.add(key)
            say(line)

    while True:
        found = state(job)
        reader.read(echo)
        if found is None or found.ended:
            reader.read(echo, final=True)
            return found
        if found.state == "PENDING":
            waits = f"is waiting ({found.reason})" if found.reason else "is waiting to start"
            once(f"pending {found.reason}", f"Slurm job {job} {waits}")
        elif found.state == "RUNNING":
            running_since = running_since or time.monotonic()
            where = f" (its batch script on {found.batch_host})" if found.batch_host else ""
            once("running", f"Slurm job {job} runs on {found.nodes}{where}; its output: {output}")
            if not reader.exists() and time.monotonic() - running_since >= unshared_after:
                once(
                    "unshared",
                    f"the job's output file {output} does not show up here: Slurm writes it on "
                    f"{found.batch_host or 'the batch node'}; put the run directory on a filesystem the nodes share "
                    "(--run-dir) to follow it from here. Waiting for the job's end.",
                )
        time.sleep(poll)


def listed(name: str, ended_too: bool) -> list[parse.Queued]:
    """This user's jobs named NAME as squeue lists them: pending and running, and with ENDED_TOO those that ended
    and slurmctld still remembers."""
    user = pwd.getpwuid(os.getuid()).pw_name
    argv = ["squeue", "--noheader", f"--name={name}", f"--user={user}", f"--format={parse.SQUEUE_FORMAT}"]
    answer = call(argv + (["--states=all"] if ended_too else []))
    if not answer.ok:
        raise SlurmError(f"squeue: {answer.cause()}")
    return parse.parse_squeue(answer.stdout)
