"""The fabric pair rounds' schedule (remote/pairs.py) and their judgement (checks/fabric_pairs.py), on records of the
shape the torch job's ranks write (remote/fabricpairs.py). Most figures are built here from a rail speed per node
(what is judged is which (node, rail) or path the figures name); the 64-node ones were recorded on the test cluster
(tests/unit/data/README.md)."""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path

import pytest
from harness import promtool_path

from clustercheck.checks import baseline_figures, fabric_pairs
from clustercheck.model import Status
from clustercheck.remote import pairs
from clustercheck.report import Report, prometheus
from clustercheck.report import json as json_report

SIZE = 1 << 22
DATA = Path(__file__).parent / "data" / "fabric"


@pytest.mark.parametrize("n", [2, 3, 4, 7, 8, 64, 1000])
def test_every_round_pairs_disjoint_nodes_and_small_clusters_meet_every_pair_once(n):
    rounds = pairs.schedule(n, seed=5, max_rounds=0)
    met = [p for r in rounds for p in r]
    for r in rounds:
        nodes = [x for p in r for x in p]
        assert len(nodes) == len(set(nodes))
    assert sorted(met) == sorted(itertools.combinations(range(n), 2))


def test_past_the_limit_the_rounds_stop_growing_and_each_node_meets_that_many_partners():
    rounds = pairs.schedule(4000, seed=1, max_rounds=6)
    assert len(rounds) == 6 and all(len(r) == 2000 for r in rounds)
    partners = {}
    for a, b in (p for r in rounds for p in r):
        partners.setdefault(a, set()).add(b)
        partners.setdefault(b, set()).add(a)
    assert {len(p) for p in partners.values()} == {6}
    assert pairs.schedule(4000, seed=1, max_rounds=6) == rounds  # the seed in the report gives the same rounds
    assert pairs.schedule(4000, seed=2, max_rounds=6) != rounds


def records(n: int, rails: int, speed, confirm_speed=None, backend="gloo", seed=3, rounds=6) -> list[dict]:
    """The collectives part's records of a job of N nodes with RAILS ranks each: SPEED(src, dst, rail) in GB/s is
    what each direction moves, in the rounds and (CONFIRM_SPEED, else the same) in the confirm round the ranks
    compute as remote/fabricpairs.py does."""
    schedule = pairs.schedule(n, seed, rounds)
    maps = [pairs.partners(r) for r in schedule]
    received = {
        (node, rail): [None if node not in m else SIZE / (speed(m[node], node, rail) * 1e9) for m in maps]
        for node in range(n)
        for rail in range(rails)
    }
    ratio = pairs.SLOW_RATIO[backend]
    edges = pairs.edges_from(schedule, received, SIZE)
    slow = pairs.slow_edges(edges, None, ratio)
    confirm = pairs.confirm_rounds(n, slow, seed, pairs.met(edges))
    again = confirm_speed or speed

    confirm_maps = [pairs.partners(r) for r in confirm]

    def took(partner_map, node, rail, how):
        partner = partner_map.get(node)
        return None if partner is None else SIZE / (how(partner, node, rail) * 1e9)

    out = []
    for node in range(n):
        for rail in range(rails):
            fabric = {
                "node": node,
                "rail": rail,
                "interface": f"eth{rail + 1}",
                "bytes": SIZE,
                "iters": 3,
                "seed": seed,
                "recv": received[(node, rail)],
                "confirm": [took(m, node, rail, again) for m in confirm_maps],
            }
            if node == 0 and rail == 0:
                fabric.update(schedule=schedule, confirm_schedule=confirm)
            rank = {"rank": node * rails + rail, "node": f"node{node + 1}", "ok": True, "backend": backend}
            out.append({**rank, "fabric": fabric})
    return out


def judged(recs, n):
    results = fabric_pairs.evaluate(recs, [f"node{i + 1}" for i in range(n)])
    return {(r.name, r.host): r for r in results}


def bad(results):
    return {key: r for key, r in results.items() if r.status is not Status.PASS}


def test_a_healthy_cluster_gives_a_figure_for_every_node_and_rail_and_no_finding():
    results = judged(records(5, 2, lambda s, d, k: 1.0 + 0.1 * ((s + d + k) % 3)), 5)
    assert bad(results) == {}
    node = results[("fabric.pairs", "node2")]
    assert [r["interface"] for r in node.data["rails"]] == ["eth1", "eth2"]
    assert {m.labels["rail"] for m in node.measures} == {"0", "1"}


