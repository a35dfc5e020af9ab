"""A node's first command (core.start): one round trip that reads its identity, clock, login shell and home, finds
the python to run the collector with, and stops what earlier runs left; and the bundle's upload carried by the
collector's own command. Judged on outputs recorded on the Docker test cluster (records/first-testcluster.json),
and run for real by this machine's shell through the local transport."""

from __future__ import annotations

import base64
import os
import socket
import sys
import time
from pathlib import Path

import pytest
from fakes import FakeNode
from test_pipeline import FIRST, first_answer
from wording import says

from clustercheck.facts import firstcommand
from clustercheck.inventory import Node
from clustercheck.model import Status
from clustercheck.stages import bundle, core
from clustercheck.transport import CommandResult
from clustercheck.transport.local import LocalTransport


def test_the_recorded_first_commands_are_read_line_by_line():
    plain = firstcommand.parse_first(FIRST["node1"])
    assert plain.clock == pytest.approx(1795698976.229440275)
    assert plain.identity.hostname == "node1" and plain.identity.boot_id == "b9a2b2cd-1437-41d4-8a3e-daef3834d9dc"
    assert (plain.shell, plain.home, plain.recorded, plain.python, plain.python_runs) == (
        "/bin/bash",
        "/root",
        None,
        "python3",
        True,
    )
    assert plain.leftovers == ""  # swept, nothing found
    assert firstcommand.parse_first(FIRST["node1-missing-python"]).python_runs is False
    recorded = firstcommand.parse_first(FIRST["node2"])
    assert recorded.recorded == recorded.python == "/usr/bin/python3"
    left = firstcommand.parse_first(FIRST["node3"])
    assert left.leftovers.startswith("746\tdeadbeef0001\tsleep 600")
    # Cut short (a node that closed the session): nothing made up.
    cut = firstcommand.parse_first(FIRST["node1"][:40])
    assert cut.python_runs is None and cut.leftovers is None and cut.identity is None


def answering(output: str, status: int | None = 0) -> FakeNode:
    """A node whose first command prints OUTPUT (streamed, as every transport streams with on_output)."""
    said = CommandResult(status, output, "" if status == 0 else "sh: killed", timed_out=status is None)
    return FakeNode("node1", said, stream="whole", delay=0.01)


NODE = Node(name="node1", address="10.0.0.1")


def test_the_python_comes_from_the_command_line_the_inventory_the_node_or_the_default():
    begun = core.start(NODE, answering(first_answer("node1", python="/opt/env/bin/python")), "/opt/env/bin/python")
    assert (begun.python, begun.source, begun.missing) == ("/opt/env/bin/python", "--python", None)
    from_inventory = Node(name="node1", address="10.0.0.1", python="/opt/env/bin/python")
    begun = core.start(from_inventory, answering(first_answer("node1", python="/opt/env/bin/python")))
    assert says(begun.source, "clustercheck_python", "inventory")
    begun = core.start(NODE, answering(FIRST["node2"]))
    assert (begun.python, begun.source) == ("/usr/bin/python3", core.RECORDED_PYTHON)
    begun = core.start(NODE, answering(FIRST["node1"]))
    assert (begun.python, begun.source, begun.missing) == ("python3", "default", None)
    # A python that does not start is named, and python3 collects the facts without torch.
    begun = core.start(NODE, answering(FIRST["node1-missing-python"]), "/opt/none/bin/python")
    assert (begun.python, begun.source, begun.missing) == ("python3", "--python", "/opt/none/bin/python")


def test_the_command_line_passes_the_asked_python_and_the_fallback_as_arguments_not_in_the_script():
    node = answering(FIRST["node1"])
    core.start(NODE, node, "/opt/my env/bin/python; rm -rf /", sweep=True, timeout=12)
    ((command,),) = [node.commands]
    assert command[:2] == ["sh", "-c"] and "rm -rf /" not in command[2]
    assert command[3:] == ["sh", "/opt/my env/bin/python; rm -rf /", "python3", "12"]  # contract: the path one word
    assert "--- leftovers" in command[2]  # the startup sweep is part of it


def test_the_clock_offset_is_taken_when_the_clock_line_arrives():
    begun = core.start(NODE, answering(first_answer("node1")))
    assert abs(begun.clock_offset) < 0.5 and 0 < begun.clock_uncertainty < 0.5
    late = FIRST["node1"]  # recorded on 2026-11-26: a node whose clock reads that time is that far behind
    assert core.start(NODE, answering(late)).clock_offset < -60


