"""The local machine as a node, through subprocess (ansible_connection=local, --hosts localhost)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable

from clustercheck.transport import (
    CLEANUP_TIMEOUT,
    RUN_MARKER,
    UNTIL_MARKER,
    CommandResult,
    OutputSink,
    SessionQuirks,
    new_run_id,
    record_until,
    sweep_script,
    until,
    workdir_for,
)


class LocalTransport:
    """The local machine; the same contract as SSH (deadline, both streams at once, nothing left running)."""

    def __init__(self, host: str = "localhost", run_id: str | None = None) -> None:
        self.host = host
        self.run_id = run_id or new_run_id()
        self.workdir = workdir_for(self.run_id)
        self.quirks = SessionQuirks()
        self.channel = "its local process"

    def run(
        self,
        command: list[str],
        *,
        timeout: float,
        env: dict[str, str] | None = None,
        stdin: str | None = None,
        on_output: OutputSink | None = None,
    ) -> CommandResult:
        deadline = until(timeout)
        full_env = {**os.environ, **(env or {}), RUN_MARKER: self.run_id, UNTIL_MARKER: deadline}
        record_until(self.workdir, deadline)
        return run_process(
            command, timeout=timeout, env=full_env, stdin=stdin, on_output=on_output, after_kill=self._sweep
        )

    def _sweep(self) -> None:
        script = sweep_script(self.run_id, "/nonexistent-clustercheck")  # keep the workdir until cleanup()
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(["sh", "-c", script], timeout=CLEANUP_TIMEOUT, capture_output=True)

    def stop(self) -> None:
        """Kill every process of this run, keeping the work directory (a job's logs)."""
        self._sweep()

    def cleanup(self) -> None:
        self._sweep()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def close(self) -> None:
        pass


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_process(
    command: list[str],
    *,
    timeout: float,
    env: dict[str, str],
    stdin: str | None = None,
    on_output: OutputSink | None = None,
    after_kill: Callable[[], None] | None = None,
) -> CommandResult:
    """COMMAND as a process of this machine in a session of its own, both streams read at once (or streamed to
    ON_OUTPUT), killed with its whole group at TIMEOUT or on Ctrl-C; AFTER_KILL then stops whatever else of it is
    left (the local transport: every process with the run marker; srun: the step's processes on its node)."""
    try:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            env=env,
            start_new_session=True,
        )
    except OSError as exc:  # what a shell (and so the SSH side, through env) says for the same program
        code = 127 if exc.errno == errno.ENOENT else 126
        return CommandResult(code, "", f"{command[0]}: {exc.strerror}")

    def killed() -> None:
        _kill_group(proc)
        if after_kill is not None:
            after_kill()

    try:
        if on_output is not None:
            return _stream(proc, stdin, timeout, on_output, killed)
        out, err = proc.communicate(stdin, timeout=timeout)
        return CommandResult(proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        killed()
        out, err = proc.communicate()
        return CommandResult(None, out, err, timed_out=True)
    except BaseException:  # Ctrl-C: leave nothing running
        killed()
        raise


def _stream(
    proc: subprocess.Popen, stdin: str | None, timeout: float, sink: OutputSink, killed: Callable[[], None]
) -> CommandResult:
    """Hand the output to SINK as it arrives; the result keeps none of it."""
    if stdin is not None and proc.stdin is not None:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.write(stdin)
        proc.stdin.close()

    def pump(name: str, stream) -> None:
        for line in iter(stream.readline, ""):
            sink(name, line)

    readers = [
        threading.Thread(target=pump, args=("stdout", proc.stdout), daemon=True),
        threading.Thread(target=pump, args=("stderr", proc.stderr), daemon=True),
    ]
    for reader in readers:
        reader.start()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        killed()
        for reader in readers:
            reader.join(5)
        return CommandResult(None, "", "", timed_out=True)
    for reader in readers:
        reader.join(5)
    return CommandResult(proc.returncode, "", "")
