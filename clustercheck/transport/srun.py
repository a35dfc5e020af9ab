"""A node reached through Slurm: every command is a job step on that node (`srun --jobid=JOB --nodelist=NODE`),
started from the login node inside an allocation that holds the nodes; no SSH.

The step runs the same node-side line as over SSH (transport.remote_command: the run marker, a session of its own,
the node-side deadline), so cleanup, the stale sweep and the reports work the same. Files travel as base64 through
the step's standard input and output. The srun client on this machine is killed at the command's deadline, and a
step of its own then stops what the command left on the node (the run-marker sweep). A node where no step runs is
named with what srun and Slurm say about it (slurm/diagnose.py), and Slurm's fix, not SSH's.

This module is the transport; Slurm's side lives in slurm/step.py: the step's srun line (given to the transport as
STEP, a shell line -> its argv), srun's options by version, and the factory that makes this transport for a job and
names a node where no step ran. (transport does not import slurm: slurm imports transport's CommandResult.)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from clustercheck.transport import (
    CLEANUP_TIMEOUT,
    CommandResult,
    OutputSink,
    SessionQuirks,
    TransportError,
    remote_command,
    sweep_script,
    workdir_for,
)
from clustercheck.transport.local import run_process

STEP_SLACK = 10.0  # seconds a step may take beyond its command's deadline to start and report (srun's own work)


class SrunTransport:
    """One node of a Slurm allocation, reached with job steps from this machine."""

    def __init__(
        self,
        host: str,
        run_id: str,
        job: str,
        step: Callable[[str], list[str]],
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.host = host
        self.run_id = run_id
        self.job = job
        self.workdir = workdir_for(run_id)
        self.quirks = SessionQuirks()
        self.channel = "srun to it"
        self._step = step  # a shell line -> the srun line that runs it on this node, as a step of JOB
        self._environ = environ  # srun's environment (the job's variables): None, this process's

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
