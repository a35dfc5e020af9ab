"""A node reached through Slurm: every command is a job step on that node (`srun --jobid=JOB --nodelist=NODE`),
started from the login node inside an allocation that holds the nodes; no SSH.

The step runs the same node-side line as over SSH (transport.remote_command: the run marker, a session of its own,
the node-side deadline), so cleanup, the stale sweep and the reports work the same. Files travel as base64 through
the step's standard input and output. The srun client on this machine is killed at the command's deadline, and a
step of its own then stops what the command left on the node (the run-marker sweep). A node where no step runs is
named with what srun and Slurm say about it (diagnose.py), and Slurm's fix, not SSH's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from clustercheck.inventory import Node
from clustercheck.slurm import diagnose, parse
from clustercheck.slurm.call import SlurmError, call
from clustercheck.transport import (
    CLEANUP_TIMEOUT,
    CommandResult,
    OutputSink,
    SessionQuirks,
    Transport,
    TransportError,
    remote_command,
    sweep_script,
    workdir_for,
)
from clustercheck.transport.factory import Connected, Factory
from clustercheck.transport.local import run_process

STEP_SLACK = 10.0  # seconds a step may take beyond its command's deadline to start and report (srun's own work)
CONNECT_TIMEOUT = 30.0  # the first step on a node: Slurm answers, the node runs it


class SrunTransport:
    """One node of a Slurm allocation, reached with job steps from this machine."""

    def __init__(
        self,
        host: str,
        run_id: str,
        job: str,
        step_options: tuple[str, ...] = (),
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.host = host
        self.run_id = run_id
        self.job = job
        self.workdir = workdir_for(run_id)
        self.quirks = SessionQuirks()
        self.channel = "srun to it"
        self._options = step_options
        self._environ = environ  # srun's environment (the job's variables): None, this process's

    def _step(self, line: str) -> list[str]:
        """The srun command line that runs the shell LINE on this node, as one task of a step of the job."""
        return [
            "srun",
            f"--jobid={self.job}",
            f"--nodelist={self.host}",
            "--nodes=1",
            "--ntasks=1",
            *self._options,
            "--quiet",
            "/bin/sh",
            "-c",
            line,
        ]

    def _run_step(
        self,
        line: str,
        timeout: float,
        stdin: str | None = None,
        on_output: OutputSink | None = None,
        after_kill: Callable[[], None] | None = None,
    ) -> CommandResult:
        return run_process(
            self._step(line),
            timeout=timeout,
            env=dict(os.environ if self._environ is None else self._environ),
            stdin=stdin,
            on_output=on_output,
            after_kill=after_kill,
        )

    def run(
        self,
        command: list[str],
        *,
        timeout: float,
        env: dict[str, str] | None = None,
        stdin: str | None = None,
        on_output: OutputSink | None = None,
    ) -> CommandResult:
        line = remote_command(command, env or {}, self.run_id, timeout, self.workdir)
        return self._run_step(line, timeout + STEP_SLACK, stdin, on_output, after_kill=self.stop)

    def stop(self) -> None:
        """Kill every process of this run on the node, keeping the work directory (a job's logs)."""
        self._run_step(sweep_script(self.run_id, "/nonexistent-clustercheck"), CLEANUP_TIMEOUT)

    def cleanup(self) -> None:
        result = self._run_step(sweep_script(self.run_id, self.workdir), CLEANUP_TIMEOUT)
        if not result.ok:
            raise TransportError(f"{self.host}: the cleanup step failed: {result.cause()}")

    def close(self) -> None:
        pass


def step_options(version: tuple[int, int] | None) -> tuple[str, ...]:
    """srun's options for clustercheck's steps, by Slurm's VERSION: steps share the allocation's resources with
    the others running beside them (--overlap, from Slurm 20.11 on; before it, steps shared them by default)."""
    return ("--overlap",) if version is None or version >= (20, 11) else ()


def factory(job: str, environ: Mapping[str, str] | None = None) -> Factory:
    """Transports that reach the nodes of Slurm job JOB with its steps, srun started with ENVIRON (None: this
    process's environment; after the job was resized, the variables Slurm's resize script sets); SlurmError when srun
    cannot run here."""
    options = step_options(parse.parse_version(call(["srun", "--version"]).stdout))

    def connect(node: Node, run_id: str, register: Callable[[Transport], None]) -> Connected:
        transport = SrunTransport(node.name, run_id, job, options, environ)
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
