"""The one way clustercheck runs a Slurm command (salloc, sbatch, scontrol, squeue, scancel) on this machine: with a
deadline, both streams kept, and the answer as a transport's CommandResult, whose cause() says in one line why a
command failed, as it does for a command on a node. A program that cannot run here at all is a SlurmError.
"""

from __future__ import annotations

import subprocess

from clustercheck.transport import CommandResult

DEADLINE = 30.0  # seconds a Slurm command may take unless its caller says otherwise


class SlurmError(Exception):
    """A Slurm command could not run or refused: one line."""


def call(argv: list[str], timeout: float = DEADLINE, cwd: str | None = None) -> CommandResult:
    """ARGV run here (in CWD, default the current directory) within TIMEOUT seconds (a timed-out result past it);
    SlurmError when it cannot be started."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        return CommandResult(None, _text(exc.stdout), _text(exc.stderr), timed_out=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SlurmError(f"{argv[0]} cannot run here: {exc}") from exc
    return CommandResult(proc.returncode, proc.stdout, proc.stderr)


def checked(argv: list[str], timeout: float = DEADLINE) -> CommandResult:
    """ARGV as call() runs it; SlurmError naming the command and why it failed unless it succeeded."""
    result = call(argv, timeout)
    if not result.ok:
        raise SlurmError(f"{' '.join(argv)}: {result.cause()}")
    return result


def _text(output: str | bytes | None) -> str:
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""
