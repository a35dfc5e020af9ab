"""The one fake transport of the unit tests: a node reached through clustercheck.transport.Transport that records
every call and answers from a script, so the code that reaches nodes is driven without one.

    node = FakeNode("node2", CommandResult(0, '{"paths": []}\\n', ""))      # every command gets this answer
    node = FakeNode("node2", TransportError("node2: unreachable"))          # every command raises it
    node = FakeNode("node2", lambda node, command: ...)                     # an answer per command (None: success)

A subclass with a node's whole behaviour overrides `answer` (test_pipeline's HealthyNode). A file that
transport.put sends is kept in `files`, by path, and answered as written (`keep`).
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from clustercheck.transport import PUT, CommandResult, SessionQuirks, workdir_for

Answer = CommandResult | BaseException
Script = Answer | Callable[["FakeNode", list[str]], "Answer | None"] | None


class Call(NamedTuple):
    """One command a fake node was sent."""

    command: list[str]
    timeout: float
    stdin: str | None
    env: dict[str, str] | None


def is_put(command: list[str]) -> bool:
    """Whether COMMAND is a file sent as transport.put sends it."""
    return command[:3] == ["sh", "-c", PUT]


class FakeNode:
    """A node: HOST, this run's RUN_ID and workdir, answering every command with SCRIPT (see the module). STREAM:
    with on_output, an answer's standard output goes there as it would arrive ("whole": in one piece; "lines": line
    by line), not in the result. DELAY: seconds every command takes after its output. UNTIL_STOPPED: a command runs
    until stop() or cleanup() (30 s at most)."""

    def __init__(
        self,
        host: str = "node1",
        script: Script = None,
        *,
        run_id: str = "0123456789ab",
        stream: str | None = None,
        delay: float = 0.0,
        until_stopped: bool = False,
        channel: str = "its SSH connection",
    ) -> None:
        self.host, self.run_id, self.workdir = host, run_id, workdir_for(run_id)
        self.quirks = SessionQuirks()
        self.channel = channel
        self.script, self.stream, self.delay, self.until_stopped = script, stream, delay, until_stopped
        self.calls: list[Call] = []
        self.files: dict[str, bytes] = {}  # what transport.put sent, by path
        self.stopped = self.cleaned = self.closed = 0
        self.halted = threading.Event()  # set by stop() and cleanup()

    @property
    def commands(self) -> list[list[str]]:
        """Every command sent, files included."""
        return [c.command for c in self.calls]

    @property
    def sent(self) -> list[Call]:
        """The calls that were not a file sent."""
        return [c for c in self.calls if not is_put(c.command)]

    def ran(self, word: str) -> bool:
        return any(word in " ".join(c) for c in self.commands)

    def run(self, command, *, timeout, env=None, stdin=None, on_output=None) -> CommandResult:
        command = list(command)
        self.calls.append(Call(command, timeout, stdin, env))
        answer = self.answer(command, timeout, stdin)
        if isinstance(answer, BaseException):
            raise answer
        streamed = self.stream is not None and on_output is not None and bool(answer.stdout)
        if streamed:
            for piece in answer.stdout.splitlines(keepends=True) if self.stream == "lines" else [answer.stdout]:
                on_output("stdout", piece)
        if self.until_stopped:
            self.halted.wait(30)
        elif self.delay:
            time.sleep(self.delay)
        return CommandResult(answer.exit_status, "", answer.stderr, answer.timed_out) if streamed else answer

    def answer(self, command: list[str], timeout: float, stdin: str | None) -> Answer:
        """The answer to COMMAND: a scripted function's where it gives one; a file sent kept; else the scripted
        answer (a success where there is none)."""
        answer = self.script(self, command) if callable(self.script) else None
        if answer is None and is_put(command):
            return self.keep(command, stdin)
        if answer is None and not callable(self.script):
            answer = self.script
        return CommandResult(0, "", "") if answer is None else answer

    def keep(self, command: list[str], stdin: str | None) -> CommandResult:
        """A file sent as transport.put sends it (COMMAND: sh -c PUT sh PATH SHA256, STDIN: its base64), kept."""
        self.files[command[4]] = base64.b64decode(stdin or "")
        return CommandResult(0, "", "")

    def stop(self) -> None:
        self.stopped += 1
        self.halted.set()

    def cleanup(self) -> None:
        self.cleaned += 1
        self.halted.set()

    def close(self) -> None:
        self.closed += 1
