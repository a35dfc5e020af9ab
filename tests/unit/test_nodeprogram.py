"""The one way a program runs on a node (stages/nodeprogram.py): its answer read from its last line, its output kept
in the run directory, and its failure said one way, whatever the program; driven with the fake node (fakes.py)."""

from __future__ import annotations

import pytest
from fakes import FakeNode
from wording import says

from clustercheck.stages import bundle, nodeprogram
from clustercheck.transport import CommandResult, TransportError

# Four lines on standard error, the shape of a Python traceback's end: a failure quotes the last three.
ERRORS = (
    'Traceback (most recent call last):\n  File "x.py", line 40, in shared\n    fh.write(token)\nOSError: disk full\n'
)


def cause(result: CommandResult, timeout: float = 30) -> str:
    return nodeprogram.call(FakeNode("node2", result), ["prog"], program="data paths", timeout=timeout).failure.cause


def test_the_answer_is_the_json_on_the_last_line_and_the_output_is_kept_beside_its_errors(tmp_path):
    node = FakeNode("node2", CommandResult(0, 'starting\n{"paths": [], "host": "node2"}\n', "a warning\n"))
    kept = tmp_path / "data-paths.json"
    answer = nodeprogram.call(node, ["prog", "x"], program="data paths", timeout=12, stdin="in", kept=kept)
    assert answer.failure is None and answer.json() == {"paths": [], "host": "node2"}
    assert [c[:3] for c in node.sent] == [(["prog", "x"], 12, "in")]
    nodeprogram.call(node, ["prog", "y"], program="data paths", timeout=12, kept=kept)  # a second call appends
    assert kept.read_text() == 2 * 'starting\n{"paths": [], "host": "node2"}\n'  # verbatim: the output, kept as is
    assert (tmp_path / "data-paths.stderr").read_text() == "a warning\na warning\n"  # verbatim: its stderr, kept


def test_a_failure_names_the_node_and_the_program_and_quotes_the_last_lines_of_its_errors():
    node = FakeNode("node2", CommandResult(1, "", ERRORS))
    answer = nodeprogram.call(node, ["prog"], program="data shared", timeout=30)
    assert answer.value is None
    assert says(answer.failure.cause, "exit 1", 'File "x.py", line 40', "fh.write(token)", "OSError: disk full")
    assert str(answer.failure) == f"node2: data shared: {answer.failure.cause}"  # contract: the one failure format
    with pytest.raises(nodeprogram.ProgramFailed) as raised:
        answer.json()
    assert str(raised.value) == answer.failure.cause and raised.value.failure is answer.failure
    assert says(cause(CommandResult(127, "", "sh: 1: python3: not found\n")), "exit 127", "python3: not found")
    assert says(cause(CommandResult(2, "usage: x\n", "")), "exit 2", "usage: x")  # no error output: its output's end
    assert cause(CommandResult(1, "", "")) == "exit 1"


def test_a_timeout_is_told_as_a_timeout_and_a_signal_by_its_name():
    assert says(cause(CommandResult(None, "half a record", "", timed_out=True), timeout=95), "timed out after 95 s")
    assert cause(CommandResult(-9, "", "")) == "killed by SIGKILL"  # the local transport: a negative status
    assert says(cause(CommandResult(137, "", "")), "exit 137", "SIGKILL")  # a shell's report of it
    assert says(cause(CommandResult(143, "", "Terminated\n")), "exit 143", "SIGTERM", "Terminated")
    unstarted = cause(CommandResult(None, "", "could not start the command: Timeout opening channel."))
    assert says(unstarted, "no exit status", "could not start the command: Timeout opening channel.")


def test_a_program_that_ended_well_without_an_answer_quotes_its_last_line():
    assert says(cause(CommandResult(0, "Traceback ...\nboom\n", "")), "not its answer", "boom")
    assert cause(CommandResult(0, "", "")) == "it printed nothing"
    assert says(cause(CommandResult(0, "[1, 2]\n", "")), "not its answer", "[1, 2]")  # not an object


def test_a_node_the_transport_cannot_reach_is_a_failure_not_an_exception():
    lost = TransportError("node2 (10.0.0.2:22): the connection was lost")
    answer = nodeprogram.call(FakeNode("node2", lost), ["prog"], program="netprobe mesh", timeout=30)
    assert says(str(answer.failure), "node2: netprobe mesh: ", "TransportError", "10.0.0.2:22", "connection was lost")


def test_a_bundle_program_goes_with_the_bundle_once_and_answers_of_its_own_kind():
    node = FakeNode("node2", CommandResult(0, "41234\n", ""))
    port = nodeprogram.bundled(node, "/opt/env/bin/python", "netprobe", "free-port", timeout=30, kind=int)
    assert port.value == 41234
    assert node.files == {bundle.path(node.workdir): bundle.bundle()}
    again = nodeprogram.bundled(node, "python3", "netprobe", "free-port", timeout=30, kind=int)
    assert again.value == 41234 and len(node.files) == 1  # uploaded once per node and run
    assert [c.command for c in node.sent] == [
        ["/opt/env/bin/python", bundle.path(node.workdir), "netprobe", "free-port"],
        ["python3", bundle.path(node.workdir), "netprobe", "free-port"],
    ]
    wrong = nodeprogram.bundled(node, "python3", "netprobe", "free-port", timeout=30, name="netprobe free-port")
    assert says(str(wrong.failure), "node2: netprobe free-port: ", "not its answer", "41234")  # not an object
    boxed = nodeprogram.bundled(node, "python3", "lightning", "probe", timeout=30, wrap=lambda argv: ["box", *argv])
    assert node.sent[-1].command[:2] == ["box", "python3"] and boxed.failure.program == "lightning"
