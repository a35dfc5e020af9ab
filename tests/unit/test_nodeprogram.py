"""The one way a program runs on a node (stages/nodeprogram.py): its answer read from its last line, its output kept
in the run directory, and its failure said one way, whatever the program; driven with a scripted transport."""

from __future__ import annotations

import base64

import pytest

from clustercheck.stages import bundle, nodeprogram
from clustercheck.transport import PUT, CommandResult, SessionQuirks, TransportError, workdir_for

# Four lines on standard error, the shape of a Python traceback's end: a failure quotes the last three.
ERRORS = (
    'Traceback (most recent call last):\n  File "x.py", line 40, in shared\n    fh.write(token)\nOSError: disk full\n'
)


class Scripted:
    """A node that answers every command with ANSWER (a CommandResult, or an exception it raises), and keeps what
    it was sent."""

    def __init__(self, answer, host: str = "node2") -> None:
        self.host, self.run_id = host, "0a1b2c3d4e5f"
        self.workdir = workdir_for(self.run_id)
        self.quirks, self.channel = SessionQuirks(), "its SSH connection"
        self.answer = answer
        self.commands: list[tuple[list[str], float, str | None]] = []
        self.files: dict[str, bytes] = {}

    def run(self, command, *, timeout, env=None, stdin=None, on_output=None) -> CommandResult:
        if command[:3] == ["sh", "-c", PUT]:  # the bundle, as transport.put sends it
            self.files[command[4]] = base64.b64decode(stdin)
            return CommandResult(0, "", "")
        self.commands.append((list(command), timeout, stdin))
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


def cause(result: CommandResult, timeout: float = 30) -> str:
    return nodeprogram.call(Scripted(result), ["prog"], program="data paths", timeout=timeout).failure.cause


def test_the_answer_is_the_json_on_the_last_line_and_the_output_is_kept_beside_its_errors(tmp_path):
    node = Scripted(CommandResult(0, 'starting\n{"paths": [], "host": "node2"}\n', "a warning\n"))
    kept = tmp_path / "data-paths.json"
    answer = nodeprogram.call(node, ["prog", "x"], program="data paths", timeout=12, stdin="in", kept=kept)
    assert answer.failure is None and answer.json() == {"paths": [], "host": "node2"}
    assert node.commands == [(["prog", "x"], 12, "in")]
    nodeprogram.call(node, ["prog", "y"], program="data paths", timeout=12, kept=kept)  # a second call appends
    assert kept.read_text() == 2 * 'starting\n{"paths": [], "host": "node2"}\n'
    assert (tmp_path / "data-paths.stderr").read_text() == "a warning\na warning\n"


def test_a_failure_names_the_node_and_the_program_and_quotes_the_last_lines_of_its_errors():
    answer = nodeprogram.call(Scripted(CommandResult(1, "", ERRORS)), ["prog"], program="data shared", timeout=30)
    assert answer.value is None
    assert answer.failure.cause == 'exit 1: File "x.py", line 40, in shared | fh.write(token) | OSError: disk full'
    assert str(answer.failure) == f"node2: data shared: {answer.failure.cause}"
    with pytest.raises(nodeprogram.ProgramFailed) as raised:
        answer.json()
    assert str(raised.value) == answer.failure.cause and raised.value.failure is answer.failure
    assert cause(CommandResult(127, "", "sh: 1: python3: not found\n")) == "exit 127: sh: 1: python3: not found"
    assert cause(CommandResult(2, "usage: x\n", "")) == "exit 2: usage: x"  # no error output: its output's end
    assert cause(CommandResult(1, "", "")) == "exit 1"


def test_a_timeout_is_told_as_a_timeout_and_a_signal_by_its_name():
    assert cause(CommandResult(None, "half a record", "", timed_out=True), timeout=95) == "timed out after 95 s"
    assert cause(CommandResult(-9, "", "")) == "killed by SIGKILL"  # the local transport: a negative status
    assert cause(CommandResult(137, "", "")) == "exit 137 (killed by SIGKILL)"  # a shell's report of it
    assert cause(CommandResult(143, "", "Terminated\n")) == "exit 143 (killed by SIGTERM): Terminated"
    assert cause(CommandResult(None, "", "could not start the command: Timeout opening channel.")) == (
        "no exit status came back: could not start the command: Timeout opening channel."
    )


def test_a_program_that_ended_well_without_an_answer_quotes_its_last_line():
    assert cause(CommandResult(0, "Traceback ...\nboom\n", "")) == "its last line is not its answer: boom"
    assert cause(CommandResult(0, "", "")) == "it printed nothing"
    assert cause(CommandResult(0, "[1, 2]\n", "")) == "its last line is not its answer: [1, 2]"  # not an object


def test_a_node_the_transport_cannot_reach_is_a_failure_not_an_exception():
    lost = TransportError("node2 (10.0.0.2:22): the connection was lost")
    answer = nodeprogram.call(Scripted(lost), ["prog"], program="netprobe mesh", timeout=30)
    assert str(answer.failure) == "node2: netprobe mesh: TransportError: node2 (10.0.0.2:22): the connection was lost"


def test_a_bundle_program_goes_with_the_bundle_once_and_answers_of_its_own_kind():
    node = Scripted(CommandResult(0, "41234\n", ""))
    port = nodeprogram.bundled(node, "/opt/env/bin/python", "netprobe", "free-port", timeout=30, kind=int)
    assert port.value == 41234
    assert node.files == {bundle.path(node.workdir): bundle.bundle()}
    again = nodeprogram.bundled(node, "python3", "netprobe", "free-port", timeout=30, kind=int)
    assert again.value == 41234 and len(node.files) == 1  # uploaded once per node and run
    assert [c[0] for c in node.commands] == [
        ["/opt/env/bin/python", bundle.path(node.workdir), "netprobe", "free-port"],
        ["python3", bundle.path(node.workdir), "netprobe", "free-port"],
    ]
    wrong = nodeprogram.bundled(node, "python3", "netprobe", "free-port", timeout=30, name="netprobe free-port")
    assert str(wrong.failure) == "node2: netprobe free-port: its last line is not its answer: 41234"  # not an object
    boxed = nodeprogram.bundled(node, "python3", "lightning", "probe", timeout=30, wrap=lambda argv: ["box", *argv])
    assert node.commands[-1][0][:2] == ["box", "python3"] and boxed.failure.program == "lightning"
