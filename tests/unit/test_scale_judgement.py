"""What keeps the controller's judgement of a torch job linear in its ranks and its memory per node small: each
node's records read from an index made once, a node's records parsed as one document (their keys held once), the
collector's raw command outputs not kept past the node's own checks. The figures: docs/benchmarks.md, "The whole
run's controller side at 4,000 nodes"."""

from __future__ import annotations

import json
from pathlib import Path

from clustercheck.stages import launch, torchjob
from clustercheck.stages.core import settled

# Four gloo ranks on two torchrun agents, recorded (provenance: tests/unit/records/README.md).
RECORDS = json.loads((Path(__file__).parent / "records" / "collectives-2x2.json").read_text())


def _job(nodes: int, per_node: int) -> torchjob.JobOutcome:
    """A job's outcome of NODES nodes of PER_NODE ranks each, from the recorded rank records."""
    records, ranks = [], {}
    for n in range(nodes):
        name = f"node{n}"
        ranks[name] = list(range(n * per_node, (n + 1) * per_node))
        for local, rank in enumerate(ranks[name]):
            records.append({**RECORDS[local % len(RECORDS)], "rank": rank, "local_rank": local, "node": name})
    return torchjob.JobOutcome(records, nodes * per_node, "gloo", ranks=ranks)


def test_each_nodes_records_come_from_the_index_in_their_order_and_an_unknown_node_has_none():
    job = _job(5, 3)
    assert [r["rank"] for r in job.of_node("node3")] == [9, 10, 11]
    assert job.of_node("node9") == []


def test_a_nodes_records_share_their_keys_and_a_line_that_is_not_json_is_still_left_out():
    lines = [json.dumps({**RECORDS[0], "rank": r}) for r in range(3)]
    whole, _ = launch.parse_collected("\n".join(lines) + "\n" + launch.LOGS_LINE + "\n")
    assert [r["rank"] for r in whole] == [0, 1, 2]
    first, second = (next(k for k in r if k == "bandwidth") for r in whole[:2])
    assert first is second  # one key object for the node's records, not one per record
    cut, _ = launch.parse_collected("\n".join([lines[0], lines[1][:40], lines[2]]) + "\n")
    assert [r["rank"] for r in cut] == [0, 2]


def test_the_raw_command_outputs_are_not_kept_past_the_nodes_checks_and_the_rest_is():
    raw = {"commands": {"dmesg": {"rc": 0, "out": "x" * 1000}}, "torch": {"version": "2.13.0"}, "mtu": {"eth0": 1500}}
    kept = settled(raw)
    assert "commands" not in kept
    assert kept["torch"] == {"version": "2.13.0"} and kept["mtu"] == {"eth0": 1500}
