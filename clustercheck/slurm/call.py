"""The one way clustercheck runs a Slurm command (salloc, sbatch, scontrol, squeue, scancel) on this machine: with a
deadline, both streams kept, and the answer as a transport's CommandResult, whose cause() says in one line why a
command failed, as it does for a command on a node. A program that cannot run here at all is a SlurmError.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from typing import IO

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


def follow(argv: list[str], timeout: float, every: float, watch: Callable[[str], None]) -> CommandResult:
    """ARGV run as call() runs it, WATCH given what it has written to stderr so far every EVERY seconds while it runs
    (salloc says there which job it waits for); past TIMEOUT it is killed and the result timed out. However this
    ends (a Ctrl-C, WATCH raising), the program does not outlive it."""
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    except (OSError, subprocess.SubprocessError) as exc:
        raise SlurmError(f"{argv[0]} cannot run here: {exc}") from exc
    out: list[str] = []
    err: list[str] = []
    readers = [
        threading.Thread(target=_read, args=(stream, kept), daemon=True)
        for stream, kept in ((proc.stdout, out), (proc.stderr, err))
    ]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                proc.wait(timeout=max(0.0, min(every, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    proc.kill()
                    proc.wait()
                    return CommandResult(None, "".join(out), "".join(err), timed_out=True)
                watch("".join(err))
    except BaseException:
        proc.terminate()  # salloc, ended so, takes its request back
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    for reader in readers:
        reader.join(5)
    return CommandResult(proc.returncode, "".join(out), "".join(err))


def _read(stream: IO[str] | None, kept: list[str]) -> None:
    if stream is not None:
        for line in iter(stream.readline, ""):
            kept.append(line)


def _text(output: str | bytes | None) -> str:
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""
