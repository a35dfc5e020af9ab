"""A program on a node, run the one way every stage and the launcher run one: through the node's transport, its
output kept in the node's run directory, its answer the JSON on its last line, and its failure said one way.

The programs are those of the node-side bundle (stages/bundle.py: `bundled`) and the short standard-library
programs of clustercheck/remote/ the controller sends with `python -c` (bundle.source: a torch job's heartbeats, the
launcher's hashing of the script's directory: `call`). Each prints its answer as one JSON document on its last line
and exits 0. A command whose caller reads its result itself (an exit status with a meaning of its own, streamed
output) goes through `run`: outside clustercheck/transport/, this module is the only caller of a transport's `run`
(docs/architecture.md, "Node-side code").

A failure (`Failure`) names the node and the program, and says why in one line (`cause`): a timeout as a timeout
with its deadline, otherwise the exit status (and the signal that ended the program, when one did) with the
last lines it wrote to standard error; a program that ended well without an answer quotes its last line.
`judge` decides from a command's result alone (pure); the core stage's first command, which carries the facts
collector after its own steps, is judged with it too.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from clustercheck.facts import filesystems, firstcommand
from clustercheck.stages import bundle
from clustercheck.transport import UPLOAD_FAILED, CommandResult, OutputSink, Transport, TransportError

TAIL_LINES = 3  # lines of standard error a failure quotes
LAST_LINE = 200  # characters of an answer's last line quoted when it is not JSON
FILESYSTEMS_TIMEOUT = 15.0  # seconds remote/filesystems.sh may take when a failure is diagnosed


def last_json(stdout: str) -> Any:
    """The JSON document on STDOUT's last line, or None when there is none."""
    lines = stdout.strip().splitlines()
    if not lines:
        return None
    try:
        return json.loads(lines[-1])
    except ValueError:
        return None


def exit_text(status: int) -> str:
    """An exit status in words: a negative one (the local transport) is the signal that killed the program, and one
    above 128 (a shell's, or coreutils' timeout's, report of a child killed by a signal) names that signal too."""
    if status < 0:
        return f"killed by {_signal_name(-status) or f'signal {-status}'}"
    name = _signal_name(status - 128) if status > 128 else None
    return f"exit {status} (killed by {name})" if name else f"exit {status}"


def _signal_name(number: int) -> str | None:
    try:
        return signal.Signals(number).name
    except ValueError:
        return None


@dataclass(frozen=True)
class Failure:
    """Why PROGRAM gave no answer on NODE."""

    node: str
    program: str
    exit_status: int | None = None
    timed_out: bool = False
    timeout: float | None = None  # the command's deadline, in seconds
    lines: tuple[str, ...] = ()  # its last lines of standard error (of its output when it wrote no error)
    unanswered: str | None = None  # it ended well without a JSON answer: its last line ("" when it printed none)
    error: str | None = None  # the command could not be run at all (the transport's error)
    filesystem: str | None = None  # the file system that stopped it, and the fix (`explained`)

    @property
    def cause(self) -> str:
        """Why, in one line, for a message that names the node and the program already: the file system that
        stopped it first, when one did."""
        if self.filesystem is not None:
            return f"{self.filesystem} ({replace(self, filesystem=None).cause})"
        said = " | ".join(self.lines)
        if self.error is not None:
            return self.error
        if self.timed_out:
            return f"timed out after {self.timeout:.0f} s" if self.timeout is not None else "timed out"
        if self.unanswered is not None:
            return f"its last line is not its answer: {self.unanswered}" if self.unanswered else "it printed nothing"
        if self.exit_status is None:
            return "no exit status came back" + (f": {said}" if said else "")
        return exit_text(self.exit_status) + (f": {said}" if said else "")

    def __str__(self) -> str:
        return f"{self.node}: {self.program}: {self.cause}"


class ProgramFailed(RuntimeError):
    """A program gave no answer; its message is the failure's cause, its `failure` the whole of it."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.cause)
        self.failure = failure


@dataclass(frozen=True)
class Answer:
    """A program's run on a node: its result, its answer (None without one) and, without one, why."""

    result: CommandResult
    value: Any  # None without one
    failure: Failure | None

    def json(self) -> Any:
        """The answer, or ProgramFailed saying why there is none."""
        if self.failure is not None:
            raise ProgramFailed(self.failure)
        return self.value


def tail(result: CommandResult, lines: int = TAIL_LINES) -> tuple[str, ...]:
    """The last LINES non-blank lines of RESULT's standard error, else of its output."""
    text = result.stderr if result.stderr.strip() else result.stdout
    return tuple(line.strip() for line in text.splitlines() if line.strip())[-lines:]


