"""The foreground launch's orchestration with fake transports: output streamed with prefixes and kept per node,
the first failing node's status passed on, the other nodes stopped."""

from __future__ import annotations

import threading
import types

from clustercheck.inventory import Node
from clustercheck.launcher import command, session
from clustercheck.stages import Member
from clustercheck.transport import CommandResult, SessionQuirks, workdir_for


class StreamingNode:
    """Prints its tee-marked lines, then exits with STATUS, or (STATUS None) runs until stopped."""

    def __init__(self, host: str, status: int | None, lines: list[str]) -> None:
        self.host, self.run_id, self.workdir = host, "0123456789ab", workdir_for("0123456789ab")
        self.quirks = SessionQuirks()
        self.status, self.lines = status, lines
        self.stopped = threading.Event()
        self.cleaned = False
        self.commands: list[list[str]] = []

    def run(self, argv, *, timeout, env=None, stdin=None, on_output=None):
        self.commands.append(list(argv))
        for line in self.lines:
            on_output("stdout", line + "\n")
        if self.status is None:
            self.stopped.wait(30)
            return CommandResult(None, "", "")
        return CommandResult(self.status, "", "")

    def stop(self):
        self.stopped.set()

    def cleanup(self):
        self.stopped.set()
        self.cleaned = True

    def close(self):
        pass


def launch_on(nodes, tmp_path, argv=("train.py",)):
    echoed, said = [], []
    options = session.LaunchOptions(command=command.parse(list(argv)), run_dir=tmp_path, preflight=False)
    job = session.Launch([n.node for n in nodes], options, factory=None, echo=echoed.append, say=said.append)
    job.members = nodes
    job.transports = {m.name: m.transport for m in nodes}
    job.plan("train.py", None)
    return job, echoed, said


def member(name, transport):
    facts = types.SimpleNamespace(python="/opt/venv/bin/python")
    address = "10.0.0.1" + name[-1]
    return Member(Node(name, address), transport, facts, address, "eth0", name, 0)


def test_one_failing_node_stops_the_others_and_its_status_is_the_jobs(tmp_path, monkeypatch):
    monkeypatch.setattr(session, "FAILURE_GRACE", 0.2)
    fakes = {
        "node1": StreamingNode("node1", None, ["[default0]:step 1"]),
        "node2": StreamingNode("node2", 3, ["[default0]:step 1", "[default0]:CUDA error: out of memory"]),
        "node3": StreamingNode("node3", None, ["[default0]:step 1"]),
    }
    job, echoed, _ = launch_on([member(n, t) for n, t in fakes.items()], tmp_path)
    finished = job.run_foreground()
    assert finished.status == 3
    assert finished.message.startswith("the job failed on node2 first (exit 3)")
    assert "node2/1: CUDA error: out of memory" in finished.message
    assert fakes["node1"].stopped.is_set() and fakes["node3"].stopped.is_set()
    assert {"node1/0: step 1", "node2/1: step 1", "node3/2: step 1"} <= set(echoed)
    assert (tmp_path / "hosts" / "node2" / "output.log").read_text().endswith("node2/1: CUDA error: out of memory\n")
    assert "--node-rank=2" in (tmp_path / "hosts" / "node3" / "launch.command").read_text()
    job.close()
    assert all(f.cleaned for f in fakes.values())


def test_every_node_completing_is_exit_0(tmp_path):
    fakes = {n: StreamingNode(n, 0, ["[default0]:done"]) for n in ("node1", "node2")}
    job, echoed, _ = launch_on([member(n, t) for n, t in fakes.items()], tmp_path)
    finished = job.run_foreground()
    assert finished.status == 0 and "completed on every node" in finished.message
    assert sorted(echoed) == ["node1/0: done", "node2/1: done"]
    assert not any(f.stopped.is_set() for f in fakes.values())