def test_one_slow_rail_names_its_node_rail_and_interface_and_nothing_else():
    # node3's rail 1 sends at a hundredth; its NIC also delays the acknowledgements of what it receives
    def speed(src, dst, rail):
        return 0.01 if rail == 1 and 2 in (src, dst) else 1.0

    results = bad(judged(records(6, 2, speed), 6))
    assert list(results) == [("fabric.pairs", "node3")]
    finding = results[("fabric.pairs", "node3")]
    assert finding.status is Status.FAIL
    assert finding.message.startswith("node3 rail 1 (local rank 1, eth2) slow with ")
    assert "tc qdisc show" in finding.remediation


def test_every_rail_of_a_node_slow_names_the_node():
    results = bad(judged(records(6, 2, lambda s, d, k: 0.01 if 4 in (s, d) else 1.0), 6))
    assert list(results) == [("fabric.pairs", "node5")]
    assert results[("fabric.pairs", "node5")].message.startswith("every rail of node5 is slow")


def test_a_slow_path_between_two_nodes_fine_elsewhere_is_the_path_and_a_one_off_is_a_warning():
    def speed(src, dst, rail):
        return 0.01 if {src, dst} == {1, 4} and rail == 0 else 1.0

    recs = records(6, 2, speed, seed=11, rounds=0)  # every pair: 1 and 4 meet
    results = bad(judged(recs, 6))
    assert list(results) == [("fabric.paths", None)]
    assert results[("fabric.paths", None)].status is Status.FAIL
    assert "node2 <-> node5, rail 0" in results[("fabric.paths", None)].message
    once = bad(judged(records(6, 2, speed, confirm_speed=lambda s, d, k: 1.0, seed=11, rounds=0), 6))
    assert [(k, r.status) for k, r in once.items()] == [(("fabric.paths", None), Status.WARN)]


def test_a_slow_rail_not_slow_again_in_the_confirm_round_is_a_warning():
    def speed(src, dst, rail):
        return 0.01 if rail == 0 and 0 in (src, dst) else 1.0

    results = bad(judged(records(6, 2, speed, confirm_speed=lambda s, d, k: 1.0), 6))
    assert [(k, r.status) for k, r in results.items()] == [(("fabric.pairs", "node1"), Status.WARN)]
    assert "transient" in results[("fabric.pairs", "node1")].message


def test_the_confirm_round_pairs_each_suspect_with_a_node_no_slow_figure_touched():
    schedule = pairs.schedule(8, 4, 0)
    edges = {(a, b, 0): 1.0 for r in schedule for x, y in r for a, b in ((x, y), (y, x))}
    for e in edges:
        if 3 in e[:2]:
            edges[e] = 0.01
    slow = pairs.slow_edges(edges)
    confirm = pairs.confirm_rounds(8, slow, 4)
    assert len(confirm) == 1 and len(confirm[0]) == 1 and 3 in confirm[0][0]


def test_a_floor_fails_a_rail_every_node_shares():
    results = fabric_pairs.evaluate(records(4, 1, lambda s, d, k: 1.0), [f"node{i}" for i in range(1, 5)], floor=5.0)
    assert {r.status for r in results if r.name == "fabric.pairs"} == {Status.FAIL}
    assert "floor 5 GB/s" in next(r for r in results if r.name == "fabric.pairs").message


def test_without_pair_rounds_the_checks_skip():
    results = fabric_pairs.evaluate([{"rank": 0, "ok": True}], ["node1"])
    assert {(r.name, r.status) for r in results} == {("fabric.pairs", Status.SKIP), ("fabric.paths", Status.SKIP)}


def test_a_healthy_node_whose_only_slow_partners_are_two_bad_nodes_is_not_named():
    # node1's every rail and node4's rail 1 slow; others meet them both in the rounds (every pair on 10 nodes)
    def speed(src, dst, rail):
        return 0.01 if 0 in (src, dst) or (rail == 1 and 3 in (src, dst)) else 1.0

    results = bad(judged(records(10, 2, speed, rounds=0), 10))
    assert sorted(results) == [("fabric.pairs", "node1"), ("fabric.pairs", "node4")]
    assert results[("fabric.pairs", "node1")].message.startswith("every rail of node1 is slow")
    assert results[("fabric.pairs", "node4")].message.startswith(
        "node4 rail 1 (local rank 1, eth2) slow with 9 partners"
    )


def test_over_nccl_a_rail_is_held_to_its_line_rate_without_a_floor_given():
    # NDR 400 Gb/s ports: NCCL's share of 0.96 x 50 GB/s; every rail at 20 GB/s (steady, so no rail stands out)
    assert fabric_pairs.line_rate_floor([400.0, 400.0, 200.0]) == round(0.7 * 0.96 * 25, 3)
    recs = records(4, 2, lambda s, d, k: 20.0, backend="nccl")
    hosts = [f"node{i}" for i in range(1, 5)]
    held = fabric_pairs.evaluate(recs, hosts, port_rates_gbps=[400.0] * 8)
    assert {r.status for r in held if r.name == "fabric.pairs"} == {Status.FAIL}
    assert "floor 33.6 GB/s" in next(r for r in held if r.name == "fabric.pairs").message
    assert {r.status for r in fabric_pairs.evaluate(recs, hosts, port_rates_gbps=[200.0] * 8)} == {Status.PASS}
    assert fabric_pairs.line_rate_floor([]) is None


