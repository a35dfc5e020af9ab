"""The health program's circuit breaker (clustercheck/slurm/breaker.py, pure) and node-health's Slurm update with it:
a check that fails on many nodes drains at most the limit's share of a partition, says why for the rest, and
writes the metric the alert ClustercheckDrainWithheld reads."""

from __future__ import annotations

from wording import says

from clustercheck.checks import registry
from clustercheck.report import Report, prometheus
from clustercheck.run import health
from clustercheck.slurm import breaker, update
from clustercheck.slurm.drain import reason
from clustercheck.slurm.parse import SlurmNode
from clustercheck.transport import CommandResult

SHM = reason("shm.size", "/dev/shm is 64 MiB, less than 256 MiB")


def idle(name: str, *partitions: str) -> SlurmNode:
    return SlurmNode(name, ("IDLE",), None, partitions or ("gpu",))


def drained(name: str, why: str, *partitions: str) -> SlurmNode:
    return SlurmNode(name, ("IDLE", "DRAIN"), why, partitions or ("gpu",))


def test_the_limit_is_a_share_of_the_partition_and_at_least_a_number_of_nodes():
    default = breaker.Limit()
    assert [default.most(n) for n in (1, 3, 9, 10, 19, 20, 100)] == [1, 1, 1, 1, 1, 2, 10]
    assert breaker.Limit(30, 0).most(10) == 3 and breaker.Limit(0, 2).most(100) == 2
    assert breaker.Limit(0, 0).most(100) == 0  # drains nothing


def test_the_first_node_a_check_fails_on_is_drained_the_rest_are_not_and_say_why():
    nodes = [idle("node1"), idle("node2"), idle("node3")]
    assert breaker.decide(nodes[0], "shm.size", nodes, breaker.Limit()).drain
    nodes[0] = drained("node1", SHM)
    held = breaker.decide(nodes[1], "shm.size", nodes, breaker.Limit())
    assert not held.drain and held.drained == ("node1",) and (held.nodes, held.most) == (3, 1)
    described = held.describe()
    assert says(described, "not draining node2 for shm.size", "1 of the 3 nodes of partition gpu", "(node1)")
    assert says(described, "10 % of its nodes, at least 1", "more likely wrong than the nodes", "raise the limit")


def test_only_clustercheck_drains_in_the_nodes_partitions_count():
    nodes = [drained("node1", "disk swap"), idle("node2"), drained("login1", SHM, "cpu"), idle("node3")]
    assert breaker.decide(nodes[1], "time.sync", nodes, breaker.Limit()).drain  # an admin's drain, another partition
    nodes.append(drained("node4", SHM, "cpu", "gpu"))  # in both: counts for gpu
    assert not breaker.decide(nodes[1], "time.sync", nodes, breaker.Limit()).drain
    assert breaker.decide(nodes[1], "time.sync", nodes, breaker.Limit(50, 1)).drain  # 2 of 4 nodes may be drained
    twice = idle("node5", "cpu", "gpu")  # full in cpu (login1, node4 of 3 nodes with it)
    held = breaker.decide(twice, "time.sync", [*nodes, twice], breaker.Limit(50, 1))
    assert not held.drain and held.partition == "cpu" and held.drained == ("login1", "node4")


def shm_failed(node: str):
    return [registry.get("shm.size").result(node, registry.fail("/dev/shm is 64 MiB, less than 256 MiB"))]


def scontrol(monkeypatch, shown: CommandResult) -> list[list[str]]:
    """update's scontrol: SHOWN for `show node`, success for `update`; the commands run, in order."""
    ran: list[list[str]] = []

    def call(argv, timeout):
        ran.append(argv[1:])
        return shown if argv[1] == "show" else CommandResult(0, "", "")

    monkeypatch.setattr(update, "call", call)
    monkeypatch.setattr(update.shutil, "which", lambda name: None)
    return ran


def show(*nodes: SlurmNode) -> CommandResult:
    """`scontrol show node` as Slurm prints a node record (the fields the breaker reads)."""
    records = []
    for node in nodes:
        record = f"NodeName={node.name} Arch=x86_64\n   State={'+'.join(node.state)} ThreadsPerCore=1\n"
        record += f"   Partitions={','.join(node.partitions)} \n"
        records.append(record + (f"   Reason={node.reason} [root@2026-11-28T06:40:00]\n" if node.reason else ""))
    return CommandResult(0, "\n".join(records), "")


def test_node_health_drains_within_the_limit_and_holds_back_past_it(monkeypatch):
    said: list[str] = []
    ran = scontrol(monkeypatch, show(idle("node1"), idle("node2"), idle("node3")))
    assert update.update(shm_failed("node1"), idle("node1"), said.append, lambda: 5.0) is None
    assert ran == [["show", "node"], ["update", "nodename=node1", "state=drain", f"reason={SHM}"]]
    assert len(said) == 1 and says(said[0], "drained node1", "Slurm", SHM)

    said.clear()
    ran = scontrol(monkeypatch, show(drained("node1", SHM), idle("node2"), idle("node3")))
    held = update.update(shm_failed("node2"), idle("node2"), said.append, lambda: 5.0)
    assert held is not None and (held.node, held.check, held.drain) == ("node2", "shm.size", False)
    assert ran == [["show", "node"]]  # no update
    assert said == [held.describe()]


def test_a_node_drained_by_clustercheck_already_gets_its_new_reason_without_asking_the_breaker(monkeypatch):
    ran = scontrol(monkeypatch, show())
    before = drained("node1", reason("time.sync", "chronyd does not answer"))
    assert update.update(shm_failed("node1"), before, print, lambda: 5.0) is None
    assert ran == [["update", "nodename=node1", "state=drain", f"reason={SHM}"]]


def test_when_the_nodes_cannot_be_read_the_node_is_not_drained_and_that_is_said(monkeypatch):
    said: list[str] = []
    ran = scontrol(monkeypatch, CommandResult(1, "", "slurm_load_node error: Unable to contact slurm controller"))
    held = update.update(shm_failed("node1"), idle("node1"), said.append, lambda: 5.0)
    assert held is not None and not held.drain and ran == [["show", "node"]]
    assert said[0].startswith("not draining node1 for shm.size: how many nodes are drained could not be read (")
    assert "Unable to contact slurm controller" in said[0]


def test_a_held_back_drain_is_a_metric_of_the_node_and_its_check():
    held = breaker.Verdict("node2", "shm.size", False, "gpu", 3, ("node1",), 1)
    text = prometheus.render(
        Report([], ["node2"], "x", 0, 1), source="node-health", extra=[health.drain_withheld(held)]
    )
    assert 'clustercheck_slurm_drain_withheld{check="shm.size",host="node2",source="node-health"} 1' in text
    assert "# TYPE clustercheck_slurm_drain_withheld gauge" in text