def judge(node: str, program: str, result: CommandResult, timeout: float | None, kind: type = dict) -> Answer:
    """PROGRAM's RESULT on NODE (its deadline TIMEOUT seconds): its answer, a JSON document of KIND on its last line
    when it ended well, else the failure (pure)."""
    if not result.ok:
        failure = Failure(node, program, result.exit_status, result.timed_out, timeout, tail(result))
        return Answer(result, None, failure)
    value = last_json(result.stdout)
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return Answer(result, value, None)
    last = (result.stdout.strip().splitlines() or [""])[-1][:LAST_LINE]
    return Answer(result, None, Failure(node, program, 0, unanswered=last))


def keep(result: CommandResult, path: Path) -> None:
    """RESULT's output appended to PATH in the node's run directory, its standard error beside it (.stderr)."""
    with open(path, "a") as fh:
        fh.write(result.stdout)
    with open(path.with_suffix(".stderr"), "a") as fh:
        fh.write(result.stderr)


def run(
    transport: Transport,
    argv: list[str],
    *,
    timeout: float,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
    on_output: OutputSink | None = None,
) -> CommandResult:
    """ARGV on TRANSPORT's node within TIMEOUT seconds, its result as it came back: the one place outside
    clustercheck/transport/ that runs a command on a node (tests/unit/test_remote_shape.py keeps it so). For a
    command whose caller reads more than an answer (an exit status with a meaning of its own, streamed output); a
    program with an answer goes through `call`. A transport that cannot run it raises, as the transport does."""
    given = {"stdin": stdin, "env": env, "on_output": on_output}
    return transport.run(argv, timeout=timeout, **{k: v for k, v in given.items() if v is not None})


def call(
    transport: Transport,
    argv: list[str],
    *,
    program: str,
    timeout: float,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
    kept: Path | None = None,
    kind: type = dict,
) -> Answer:
    """ARGV on TRANSPORT's node within TIMEOUT seconds (STDIN on its standard input), its output KEPT there (a path
    in the node's run directory, `keep`), judged as PROGRAM's answer (`judge`); ENV: variables of its own. A
    transport that cannot run it is a failure too, never an exception."""
    try:
        result = transport.run(argv, timeout=timeout, stdin=stdin, env=env)
    except (TransportError, OSError) as exc:
        return _unrun(transport, program, exc)
    if kept is not None:
        keep(result, kept)
    return explained(transport, judge(transport.host, program, result, timeout, kind))


def explained(transport: Transport, answer: Answer) -> Answer:
    """ANSWER's failure with the file system that caused it, when its exit or its words say a write failed or a
    program could not be executed (filesystems.diagnose): remote/filesystems.sh run on the node then, without
    Python, and read. Any program, any stage: the one mechanism."""
    failure = answer.failure
    if failure is None or failure.timed_out:
        return answer
    said = f"{answer.result.stderr}\n{answer.result.stdout}\n{failure.error or ''}"
    wrote = failure.exit_status == UPLOAD_FAILED or f"exit {UPLOAD_FAILED}" in (failure.error or "")
    if not wrote and failure.exit_status != 126 and not any(text in said for text in filesystems.WRITE_ERRORS):
        return answer
    try:
        read = run(transport, ["sh", "-c", firstcommand.filesystems_script()], timeout=FILESYSTEMS_TIMEOUT)
    except (TransportError, OSError):
        return answer
    found = filesystems.parse(read.stdout)
    cause = filesystems.diagnose(found, said, failure.exit_status, transport.workdir, wrote=wrote)
    if cause is None:
        return answer
    return replace(answer, failure=replace(failure, filesystem=f"{cause.text}; {cause.fix}"))


def bundled(
    transport: Transport,
    python: str,
    program: str,
    *args: str,
    timeout: float,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
    kept: Path | None = None,
    kind: type = dict,
    wrap: Callable[[list[str]], list[str]] | None = None,
    name: str | None = None,
) -> Answer:
    """PROGRAM of the node-side bundle with ARGS, run by PYTHON (`call`), the bundle uploaded first when it is not
    on the node yet; WRAP(argv): the command it runs in (a container). Its failures name it NAME (default:
    PROGRAM; `netprobe mesh` says which of its commands)."""
    name = name or program
    try:
        bundle.install(transport)
    except (TransportError, OSError) as exc:
        return explained(transport, _unrun(transport, name, exc))
    argv = bundle.command(python, transport.workdir, program, *args)
    if wrap is not None:
        argv = wrap(argv)
    return call(transport, argv, program=name, timeout=timeout, stdin=stdin, env=env, kept=kept, kind=kind)


def _unrun(transport: Transport, program: str, exc: Exception) -> Answer:
    error = f"{type(exc).__name__}: {exc}"
    return Answer(CommandResult(None, "", error), None, Failure(transport.host, program, error=error))
