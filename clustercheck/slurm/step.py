"""A job step on one node of an allocation, as Slurm takes it: srun's options by Slurm's version, the srun line
that runs one shell line on one node, the factory of the transports that run their commands as such steps
(transport/srun.py, for run --slurm and launch inside an allocation), and the node as Slurm shows it when no step
ran there. Slurm's command lines stay here, with the rest of Slurm's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from clustercheck.inventory import Node
from clustercheck.slurm import diagnose, parse
from clustercheck.slurm.call import SlurmError, call
from clustercheck.transport import Transport, TransportError
from clustercheck.transport.factory import Connected, Factory
from clustercheck.transport.srun import SrunTransport

CONNECT_TIMEOUT = 30.0  # the first step on a node: Slurm answers, the node runs it


def step_options(version: tuple[int, int] | None) -> tuple[str, ...]:
    """srun's options for clustercheck's steps, by Slurm's VERSION: steps share the allocation's resources with
    the others running beside them (--overlap, from Slurm 20.11 on; before it, steps shared them by default)."""
    return ("--overlap",) if version is None or version >= (20, 11) else ()


def options_here() -> tuple[str, ...]:
    """step_options for the srun on this machine; SlurmError when srun cannot run here."""
    return step_options(parse.parse_version(call(["srun", "--version"]).stdout))


def step_argv(job: str, host: str, options: tuple[str, ...], line: str) -> list[str]:
    """The srun command line that runs the shell LINE on node HOST, as one task of a step of job JOB."""
    return [
        "srun",
        f"--jobid={job}",
        f"--nodelist={host}",
        "--nodes=1",
        "--ntasks=1",
        *options,
        "--quiet",
        "/bin/sh",
        "-c",
        line,
    ]


def factory(job: str, environ: Mapping[str, str] | None = None) -> Factory:
    """Transports that reach the nodes of Slurm job JOB with its steps, srun started with ENVIRON (None: this
    process's environment; after the job was resized, the variables Slurm's resize script sets); SlurmError when srun
    cannot run here."""
    options = options_here()

    def connect(node: Node, run_id: str, register: Callable[[Transport], None]) -> Connected:
        transport = SrunTransport(
            node.name, run_id, job, lambda line: step_argv(job, node.name, options, line), environ
        )
        register(transport)
        answer = transport.run(["true"], timeout=CONNECT_TIMEOUT)
        if not answer.ok:
            refused = diagnose.step_refused(node.name, answer, shown_node(node.name))
            raise TransportError(f"{node.name}: no job step of Slurm job {job} ran there: {refused.said}", refused.fix)
        return Connected(transport, f"srun, a step of Slurm job {job}", {"job": job})

    return connect


def shown_node(name: str) -> parse.SlurmNode | str:
    """Node NAME as Slurm shows it (scontrol show node), or why it could not be read."""
    try:
        answer = call(["scontrol", "show", "node", name])
    except SlurmError as exc:
        return str(exc)
    if not answer.ok:
        return f"scontrol show node {name}: {answer.cause()}"
    try:
        return parse.parse_show_node(answer.stdout, name)
    except parse.ParseError as exc:
        return f"scontrol show node {name}: {exc}"
