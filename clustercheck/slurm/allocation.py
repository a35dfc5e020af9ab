"""The Slurm allocation a command runs its job steps in: the one it runs inside (salloc, sbatch: SLURM_JOB_ID), or
one asked for from the login node (salloc --no-shell) and given back when the command ends, however it ends; and
its nodes, by name (scontrol show hostnames) and by their address here; and the job shrunk to fewer of them (launch
--spare gives the nodes it does not use back).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
from collections.abc import Iterator, Mapping
from pathlib import Path

from clustercheck.inventory import Node
from clustercheck.slurm import parse
from clustercheck.slurm.call import SlurmError, call
from clustercheck.slurm.request import Request

JOB_NAME = "clustercheck"  # the allocation run --slurm asks for


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
def allocated(request: Request, wait: int) -> Iterator[tuple[str, str]]:
    """The nodes of REQUEST asked for (salloc --no-shell), waiting at most WAIT seconds for Slurm to grant them:
    the job's id and node list, the job cancelled (and so every step still running in it) when the block ends,
    however it ends (a Ctrl-C included). NotGranted when Slurm grants none."""
    argv = ["salloc", "--no-shell", f"--job-name={JOB_NAME}", f"--immediate={wait}", *request.options()]
    try:
        answer = call(argv, timeout=wait + 60)
    except SlurmError as exc:
        raise NotGranted(str(exc)) from exc
    job = parse.granted_job(answer.stderr + answer.stdout)
    if job is None:
        raise NotGranted(f"Slurm granted no allocation ({shlex.join(argv[1:])}): {answer.cause()}")
    try:
        yield job, call(["squeue", "--noheader", "--jobs", job, "--format=%N"]).stdout.strip()
    finally:
        with contextlib.suppress(SlurmError):
            call(["scancel", job])


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
