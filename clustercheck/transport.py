"""One interface for running commands on a node, over SSH or locally.

Every command gets a deadline; stdout and stderr are read at the same time so
large output never deadlocks; a command past its deadline is killed with its
whole process group, so nothing it started is left running.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass
from typing import Protocol


@dataclass
class CommandResult:
    exit_status: int | None  # None: no exit status came back (killed, timed out, connection lost)
    stdout: str
    stderr: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_status == 0 and not self.timed_out


class Transport(Protocol):
    host: str

    def run(
        self, command: list[str], *, timeout: float, env: dict[str, str] | None = None, stdin: str | None = None
    ) -> CommandResult: ...

    def put(self, local_path: str, remote_path: str) -> None: ...

    def close(self) -> None: ...


class LocalTransport:
    """The local machine, through subprocess (ansible_connection=local, --hosts localhost)."""

    def __init__(self, host: str = "localhost") -> None:
        self.host = host

    def run(
        self, command: list[str], *, timeout: float, env: dict[str, str] | None = None, stdin: str | None = None
    ) -> CommandResult:
        full_env = {**os.environ, **(env or {})}
        proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=full_env,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
            return CommandResult(proc.returncode, out, err)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            return CommandResult(None, out, err, timed_out=True)
        except BaseException:  # Ctrl-C: leave nothing running
            _kill_group(proc)
            raise

    def put(self, local_path: str, remote_path: str) -> None:
        import shutil

        os.makedirs(os.path.dirname(remote_path) or ".", exist_ok=True)
        shutil.copyfile(local_path, remote_path)

    def close(self) -> None:
        pass


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
