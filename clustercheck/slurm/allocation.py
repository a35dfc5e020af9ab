"""The Slurm allocation a command runs its job steps in: the one it runs inside (salloc, sbatch: SLURM_JOB_ID), or
one asked for from the login node (salloc --no-shell) and given back when the command ends, however it ends: Slurm's
nodes read first, so that a request Slurm cannot grant (grant.py) is refused at once with Slurm's reasons, and a
request that waits said with squeue's reason as it changes; and its nodes, by name (scontrol show hostnames) and by
their address here; and the job shrunk to fewer of them (launch --spare gives the nodes it does not use back).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from clustercheck.inventory import Node
from clustercheck.slurm import grant, parse, update
from clustercheck.slurm.call import SlurmError, call, follow
from clustercheck.slurm.request import Request

JOB_NAME = "clustercheck"  # the allocation run --slurm asks for
POLL = 10.0  # seconds between squeue's looks at a request that waits (sinfo(1), PERFORMANCE: no tight loops)


class NotGranted(SlurmError):
    """Slurm granted no allocation within the wait."""


def inside(environ: Mapping[str, str] = os.environ) -> str | None:
    """The id of the Slurm job this runs in (under salloc or sbatch), or None."""
    return environ.get("SLURM_JOB_ID") or None


def partition(environ: Mapping[str, str] = os.environ) -> str | None:
    """The partition of the Slurm job this runs in (SLURM_JOB_PARTITION), or None."""
    return environ.get("SLURM_JOB_PARTITION") or None


def current(environ: Mapping[str, str] = os.environ) -> tuple[str, str]:
    """The job id and node list of the Slurm allocation this runs in (inside salloc or sbatch)."""
    job, nodelist = environ.get("SLURM_JOB_ID"), environ.get("SLURM_JOB_NODELIST")
    if not job or not nodelist:
        raise SlurmError(
            "not inside a Slurm allocation (no SLURM_JOB_ID): run it under salloc or sbatch, "
            "e.g. salloc --nodes=3 clustercheck run --slurm"
        )
    return job, nodelist


@contextlib.contextmanager
def allocated(request: Request, wait: int, say: Callable[[str], None] = lambda line: None) -> Iterator[tuple[str, str]]:
    """The nodes of REQUEST asked for (salloc --no-shell), waiting at most WAIT seconds for Slurm to grant them:
    the job's id and node list, the job cancelled (and so every step still running in it) when the block ends,
    however it ends (a Ctrl-C included). NotGranted at once when Slurm cannot grant them (refused), and when it
    granted none within WAIT, with the last reason it gave; while it waits, its reason is said (SAY) as it changes."""
    refused = refusal(request, say)
    if refused is not None:
        raise NotGranted(refused)
    argv = ["salloc", "--no-shell", f"--job-name={JOB_NAME}", f"--immediate={wait}", *request.options()]
    waiting = Waiting(request.partition, say)
    try:
        answer = follow(argv, wait + 60, 1.0, waiting.watch)
    except SlurmError as exc:
        raise NotGranted(str(exc)) from exc
    except BaseException:
        waiting.cancel()
        raise
    job = parse.granted_job(answer.stderr + answer.stdout)
    if job is None:
        waiting.job = waiting.job or parse.pending_job(answer.stderr)
        waiting.look()  # the last reason, before the request is taken back
        waiting.cancel()
        last = f"{waiting.said}; " if waiting.said else ""
        raise NotGranted(
            f"Slurm granted no allocation ({shlex.join(argv[1:])}) within {wait} s: {last}{answer.cause()}"
        )
    try:
        yield job, call(["squeue", "--noheader", "--jobs", job, "--format=%N"]).stdout.strip()
    finally:
        with contextlib.suppress(SlurmError):
            call(["scancel", job])


def refusal(request: Request, say: Callable[[str], None]) -> str | None:
    """Why Slurm cannot grant REQUEST (grant.refusal, on Slurm's nodes and partitions read here), or None: it can,
    or they could not be read (said; Slurm is asked then, as it would be without this look)."""
    scontrol = shutil.which("scontrol") or "scontrol"
    nodes, why = update.all_nodes(scontrol, 30.0)
    try:
        shown = call([scontrol, "show", "partition"])
        partitions = parse.parse_show_partitions(shown.stdout) if shown.ok else []
        named = hostnames(request.nodelist) if request.nodelist else []
    except SlurmError as exc:
        nodes, why = None, str(exc)
    if nodes is None:
        say(f"Slurm's nodes could not be read first ({why}): asking Slurm for them all the same")
        return None
    return grant.refusal(request.nodes or 0, named, nodes, partitions, request.partition)


class Waiting:
    """A request salloc waits for: its job id (from salloc's "Pending job allocation N"), and squeue's reason for it,
    read at most every POLL seconds and said (SAY) each time it changes, with the jobs on the partition's nodes;
    SAID: the last line said."""

    def __init__(self, partition: str | None, say: Callable[[str], None]) -> None:
        self.partition, self.say = partition, say
        self.job: str | None = None
        self.reason: str | None = None
        self.said = ""
        self._looked = 0.0

    def watch(self, salloc_stderr: str) -> None:
        """salloc's words so far: once they give the job id, its reason is read when a look is due."""
        self.job = self.job or parse.pending_job(salloc_stderr)
        if self.job is not None and time.monotonic() - self._looked >= POLL:
            self.look()

    def look(self) -> None:
        """squeue's reason for the job read now, and said if it changed. Never raises."""
        self._looked = time.monotonic()
        if self.job is None:
            return
        with contextlib.suppress(SlurmError):
            shown = call(["squeue", "--noheader", "--jobs", self.job, f"--format={parse.SQUEUE_FORMAT}"])
            queued = parse.parse_squeue(shown.stdout) if shown.ok else []
            if not queued or queued[0].state != "PENDING" or queued[0].reason == self.reason:
                return
            self.reason = queued[0].reason
            where = [f"--partition={self.partition}"] if self.partition else []
            busy = call(["squeue", "--noheader", "--states=RUNNING", *where, f"--format={parse.SQUEUE_FORMAT}"])
            self.said = grant.pending(self.job, self.reason, parse.parse_squeue(busy.stdout) if busy.ok else [])
            self.say(self.said)

    def cancel(self) -> None:
        """The request taken back, if Slurm gave it a job id (salloc ended without an allocation)."""
        if self.job is not None:
            with contextlib.suppress(SlurmError):
                call(["scancel", self.job])


def hostnames(nodelist: str) -> list[str]:
    """The node names of NODELIST (host list syntax, node[1-3]), in order (scontrol show hostnames)."""
    answer = call(["scontrol", "show", "hostnames", nodelist])
    names = parse.allocation_nodes(answer.stdout)
    if not answer.ok or not names:
        raise SlurmError(f"scontrol show hostnames {nodelist}: {answer.cause() if not answer.ok else 'no node'}")
    return names


def nodes(given: list[Node], job: str, nodelist: str) -> list[Node]:
    """The nodes of Slurm job JOB (NODELIST): GIVEN (from --hosts) when there are any, which must all be in it, else
    every node of the allocation, at the address its name has here (the cluster's /etc/hosts)."""
    names = hostnames(nodelist)
    if given:
        outside = [n.name for n in given if n.name not in names]
        if outside:
            raise SlurmError(f"{', '.join(outside)} not in Slurm job {job} ({nodelist})")
        return given
    found = []
    for name in names:
        try:
            found.append(Node(name, socket.gethostbyname(name)))
        except OSError as exc:
            raise SlurmError(f"node {name} of job {job} has no address here: {exc}") from exc
    return found


def shrink(job: str, nodes: list[str], cwd: Path) -> dict[str, str | None]:
    """Slurm job JOB, running, shrunk to NODES (scontrol update JobId=JOB NodeList=NODES: a user may shrink their own
    job), the others given back to Slurm; scontrol writes its resize scripts into CWD. Returns what Slurm's resize
    script does to the variables of the job's later steps (parse.resize_environment: SLURM_JOB_NODELIST set,
    SLURM_NTASKS unset, ...); SlurmError, one line, when Slurm refuses."""
    argv = ["scontrol", "update", f"JobId={job}", f"NodeList={','.join(nodes)}"]
    answer = call(argv, cwd=str(cwd))
    if not answer.ok:
        raise SlurmError(f"{shlex.join(argv)}: {answer.cause()}")
    script = cwd / f"slurm_job_{job}_resize.sh"
    return parse.resize_environment(script.read_text(errors="replace")) if script.exists() else {}


def this_node(environ: Mapping[str, str] = os.environ) -> str | None:
    """The node of the allocation this runs on, when slurmd started it (a batch script, a step: SLURMD_NODENAME);
    None under salloc on a login node."""
    return environ.get("SLURMD_NODENAME") or None
