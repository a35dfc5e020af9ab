"""A launch as a Slurm batch job (`launch --slurm` from the login node): its batch script written into the run
directory (slurm/batch.py) and printed (--dry-run) or submitted, recorded on this machine, then followed until it
ends (or its id printed, --detach); and such jobs listed (`jobs --slurm`), their output shown (`logs JOB`) and
stopped (`stop JOB`), each through slurm/jobs.py.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from clustercheck.exitcodes import ExitCode, JobNotStarted, UsageError, WorkFailed
from clustercheck.launcher import records
from clustercheck.slurm import allocation, batch, jobs
from clustercheck.slurm.call import SlurmError
from clustercheck.slurm.request import Request

Echo = Callable[[str], None]


def submit(
    request: Request, inner: list[str], run_dir: Path, *, dry_run: bool, detach: bool, echo: Echo, say: Echo
) -> int:
    """The batch script asking REQUEST's nodes and running `clustercheck launch --slurm INNER` inside, written into
    RUN_DIR; printed (DRY_RUN) or submitted (what Slurm cannot grant now said first, slurm/grant.py); then the job's
    id printed (DETACH), or its output followed until it ends: the exit status is the job's. Ctrl-C cancels the
    job."""
    path = run_dir / "launch.sbatch"
    path.write_text(batch.script(request, clustercheck_command(), inner, run_dir, Path.cwd()))
    if dry_run:
        echo(path.read_text().removesuffix("\n"))
        say(f"not submitted (--dry-run); the script is {path}: submit it with sbatch {shlex.quote(str(path))}")
        return ExitCode.OK
    refused = allocation.refusal(request, lambda line: None)  # Slurm's nodes read first, as run --slurm reads them
    if refused is not None:  # a batch job may wait for an administrator: said, and submitted all the same
        say(f"{refused}; submitting all the same: the job waits in Slurm's queue until Slurm can grant it")
    try:
        job = jobs.submit(path)
    except SlurmError as exc:
        raise JobNotStarted(str(exc)) from exc
    records.save(
        records.JobRecord(
            job=job,
            hosts="",
            limit=None,
            nodes=[],
            command=inner[inner.index("--") + 1 :],
            started=time.time(),
            run_dir=str(run_dir),
            slurm=True,
        )
    )
    output = batch.output_path(run_dir, job)
    say(f"submitted Slurm job {job} ({path}); its output: {output}")
    if detach:
        echo(job)
        say(f"follow it: clustercheck logs {job} --follow; stop it: clustercheck stop {job}")
        return ExitCode.OK
    return _follow(job, jobs.OutputFile(output), echo, say)


def _follow(job: str, reader: jobs.OutputFile, echo: Echo, say: Echo) -> int:
    try:
        ended = jobs.follow(job, reader, echo, say)
    except KeyboardInterrupt:
        say(f"cancelling Slurm job {job}")
        with contextlib.suppress(SlurmError):
            jobs.cancel(job)
        reader.read(echo, final=True)  # the launch inside, stopping every node
        raise
    except SlurmError as exc:
        raise WorkFailed(f"Slurm job {job}: {exc}") from exc
    if ended is None:
        raise WorkFailed(f"Slurm no longer knows job {job}: its end and status are unknown")
    status, message = ended.status()
    say(message)
    return status


def clustercheck_command() -> list[str]:
    """How this clustercheck is run, for a batch script on another node of the cluster: the command's own path (the
    slurm role installs it as /usr/local/bin/clustercheck on every node), else this python's -m clustercheck."""
    here = Path(sys.argv[0])
    if here.name == "clustercheck":
        return [os.path.abspath(here) if here.parent != Path() else shutil.which("clustercheck") or "clustercheck"]
    return [sys.executable, "-m", "clustercheck"]


def listed(show_all: bool, echo: Echo, say: Echo) -> None:
    """The launches this user submitted to Slurm: pending and running (SHOW_ALL: also those Slurm still
    remembers)."""
    try:
        found = jobs.listed(batch.JOB_NAME, show_all)
    except SlurmError as exc:
        raise WorkFailed(f"--slurm: {exc}") from exc
    for entry in found:
        echo(entry.line())
    if not found:
        say("no running jobs" if not show_all else "no jobs")


def logs(job: str, follow: bool, echo: Echo, say: Echo) -> None:
    """A Slurm job's output: the file scontrol names, else (once Slurm has forgotten the job) the one in the run
    directory of a launch recorded on this machine; FOLLOW: until the job ends."""
    try:
        record = records.load(job)
    except records.RecordError:
        record = None
    try:
        found = jobs.show(job)
    except SlurmError as exc:
        raise WorkFailed(f"Slurm job {job}: {exc}") from exc
    if found is not None and found.stdout:  # Slurm's word first: its job ids start again at 1 on a new cluster
        path = Path(found.stdout)
    elif record is not None and record.slurm:
        path = batch.output_path(Path(record.run_dir), job)
    else:
        raise UsageError(f"no job {job}: not launched from this machine, and Slurm does not know it")
    if follow and found is not None and not found.ended:
        try:
            jobs.follow(job, jobs.OutputFile(path), echo, say)
        except SlurmError as exc:
            raise WorkFailed(f"Slurm job {job}: {exc}") from exc
        return
    if not path.exists():
        where = f" (Slurm writes it on {found.batch_host}, the job's batch node)" if found and found.batch_host else ""
        raise WorkFailed(f"Slurm job {job}: its output {path} is not on this machine{where}")
    jobs.OutputFile(path).read(echo, final=True)


def stop(job: str, echo: Echo) -> None:
    """Stop a launch's Slurm job (jobs.cancel) and wait for its end; a job clustercheck did not launch is left
    alone."""
    try:
        found = jobs.show(job)
        if found is None:
            raise UsageError(f"no Slurm job {job}")
        if found.name != batch.JOB_NAME:
            raise UsageError(f"Slurm job {job} ({found.name}) is not a clustercheck launch: cancel it with scancel")
        if found.ended:
            raise UsageError(f"Slurm job {job} is not running ({found.state})")
        ended = jobs.cancel(job, seen=found)
    except SlurmError as exc:
        raise WorkFailed(f"Slurm job {job}: {exc}") from exc
    if ended is not None and not ended.ended:
        raise WorkFailed(f"Slurm job {job} still {ended.state} {jobs.CANCEL_WAIT:.0f} s after scancel")
    how = f"Slurm: {ended.state}, exit {ended.exit_code}" if ended is not None else "Slurm no longer knows it"
    echo(f"{job}: stopped on {found.nodes} ({how})")