def test_leftovers_of_an_earlier_run_are_named_and_a_failed_first_command_says_why():
    begun = core.start(NODE, answering(FIRST["node3"]), sweep=True)
    result = core.leftovers(NODE, begun)
    assert result.status is Status.WARN
    assert says(result.message, "node1: ", "deadbeef0001", "stopped 1 process(es)", "pid 746 (sleep 600)")
    assert says(result.message, "removed 1 work directory(ies)", "/tmp/clustercheck-deadbeef0001")
    assert core.leftovers(NODE, core.start(NODE, answering(FIRST["node1"]), sweep=True)).status is Status.PASS
    failed = core.start(NODE, answering(FIRST["node1"][:60], status=None), "/opt/env/bin/python", sweep=True)
    assert failed.error == "timed out" and failed.python == "/opt/env/bin/python" and failed.clock_offset is None
    assert says(core.leftovers(NODE, failed).message, "node1: ", "could not look", "timed out")


def test_the_first_command_runs_in_this_machines_shell_and_carries_the_bundle_to_the_collector():
    node = Node(name="here", address="localhost", connection="local")
    transport = LocalTransport("here")
    try:
        begun = core.start(node, transport, sweep=True, collect=["10", "--no-torch"], collect_timeout=60)
        assert begun.error is None, begun.error
        assert begun.identity.hostname == socket.gethostname() and begun.identity.key is not None
        assert begun.home == os.environ["HOME"] and begun.leftovers is not None
        assert abs(begun.clock_offset) < 1 and begun.clock_uncertainty < 1
        if not os.path.exists(core.RECORDED_PYTHON):
            assert (begun.python, begun.missing) == (sys.executable, None)
            assert says(begun.source, "python running clustercheck")
        collected = begun.collected
        assert collected.answer.ok and collected.raw["os"]["cpus"] == os.cpu_count(), collected.answer.stderr
        assert 0 < collected.seconds < 60
        # The bundle came on standard input, checked, into a private work directory with the run's deadline.
        with open(bundle.path(transport.workdir), "rb") as fh:
            assert fh.read() == bundle.bundle()
        assert os.stat(transport.workdir).st_mode & 0o777 == 0o700
        assert int(Path(transport.workdir, ".until").read_text()) > time.time()
        assert bundle.to_send(transport) is None  # not again in this run
        again = core.start(node, transport, collect=["10", "--no-torch"], collect_timeout=60)
        assert again.collected.raw is not None
    finally:
        transport.cleanup()


def test_a_python_that_does_not_start_leaves_the_facts_to_python3_without_torch():
    node = Node(name="here", address="localhost", connection="local")
    transport = LocalTransport("here")
    try:
        begun = core.start(node, transport, "/nonexistent/bin/python", timeout=5, collect=["10"], collect_timeout=60)
    finally:
        transport.cleanup()
    assert (begun.python, begun.missing) == ("python3", "/nonexistent/bin/python")
    assert begun.collected.raw["torch"] == {"error": "the environment's python does not exist"}  # --no-torch


def test_a_bundle_that_arrives_altered_is_not_run_and_not_taken_as_there():
    transport = LocalTransport("here")
    try:
        pyz = bundle.path(transport.workdir)
        command = ["sh", "-c", bundle.INSTALL, "sh", transport.workdir, bundle.digest(), sys.executable, pyz]
        altered = base64.b64encode(bundle.bundle()[:-1] + b"x").decode()
        answer = transport.run([*command, "netprobe", "free-port"], timeout=60, stdin=altered)
        bundle.carried(transport, altered, answer)
        assert answer.exit_status == bundle.UPLOAD_FAILED and answer.stdout == ""
        assert "arrived with SHA-256 " in answer.stderr and answer.stderr.strip().endswith(bundle.digest())
        assert not [f for f in os.listdir(transport.workdir) if f.startswith(bundle.FILE)]  # nor a piece of it
        assert bundle.to_send(transport) is not None  # sent again next time
        intact = transport.run([*command, "netprobe", "free-port"], timeout=60, stdin=bundle.encoded())
        assert intact.ok and 1024 <= int(intact.stdout) <= 65535, intact.stderr
    finally:
        transport.cleanup()


def test_why_there_are_no_facts_is_said_one_way_for_every_user_of_the_first_command():
    cut = core.start(NODE, answering(FIRST["node1"][:60], status=None), sweep=True)
    assert says(cut.facts_problem(120), "ended before the collector started", "timed out")
    facts = FIRST["node1"] + "--- facts\n"
    hung = core.start(NODE, answering(facts, status=None), collect=["105"], collect_timeout=120)
    assert says(hung.facts_problem(120), "timed out after 120 s")
    failed = core.start(NODE, answering(facts + "Traceback ...\n", status=1), collect=["105"], collect_timeout=120)
    assert says(failed.facts_problem(120), "exit 1", "sh: killed")
    good = core.start(NODE, answering(facts + '{"collector": 1}\n'), collect=["105"], collect_timeout=120)
    assert good.facts_problem(120) is None and good.collected.raw == {"collector": 1}
