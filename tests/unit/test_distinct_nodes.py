"""One machine under two inventory names (a copy-paste slip) is named from each name's first command, nothing
more runs there under the second name, and the multi-node stages do not run as if it were two nodes."""

from __future__ import annotations

from test_pipeline import FIRST, NAMES, Cluster, by_key, first_answer, is_first
from wording import says

from clustercheck.checks import connection
from clustercheck.facts.firstcommand import parse_identity
from clustercheck.model import Status
from clustercheck.selection import Selection
from clustercheck.transport import CommandResult

# What the first command printed on Debian 12 containers of the Docker test cluster: one kernel, so one boot ID.
RECORDED = FIRST


def test_the_identity_of_a_node_is_parsed_from_its_output():
    node1, node2 = parse_identity(RECORDED["node1"]), parse_identity(RECORDED["node2"])
    assert node1.machine_id == "72d7f29726d7454b90f038eab4d50932" and node1.hostname == "node1"
    assert node1.boot_id == node2.boot_id  # containers on one kernel: the boot ID alone does not tell them apart
    assert node1.key != node2.key
    assert parse_identity("sh: 1: uname: not found\n") is None
    assert parse_identity("machine_id=\nboot_id=\nhostname=x\n").key is None  # nothing to compare


def answering(outputs: dict[str, str]):
    """BEHAVIOUR per node: the first command answered with OUTPUTS[node] (the recorded outputs)."""

    def behaviour(transport, command, timeout):
        if is_first(command):
            return CommandResult(0, outputs[transport.host], "") if transport.host in outputs else None
        return None

    return dict.fromkeys(NAMES, behaviour)


def test_a_second_name_of_one_machine_fails_and_no_multi_node_stage_runs(tmp_path):
    # node3's inventory entry is a copy of node1's address: the same machine answers both.
    outputs = {"node1": first_answer("node1"), "node2": first_answer("node2"), "node3": first_answer("node1")}
    cluster = Cluster(behaviour=answering(outputs))
    outcome = cluster.run(tmp_path)
    results = by_key(outcome.results)
    distinct = results[("nodes.distinct", None)]
    assert distinct.status is Status.FAIL
    assert distinct.message.startswith("node1 (") and " and node3 (" in distinct.message
    assert "are one machine (machine ID 72d7f29726d7454b90f038eab4d50932, boot ID " in distinct.message
    assert "the inventory names 3 nodes, they are 2 machines" in distinct.message
    assert distinct.remediation.startswith("Remove the second name")
    checked = distinct.data["same_machine"]
    ((twin, first),) = checked.items()
    assert {twin, first} == {"node1", "node3"}
    assert ("facts", twin) not in results and results[("facts", first)].status is Status.PASS
    assert results[("facts", "node2")].status is Status.PASS
    for name in ("network.tcp", "allreduce", "ddp_equivalence"):
        skipped = results[(name, None)]
        assert skipped.status is Status.SKIP and f"{twin}: the same machine as {first}" in skipped.message
    # Only the first command, which read the identity, ran under the second name, and its cleanup was not run: the
    # sweep would have stopped the processes of the first name, which carry the same run marker.
    assert [is_first(c) for c in cluster.transports[twin].commands] == [True]
    assert cluster.transports[twin].cleaned == 0 and cluster.transports[twin].stopped == 0
    assert cluster.transports[first].cleaned == 1 and cluster.transports["node2"].cleaned == 1


def test_different_machines_pass_even_on_one_kernel(tmp_path):
    # node3's machine ID and boot ID cannot be read (the first command prints them empty): it is checked, and said
    # to be unread.
    unread = first_answer("node3", machine_id="", boot_id="")
    cluster = Cluster(
        behaviour=answering({"node1": first_answer("node1"), "node2": first_answer("node2"), "node3": unread})
    )
    outcome = cluster.run(tmp_path, selection=Selection(only=("core",)))
    results = by_key(outcome.results)
    distinct = results[("nodes.distinct", None)]
    assert distinct.status is Status.PASS, distinct.message
    assert says(distinct.message, "2 names, as many machines", "machine ID, boot ID and hostname", "not read on node3")
    assert all(results[("facts", n)].status is Status.PASS for n in NAMES)


def test_a_node_whose_identity_could_not_be_read_is_said_so():
    finding = connection.distinct_finding(
        ["node1", "node2"], {}, {}, {"node1": parse_identity(RECORDED["node1"]), "node2": None}
    )
    assert finding.status is Status.PASS and "not read on node2" in finding.message


def test_names_whose_machines_could_not_be_told_apart_at_all_pass_nothing():
    finding = connection.distinct_finding(["node1", "node2"], {}, {}, {"node1": None, "node2": None})
    assert finding.status is Status.SKIP
    assert says(finding.message, "identity of no node", "reached: node1, node2", "nothing to compare")
    nobody = connection.distinct_finding(["node1", "node2"], {}, {}, {})
    assert nobody.status is Status.SKIP and says(nobody.message, "no node reached", "nothing to compare")