def test_every_node_and_rail_is_a_prometheus_gauge_and_a_baseline_figure():
    results = judged(records(3, 2, lambda s, d, k: 1.0 + 0.1 * k), 3)
    report = Report(list(results.values()), ["node1", "node2", "node3"], "x", 1.0, 2.0)
    text = prometheus.render(report)
    gauges = [line for line in text.splitlines() if line.startswith("clustercheck_fabric_rail_bytes_per_second{")]
    assert len(gauges) == 6 and any('host="node2"' in g and 'interface="eth2"' in g and 'rail="1"' in g for g in gauges)
    proc = subprocess.run(
        [promtool_path(), "check", "metrics"], input=text + "\n", capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    document = json.loads(json_report.render(report))
    fabric = baseline_figures.figures(document["checks"])["fabric"]
    assert sorted(fabric) == [f"node{n} rail {k} (eth{k + 1})" for n in (1, 2, 3) for k in (0, 1)]


def recorded(name: str) -> tuple[list[str], dict]:
    """The node names and edges of a recorded fabric.paths (tests/unit/data/README.md: 64 test nodes)."""
    data = json.loads((DATA / name).read_text())
    names = sorted({e[0] for e in data["edges"]}, key=lambda n: int(n.removeprefix("node")))
    index = {name: i for i, name in enumerate(names)}
    return names, {(index[s], index[d], rail): gbps for s, d, rail, gbps in data["edges"]}


@pytest.mark.parametrize("name", ["64-nodes-node2-eth1-100mbit.json", "64-nodes-node2-eth1-100mbit-2.json"])
def test_at_64_crowded_nodes_a_rail_shaped_to_100_mbits_is_named_by_the_clusters_spread(name):
    # 64 CPU ranks on two cores: healthy rails 0.01 to 0.09 GB/s; node2's eth1 shaped to 100 Mbit/s sent 0.008 to
    # 0.012, above gloo's share of the reference, every figure far under the other nodes' spread
    names, edges = recorded(name)
    assert pairs.suspects(pairs.slow_edges(edges, fences={}), pairs.met(edges)) == ({}, set())  # the share alone
    rails, paths = pairs.suspects(pairs.slow_edges(edges), pairs.met(edges))
    assert [(names[node], rail, side) for node, rail, side in rails] == [("node2", 0, "out")] and paths == set()
    assert len(rails[(names.index("node2"), 0, "out")]) == 6  # every partner it met


def test_at_64_crowded_nodes_a_healthy_run_names_no_rail():
    names, edges = recorded("64-nodes-healthy.json")
    assert pairs.rail_fences(edges) and pairs.slow_edges(edges) == set()
    # the second run's one exchange starved below the share (0.0031 GB/s against 0.0646): a pair to confirm, no
    # rail; its confirm round passed, so the run said WARN (transient) for that path
    names, edges = recorded("64-nodes-healthy-2.json")
    rails, paths = pairs.suspects(pairs.slow_edges(edges), pairs.met(edges))
    assert rails == {} and [(names[a], names[b]) for a, b, _ in paths] == [("node37", "node53")]


def test_the_spread_names_a_rail_only_on_enough_nodes_and_never_a_node_a_little_under_a_tight_cluster():
    # figures that spread 0.2 to 1.0 GB/s as crowded CPU ranks do; node5's rail 0 at 0.06, over gloo's share of the
    # reference: named on 16 nodes, where quartiles mean something, not on 6
    def speed(src, dst, rail):
        return 0.06 if rail == 0 and src == 4 else 0.2 + 0.8 * ((src * 7 + dst * 3 + rail) % 9) / 8

    results = bad(judged(records(16, 2, speed), 16))
    assert list(results) == [("fabric.pairs", "node5")]
    finding = results[("fabric.pairs", "node5")]
    assert finding.status is Status.FAIL
    assert finding.message.startswith("node5 rail 0 (local rank 0, eth1) slow with 6 partners: sends ")
    assert "the other nodes' spread" in finding.message
    assert bad(judged(records(6, 2, speed), 6)) == {}
    # RDMA figures within a few percent: a node 8 % under the others is not far under them
    tight = records(16, 1, lambda s, d, k: 44.0 if s == 2 else 48.0 + 0.1 * ((s + d) % 3), backend="nccl")
    assert bad(judged(tight, 16)) == {}
