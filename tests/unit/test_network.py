"""Turning network probe records into network.* checks, on records from the Docker test cluster."""

from __future__ import annotations

import copy
import json
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from harness import probe_records
from wording import says

from clustercheck.checks import network, registry, setup_roles
from clustercheck.model import Status
from clustercheck.remote import netprobe
from clustercheck.remote import rounds as perf
from clustercheck.stages import network as stage

RECORDS = Path(__file__).parent / "records"


def load(name: str) -> dict[str, dict]:
    return json.loads((RECORDS / name).read_text())


def peers(records: dict[str, dict]) -> list[network.Peer]:
    return [network.Peer(name, r["address"]) for name, r in sorted(records.items())]


def evaluate(records, **kw):
    """RECORDS (what each node's probe measured, as recorded or altered) judged as the controller receives them."""
    return network.evaluate(probe_records(records), peers(records), master="node1", master_port=29500, **kw)


def named(results, name):
    return [r for r in results if r.name == name]


def test_a_healthy_cluster_passes():
    results = evaluate(load("netprobe-healthy.json"))
    assert {r.status for r in results} == {Status.PASS}
    assert named(results, "network.tcp")[0].data["pairs"] == 6


def test_a_one_node_cluster_says_there_is_no_pair_to_connect():
    one = {"node1": load("netprobe-healthy.json")["node1"]}
    for record in one.values():
        record["outgoing"] = [o for o in record["outgoing"] if o["to"] == "node1"]
    (tcp,) = named(evaluate(one), "network.tcp")
    assert tcp.status is Status.PASS and tcp.data["pairs"] == 0
    assert "one node, so no node pair to connect" in tcp.message


def test_a_firewall_on_one_node_names_both_pairs_and_the_node():
    results = evaluate(load("netprobe-node3-firewall.json"), cidr="172.30.82.0/24")
    failures = [r for r in named(results, "network.tcp") if r.status is Status.FAIL]
    assert [(r.host, r.data["to"]) for r in failures] == [("node1", "node3"), ("node2", "node3")]
    assert failures[0].message.startswith("node1 -> node3 (172.30.82.13): the connection timed out")
    assert "no node reaches node3" in failures[0].message
    assert failures[0].data["cause"] == "firewall"
    assert "ufw allow from 172.30.82.0/24" in failures[0].remediation


def test_refused_while_listening_is_a_firewall_reject_and_unreachable_is_routing():
    records = load("netprobe-healthy.json")
    out = records["node2"]["outgoing"]
    out[0].update(result="refused", detail="Connection refused")
    out[2].update(result="host-unreachable", detail="No route to host")
    failures = {(r.host, r.data["to"]): r for r in named(evaluate(records), "network.tcp")}
    assert failures[("node2", out[0]["to"])].data["cause"] == "firewall"
    assert failures[("node2", out[2]["to"])].data["cause"] == "routing"
    assert "ip route get" in failures[("node2", out[2]["to"])].remediation


def test_a_node_that_reaches_no_one_is_named_as_the_likely_place():
    records = load("netprobe-healthy.json")
    for out in records["node1"]["outgoing"]:
        out.update(result="network-unreachable", detail="Network is unreachable")
    failures = named(evaluate(records), "network.tcp")
    assert [r.data["to"] for r in failures] == ["node2", "node3"]
    assert all("node1 reaches no node" in r.message for r in failures)


# node2's own rule, as `iptables -S` printed it on a test node (the ephemeral-reject fault row's rule before it
# matched new connections only; docs/faults.md row 34 as recorded on 2026-11-29): stateless, so it also resets the
# replies to node2's own connections whose source port the kernel drew from 38000-48000.
STATELESS = (
    "-A CLUSTERCHECK-FAULTS -s 172.30.85.11/32 -p tcp -m tcp --dport 38000:48000 -j REJECT --reject-with tcp-reset"
)
STATEFUL = STATELESS.replace("-j REJECT", "-m conntrack --ctstate NEW -j REJECT")


def _node2_out_fails_from(records, source_ports):
    for out in records["node2"]["outgoing"]:
        if out["to"] == "node1":
            out.update(result="timeout", detail="no answer within 2 s", source_ports=source_ports, attempts=2)
    return records


@pytest.mark.parametrize(
    "rule, source_ports",
    [(STATELESS, [52113, 44013]), (STATEFUL, [38857]), (STATELESS, [])],
    ids=["a-port-outside-the-rule", "a-rule-with-a-state", "no-source-port-recorded"],
)
def test_a_failure_the_connecting_nodes_rules_do_not_explain_stays_the_far_sides(rule, source_ports):
    """The recorded case, a stateless rule on node2 covering every port its failed attempts left from, is
    test_ports.py's; here what is not that case keeps the far side's attribution."""
    records = _node2_out_fails_from(load("netprobe-healthy.json"), source_ports)
    (failure,) = [
        r for r in named(evaluate(records, rules={"node2": (rule,)}), "network.tcp") if r.status is Status.FAIL
    ]
    assert failure.data["cause"] == "firewall" and "side" not in failure.data
    assert setup_roles.nodes_of(failure) == ["node1"]


def test_another_service_on_the_port_is_a_port_conflict():
    records = load("netprobe-healthy.json")
    records["node3"]["outgoing"][1].update(result="wrong-service", detail="answered b'SSH-2.0'")
    (failure,) = named(evaluate(records), "network.tcp")
    assert failure.data["cause"] == "port conflict"


def test_a_held_master_port_names_the_pid_and_command():
    records = load("netprobe-healthy.json")
    records["node1"]["listen"][0] = {
        "port": 29500,
        "ok": False,
        "error": "Address already in use",
        "errno": 98,
        "holders": [{"pid": 4242, "command": "python train.py"}],
    }
    results = evaluate(records)
    (port,) = named(results, "network.master_port")
    assert port.status is Status.FAIL
    assert "held by pid 4242 (python train.py)" in port.message
    assert "kill 4242" in port.remediation
    # Connections to a port nobody could listen on are not blamed on the network.
    assert all(r.status is Status.PASS for r in named(results, "network.tcp"))


def test_a_busy_port_on_another_node_warns():
    records = load("netprobe-healthy.json")
    records["node2"]["listen"][0] = {"port": 29500, "ok": False, "error": "Address already in use", "holders": []}
    listen = {r.host: r for r in named(evaluate(records), "network.listen")}
    assert listen["node2"].status is Status.WARN and "port 29500 (Address already in use)" in listen["node2"].message
    assert listen["node1"].status is listen["node3"].status is Status.PASS  # one result per node, whatever happens


def test_resolution_failures_name_the_resolver_and_the_name():
    records = load("netprobe-healthy.json")
    records["node1"]["resolve"]["node2"] = {"addresses": [], "error": "[Errno -2] Name or service not known"}
    records["node2"]["resolve"]["node2"] = {"addresses": ["127.0.1.1"]}
    records["node3"]["resolve"]["node1"] = {"addresses": ["10.9.9.9"]}
    failures = {r.host: r for r in named(evaluate(records), "network.resolve") if r.status is Status.FAIL}
    assert "node2 does not resolve" in failures["node1"].message
    assert "node2 resolves to loopback 127.0.1.1" in failures["node2"].message
    assert "node1 resolves to 10.9.9.9, other nodes get 172.30.80.11" in failures["node3"].message
    # The data keeps the answers behind a finding, not every node's answer for every name (N² at N nodes).
    assert failures["node3"].data["names"] == 3
    assert failures["node3"].data["unexpected"]["node1"] == {"addresses": ["10.9.9.9"]}
    (healthy,) = [r for r in named(evaluate(load("netprobe-healthy.json")), "network.resolve") if r.host == "node1"]
    assert healthy.status is Status.PASS and healthy.data == {"names": 3, "unexpected": {}}


def test_a_name_resolving_to_another_address_everywhere_warns():
    records = load("netprobe-healthy.json")
    for record in records.values():
        record["resolve"]["node3"] = {"addresses": ["10.0.0.3"]}
    results = named(evaluate(records), "network.resolve")
    assert {r.status for r in results} == {Status.WARN}
    assert "not its cluster address 172.30.80.13" in results[0].message


def test_an_mtu_mismatch_names_the_odd_node():
    records = load("netprobe-healthy.json")
    records["node2"]["mtu"] = 9000
    (mtu,) = named(evaluate(records), "network.mtu")
    assert mtu.status is Status.FAIL
    assert says(mtu.message, "MTU differs", "node2 has 9000", "other 2 node(s) have 1500")
    assert "Set the MTU to 1500 on node2 (eth0)" in mtu.remediation


def test_an_mtu_tie_says_there_is_no_majority_as_consistency_mtu_does():
    records = {n: r for n, r in load("netprobe-healthy.json").items() if n != "node3"}
    records["node2"]["mtu"] = 9000
    (mtu,) = named(evaluate(records), "network.mtu")
    assert mtu.status is Status.FAIL
    assert says(mtu.message, "MTU differs", "no majority", "node1: 1500", "node2: 9000")
    assert mtu.remediation == registry.get("network.mtu").fix  # no majority to name: the declared fix


def test_every_network_problem_carries_a_fix_the_declared_one_unless_the_stage_knows_better():
    """A slow node (node2 rate-limited), a pair not measured, a firewall and a busy port: each WARN, FAIL or ERROR
    has a remediation; the throughput and round-trip warnings the declared fix of their check."""
    slow = evaluate(load("netprobe-node2-tbf.json"))
    (throughput,) = named(slow, "network.throughput")
    assert throughput.status is Status.WARN and throughput.remediation == registry.get("network.throughput").fix
    records = load("netprobe-healthy.json")
    entry = next(e for e in records["node1"]["perf"] if not e.get("served"))
    entry.clear()
    entry.update(peer="node3", round=1, error="node3 did not connect within 10 s")
    (rtt,) = named(evaluate(records), "network.rtt")
    assert rtt.status is Status.WARN and rtt.remediation == registry.get("network.rtt").fix
    busy = load("netprobe-healthy.json")
    busy["node2"]["listen"][0].update(ok=False, error="Address already in use")
    results = slow + evaluate(records) + evaluate(load("netprobe-node3-firewall.json")) + evaluate(busy)
    problems = [r for r in results if r.status in (Status.WARN, Status.FAIL, Status.ERROR)]
    assert {r.name for r in problems} >= {"network.throughput", "network.rtt", "network.tcp", "network.listen"}
    assert all(r.remediation for r in problems), [r for r in problems if not r.remediation]


def member(name, address, interface, addresses, cidr=None):
    from ipaddress import IPv4Interface

    from clustercheck.facts.model import Address, NodeFacts
    from clustercheck.inventory import Node
    from clustercheck.stages import Member

    node = Node(name=name, address=address, cluster_cidr=cidr)
    facts = NodeFacts(node, "python3", "python3", addresses=[Address(i, IPv4Interface(a)) for i, a in addresses])
    return Member(node, None, facts, address, interface, None, 0)


def test_the_cluster_network_comes_from_the_inventory_else_from_the_cluster_addresses():
    ips = {"node1": "172.30.82.11", "node2": "172.30.82.12"}
    found = [member(n, ip, "eth0", [("lo", "127.0.0.1/8"), ("eth0", f"{ip}/24")]) for n, ip in ips.items()]
    assert stage.cluster_network(found) == "172.30.82.0/24"
    given = [member(n, ip, "eth0", [], cidr="172.30.0.0/16") for n, ip in ips.items()]
    assert stage.cluster_network(given) == "172.30.0.0/16"
    apart = [member("node1", "10.0.0.1", "eth0", [("eth0", "10.0.0.1/24")]), found[1]]
    assert stage.cluster_network(apart) is None  # no one network: the advice names the peer's address instead


def test_a_node_without_a_record_is_an_error_and_others_are_still_judged():
    records = load("netprobe-healthy.json")
    del records["node3"]
    results = evaluate(records, errors={"node3": "SSH connection timed out"})
    probes = {r.host: r for r in named(results, "network.probe")}
    assert probes["node3"].status is Status.ERROR and "SSH connection timed out" in probes["node3"].message
    assert probes["node1"].status is probes["node2"].status is Status.PASS
    assert all(r.status is Status.PASS for r in named(results, "network.tcp"))


def test_mesh_command_and_ephemeral_port():
    port = stage.pick_ephemeral_port(random.Random(1))
    assert stage.EPHEMERAL_RANGE[0] <= port <= stage.EPHEMERAL_RANGE[1]
    command = stage.mesh_args("a", [29500, port], 8)
    assert command == ["mesh", "--self", "a", "--duration", "8", "--peers", "-", "--port", "29500", "--port", str(port)]
    listed = stage.peer_list([network.Peer("a", "10.0.0.1"), network.Peer("b", "10.0.0.2")])
    assert listed == "a 10.0.0.1\nb 10.0.0.2\n"  # contract: the peer file the node program reads
    assert netprobe.parse_peers(listed) == ({"a": "10.0.0.1", "b": "10.0.0.2"}, {})


def test_the_probe_command_stays_the_same_size_however_many_nodes():
    """The node list goes to the probe's standard input: a command line naming 4,000 peers would pass Linux's
    128 KiB limit on one argument (the shell line SSH runs) with longer names."""
    peers = [network.Peer(f"gpu-node-{i:04d}.cluster.example.com", f"10.20.{i // 256}.{i % 256}") for i in range(4000)]
    command = stage.mesh_args(peers[0].name, [29500, 40000], 8, perf=(50000, ("rtt",)), rounds=8)
    assert len(" ".join(command)) < 400
    assert netprobe.parse_peers(stage.peer_list(peers))[0] == {p.name: p.address for p in peers}


def test_a_hostname_other_than_the_inventory_name_is_resolved_and_named():
    peers = [network.Peer("node1", "10.0.0.1"), network.Peer("node2", "10.0.0.2", hostname="gpu-02")]
    assert stage.peer_list(peers) == "node1 10.0.0.1\nnode2 10.0.0.2 gpu-02\n"  # contract: the peer file, as above
    assert netprobe.parse_peers(stage.peer_list(peers))[1] == {"node2": "gpu-02"}
    records = load("netprobe-healthy.json")
    records["node1"]["resolve"]["node2"] = {"hostname": "gpu-02", "addresses": [], "error": "Name or service not known"}
    failing = [r for r in named(evaluate(records), "network.resolve") if r.status is Status.FAIL]
    assert "gpu-02 (node2) does not resolve" in failing[0].message


def test_records_are_not_modified():
    records = load("netprobe-node3-firewall.json")
    before = copy.deepcopy(records)
    evaluate(records)
    assert records == before


def test_a_node_whose_probe_never_listened_is_named_as_late_not_as_a_firewall():
    healthy = load("netprobe-healthy.json")
    records = {n: r for n, r in healthy.items() if n != "node3"}
    for record in records.values():  # node3 never listened: every connection to it was refused
        for out in record["outgoing"]:
            if out["to"] == "node3":
                out.update(result="refused", detail="Connection refused")
    results = network.evaluate(
        probe_records(records),
        peers(healthy),
        master="node1",
        master_port=29500,
        errors={"node3": "timed out"},
        not_ready={"node3": 33.0},
        ready_after={"node1": 1.2, "node2": 1.4},
    )
    probe = {r.host: r for r in results if r.name == "network.probe"}
    assert probe["node3"].status is Status.ERROR
    assert "node3's probe never reported ready (not listening after 33 s" in probe["node3"].message
    assert "the other nodes were ready within 1.4 s" in probe["node3"].message
    (tcp,) = [r for r in results if r.name == "network.tcp"]
    assert tcp.status is Status.PASS  # no pair is called a firewall problem


def test_a_probe_that_listened_late_is_a_warning_and_its_pairs_are_not_judged():
    records = load("netprobe-healthy.json")
    for out in records["node1"]["outgoing"]:
        if out["to"] == "node2":
            out.update(result="timeout", detail="no answer within 2 s")
    results = evaluate(records, not_ready={"node2": 33.0})
    probe = {r.host: r for r in results if r.name == "network.probe"}
    assert probe["node2"].status is Status.WARN
    assert probe["node2"].message.startswith("node2's probe started late")
    assert [r.status for r in results if r.name == "network.tcp"] == [Status.PASS]


def test_round_trips_and_throughput_of_a_healthy_cluster_pass_with_the_medians():
    rtt, throughput = network.perf_checks(load("netprobe-healthy.json"))
    assert rtt.status is Status.PASS and "median of 3 pairs" in rtt.message
    assert throughput.status is Status.PASS and "median of 6 transfers, 3 pairs" in throughput.message
    assert throughput.data["median_mbps"] > 500


def test_a_node_whose_link_is_rate_limited_is_the_one_named_with_the_numbers():
    rtt, throughput = network.perf_checks(load("netprobe-node2-tbf.json"))
    assert throughput.status is Status.WARN
    assert throughput.data["slow_senders"] == ["node2"] and throughput.data["slow_receivers"] == []
    assert throughput.data["slow_pairs"] == []  # node2 explains its pairs: they are not named again
    assert throughput.message.startswith("node2 sends slowly to every node: 50 Mbit/s at best, the median is")
    assert rtt.status is Status.PASS


def test_a_pair_that_could_not_be_measured_is_named():
    records = load("netprobe-healthy.json")
    entry = next(e for e in records["node1"]["perf"] if not e.get("served"))
    entry.clear()
    entry.update(peer="node3", round=1, error="node3 did not connect within 10 s")
    rtt, throughput = network.perf_checks(records)
    assert rtt.status is Status.WARN and "not measured: node1 <-> node3 (node3 did not connect" in rtt.message
    assert throughput.status is Status.WARN


def test_one_node_has_no_pair_to_measure():
    one = {"node1": load("netprobe-healthy.json")["node1"]}
    one["node1"].pop("perf")
    assert [r.status for r in network.perf_checks(one)] == [Status.SKIP, Status.SKIP]


def test_a_name_resolving_to_loopback_is_named_with_the_address_found_in_the_fix():
    records = load("netprobe-healthy.json")
    records["node2"]["resolve"]["node2"] = {"hostname": "node2", "addresses": ["127.0.0.1"]}
    (failing,) = [r for r in named(evaluate(records), "network.resolve") if r.status is Status.FAIL]
    assert "node2 resolves to loopback 127.0.0.1" in failing.message
    assert "remove the '127.0.0.1 node2' line(s)" in failing.remediation and "127.0.1.1" not in failing.remediation


def test_the_probe_is_told_the_measurements_of_the_selected_checks_only():
    assert network.plan(lambda name: True) == ("rtt", "throughput")
    assert network.plan(lambda name: name != "network.rtt") == ("throughput",)
    assert network.plan(lambda name: not name.startswith("network.")) == ()
    command = stage.mesh_args("a", [29500], 8, perf=(50000, ("throughput",)))
    assert command[-4:] == ["--perf-port", "50000", "--measure", "throughput"]
    assert "--perf-port" not in stage.mesh_args("a", [29500], 8, perf=(50000, ()))


def test_a_check_whose_measurement_was_not_made_is_skip_and_the_other_is_judged():
    records = load("netprobe-healthy.json")
    for record in records.values():
        for entry in record["perf"]:
            entry.pop("rtt_ms", None)
    rtt, throughput = network.perf_checks(records, ("throughput",))
    assert rtt.status is Status.SKIP and throughput.status is Status.PASS
    assert "median of 6 transfers, 3 pairs" in throughput.message


@pytest.mark.parametrize(
    ("measure", "made", "not_made"), [("throughput", "out_mbps", "rtt_ms"), ("rtt", "rtt_ms", "out_mbps")]
)
def test_the_probe_makes_only_the_measurements_it_is_told(measure, made, not_made):
    """Two real probes on this machine (127.0.0.1 and 127.0.0.2), told one measurement: the other is not made."""
    rng = random.Random(measure)
    ports = [str(stage.pick_ephemeral_port(rng)) for _ in range(2)]
    probe = [sys.executable, "-m", "clustercheck.remote.netprobe", "mesh", "--duration", "3", "--port", ports[0]]
    probes = []
    for me in ("a", "b"):
        argv = [*probe, "--self", me, "--peers", "-", "--perf-port", ports[1], "--measure", measure]
        with tempfile.TemporaryFile() as listed:
            listed.write(b"a 127.0.0.1\nb 127.0.0.2\n")
            listed.seek(0)
            probes.append(subprocess.Popen(argv, stdin=listed, stdout=subprocess.PIPE, text=True))
    records = [json.loads(p.communicate(timeout=60)[0].splitlines()[-1]) for p in probes]
    entries = [e for r in records for e in r["perf"] if not e.get("served")]
    assert len(entries) == 1 and "error" not in entries[0], entries
    assert entries[0][made] > 0 and not_made not in entries[0]


def test_the_probe_offers_only_what_the_network_stage_uses(capsys):
    """Every option of the node-side probe's mesh is one the network stage passes: nothing kept for a test."""
    from clustercheck.remote import netprobe

    with pytest.raises(SystemExit):
        netprobe.main(["mesh", "--help"])
    offered = set(re.findall(r"(?<![\w-])--[\w-]+", capsys.readouterr().out)) - {"--help"}
    passed = set(re.findall(r'"(--[\w-]+)"', Path(stage.__file__).read_text()))
    assert offered and offered <= passed, sorted(offered - passed)
    with pytest.raises(SystemExit):
        netprobe.main(["port-holder", "1"])


# ------------------------------------------------------------------------------------------ the perf rounds


def rounds_of(n: int, rounds: int | None, seed: int | None = 7) -> list[list[tuple[str, str]]]:
    return perf.schedule([f"node{i}" for i in range(1, n + 1)], rounds, seed)


@pytest.mark.parametrize("n", [2, 3, 4, 7, 16, 64, 1000])
def test_every_round_is_a_matching_and_no_pair_comes_twice(n):
    for rounds in (1, 8, None):
        schedule = rounds_of(n, rounds)
        for pairs in schedule:
            members = [node for pair in pairs for node in pair]
            assert len(members) == len(set(members))  # no node in two measurements at once
            assert len(pairs) == n // 2  # everyone has a partner (one sits out when N is odd)
        pairs = [frozenset(p) for r in schedule for p in r]
        assert len(pairs) == len(set(pairs))


@pytest.mark.parametrize("n", [10, 64, 1000])
def test_k_rounds_give_every_node_k_partners_whatever_the_cluster_size(n):
    schedule = rounds_of(n, 8)
    assert len(schedule) == 8
    partners: dict[str, set[str]] = {}
    for a, b in (p for r in schedule for p in r):
        partners.setdefault(a, set()).add(b)
        partners.setdefault(b, set()).add(a)
    assert {len(p) for p in partners.values()} == {8}
    assert len(partners) == n


@pytest.mark.parametrize(("n", "rounds"), [(2, 8), (3, 8), (8, 8), (9, 8), (9, 20), (64, None), (65, None)])
def test_as_many_rounds_as_a_node_has_partners_measure_every_pair(n, rounds):
    schedule = rounds_of(n, rounds)
    assert len(schedule) == (n - 1 if n % 2 == 0 else n)
    assert len({frozenset(p) for r in schedule for p in r}) == n * (n - 1) // 2


def test_the_schedule_is_the_same_for_the_same_seed_and_spread_by_it():
    assert rounds_of(64, 8, seed=3) == rounds_of(64, 8, seed=3)  # every node computes the same rounds
    assert rounds_of(64, 8, seed=3) != rounds_of(64, 8, seed=4)
    # Shuffled: the first round does not pair inventory neighbours only, as the circle method on the plain list
    # would (node1 with node64, node2 with node63, ...).
    assert rounds_of(64, 1, seed=3) != rounds_of(64, 1, seed=None)


def test_the_stage_passes_the_rounds_and_seed_and_bounds_the_probe_by_them():
    peers = [network.Peer(f"node{i}", f"10.0.0.{i}") for i in range(1, 101)]
    command = stage.mesh_args("node1", [29500], 8, perf=(50000, ("rtt",)), rounds=8)
    assert command[command.index("--rounds") + 1] == "8"
    assert command[command.index("--seed") + 1] == str(stage.SCHEDULE_SEED)
    everything = stage.mesh_args("node1", [29500], 8, perf=(50000, ("rtt",)), rounds=None)
    assert everything[everything.index("--rounds") + 1] == "all"
    assert stage.round_count(peers, 8) == 8 and stage.round_count(peers, None) == 99
    assert stage.perf_time(8) == 8 * perf.ROUND_SECONDS  # not a figure that grows with the cluster


# A cluster measured in rounds, its figures those of the test cluster's records: a healthy pair as in
# netprobe-healthy.json, a pair through a link rate-limited to 50 Mbit/s as node2's in netprobe-node2-tbf.json.
HEALTHY = {"rtt_ms": 0.0145, "out_mbps": 2237.0, "in_mbps": 3517.3}
SHAPED_OUT = {"rtt_ms": 0.0145, "out_mbps": 49.2, "in_mbps": 5007.3}  # the connector's egress shaped
SLOW_RTT = {"rtt_ms": 1.9339, "out_mbps": 2271.0, "in_mbps": 2074.0}


def measured_in_rounds(n: int, rounds: int | None, figures) -> dict[str, dict]:
    """Probe records of N nodes after ROUNDS perf rounds; FIGURES(a, b) -> the connector A's entry."""
    names = [f"node{i}" for i in range(1, n + 1)]
    schedule = perf.schedule(names, rounds, stage.SCHEDULE_SEED)
    records = {name: {"perf": [], "rounds": len(schedule)} for name in names}
    for number, pairs in enumerate(schedule):
        for a, b in pairs:
            records[a]["perf"].append({"peer": b, "round": number, **figures(a, b)})
            records[b]["perf"].append({"peer": a, "round": number, "served": True})
    return records


def test_a_node_slow_with_most_of_its_partners_is_named_though_one_partner_is_fast():
    """node5's link is shaped, but one of its 8 partners shares the shaper's fast path: it is named slow with 7 of
    the 8 nodes it was measured with, and its pairs are not named again."""
    partners = []

    def figures(a, b):
        if "node5" not in (a, b):
            return HEALTHY
        partners.append(b if a == "node5" else a)
        if len(partners) == 1:
            return HEALTHY
        return SHAPED_OUT if a == "node5" else {**SHAPED_OUT, "out_mbps": 3000.0, "in_mbps": 49.2}

    rtt, throughput = network.perf_checks(measured_in_rounds(32, 8, figures))
    assert throughput.status is Status.WARN
    assert throughput.data["slow_senders"] == ["node5"] and throughput.data["slow_receivers"] == []
    assert throughput.data["slow_pairs"] == []
    assert throughput.message.startswith("node5 sends slowly to 7 of the 8 nodes it was measured with: 49 Mbit/s")
    assert throughput.data["rounds"] == 8
    assert rtt.status is Status.PASS and "median of 128 pairs in 8 rounds" in rtt.message


def test_a_slow_link_between_two_fine_nodes_is_named_as_the_pair_not_as_a_node():
    slow_pair = None

    def figures(a, b):
        nonlocal slow_pair
        if slow_pair is None:
            slow_pair = (a, b)
            return {**SLOW_RTT, "out_mbps": 49.2}
        return HEALTHY

    rtt, throughput = network.perf_checks(measured_in_rounds(16, 8, figures))
    a, b = slow_pair
    assert rtt.data["slow_nodes"] == [] and rtt.status is Status.WARN
    assert says(rtt.message, f"{a} <-> {b}", "1.93 ms", "median pair 0.01 ms")
    assert throughput.data["slow_senders"] == [] and throughput.data["slow_receivers"] == []
    assert throughput.message.startswith(f"{a} -> {b} moves 49 Mbit/s")


def test_a_node_slow_with_half_of_its_partners_is_not_named_its_links_are():
    seen: dict[str, int] = {}

    def figures(a, b):
        if "node3" not in (a, b):
            return HEALTHY
        seen["node3"] = seen.get("node3", 0) + 1
        return SLOW_RTT if seen["node3"] <= 4 else HEALTHY

    rtt, _ = network.perf_checks(measured_in_rounds(16, 8, figures))
    assert rtt.data["slow_nodes"] == []
    assert rtt.message.count("node3") == 4  # its four slow pairs, each named


def test_a_node_slow_with_every_partner_says_every_node_only_when_it_met_every_node():
    def figures(a, b):
        if "node2" not in (a, b):
            return HEALTHY
        return SHAPED_OUT if a == "node2" else {**HEALTHY, "in_mbps": 49.2}

    _, throughput = network.perf_checks(measured_in_rounds(16, 8, figures))
    assert throughput.message.startswith(
        "node2 sends slowly to every node it was measured with (8): 49 Mbit/s at best, the median is"
    )
    _, throughput = network.perf_checks(measured_in_rounds(6, None, figures))  # every pair: 5 rounds
    assert throughput.message.startswith("node2 sends slowly to every node: 49 Mbit/s at best, the median is")


def test_network_rounds_is_a_number_or_all_and_anything_else_a_usage_error(tmp_path):
    from click.testing import CliRunner

    from clustercheck.commands import cli
    from clustercheck.commands.run import NetworkRounds

    assert NetworkRounds().convert("all", None, None) is None
    assert NetworkRounds().convert("12", None, None) == 12
    for bad in ("0", "-3", "many"):
        result = CliRunner().invoke(cli, ["run", "--hosts", "localhost", "--network-rounds", bad])
        assert result.exit_code == 2 and "--network-rounds" in result.output, result.output
        assert "Traceback" not in result.output


def test_probes_still_waiting_out_their_rounds_are_not_taken_for_frozen_ones():
    """As on 64 nodes with node3 frozen during the connections: 51 probes ended about 8 s in, the nodes still waiting
    for node3's connections end only with their connect window (40 s) and rounds (8 of 6 s). 30 s after the early
    ones is no reason to give up on them; 30 s after the rounds' paced end, or after the last probe that ended
    past it, is."""
    early = {f"node{i}": 8.0 for i in range(4, 55)}
    paced_end = 4.0 + 40 + 8 * 6  # the go signal 4 s in, then the connect window and the rounds
    assert not stage.past_waiting(early, 64, paced_end, now=45.0)
    assert not stage.past_waiting(early, 64, paced_end, now=paced_end + stage.STRAGGLER_GRACE - 1)
    assert stage.past_waiting(early, 64, paced_end, now=paced_end + stage.STRAGGLER_GRACE + 1)
    late = {**early, "node17": paced_end + 10}  # it ended after the paced end (a loaded node): the grace counts from it
    assert not stage.past_waiting(late, 64, paced_end, now=paced_end + stage.STRAGGLER_GRACE + 1)
    assert stage.past_waiting(late, 64, paced_end, now=paced_end + 10 + stage.STRAGGLER_GRACE + 1)
    # Half or fewer ended: the run itself is slow, and each probe keeps its own time limit.
    half = {f"node{i}": 8.0 for i in range(32)}
    assert not stage.past_waiting(half, 64, paced_end, now=paced_end + 10 * stage.STRAGGLER_GRACE)


def test_the_probe_counts_what_was_expected_and_lists_the_rest():
    """What a probe prints (netprobe.summarise of what it measured): a thousand nodes would otherwise send 2 (N-1)
    connection entries and N names each, three million entries for the controller to parse and keep."""
    healthy = probe_records("netprobe-healthy.json")["node1"]
    assert healthy["outgoing"] == {"ok": 4, "failed": []}
    assert healthy["incoming"] == {"peers": 4, "others": []}
    assert healthy["resolve"] == {"names": 3, "unexpected": {}}
    firewall = probe_records("netprobe-node3-firewall.json")
    assert firewall["node1"]["outgoing"]["ok"] == 2
    assert [(o["to"], o["result"]) for o in firewall["node1"]["outgoing"]["failed"]] == [("node3", "timeout")] * 2
    assert firewall["node3"]["incoming"] == {"peers": 0, "others": []}  # its firewall let nothing in
    records = load("netprobe-healthy.json")
    records["node2"]["resolve"]["node3"] = {"hostname": "node3", "addresses": ["172.30.80.13", "10.0.0.3"]}
    records["node2"]["incoming"].append({"from": "10.1.1.1", "port": 29500, "peer": False})
    node2 = probe_records(records)["node2"]
    # Judged by the first address (what the ranks use): the cluster address first is expected, what follows is kept.
    assert node2["resolve"]["unexpected"] == {}
    assert node2["resolve"]["also"] == {"node3": ["10.0.0.3"]}
    records["node2"]["resolve"]["node3"] = {"hostname": "node3", "addresses": ["10.0.0.3", "172.30.80.13"]}
    node2 = probe_records(records)["node2"]
    assert node2["resolve"]["unexpected"] == {"node3": {"hostname": "node3", "addresses": ["10.0.0.3", "172.30.80.13"]}}
    assert node2["incoming"]["others"] == [{"from": "10.1.1.1", "port": 29500, "peer": False}]


def test_a_name_most_nodes_resolve_elsewhere_is_judged_by_the_majority_of_all_answers():
    """Nodes that list no answer for a name got its cluster address: they count in the majority as votes."""
    records = load("netprobe-healthy.json")
    records["node1"]["resolve"]["node3"] = {"hostname": "node3", "addresses": ["10.0.0.3"]}
    failing = [r for r in named(evaluate(records), "network.resolve") if r.status is Status.FAIL]
    assert [r.host for r in failing] == ["node1"]
    assert "node3 resolves to 10.0.0.3, other nodes get 172.30.80.13" in failing[0].message
    records["node2"]["resolve"]["node3"] = {"hostname": "node3", "addresses": ["10.0.0.3"]}
    failing = [r for r in named(evaluate(records), "network.resolve") if r.status is Status.FAIL]
    assert [r.host for r in failing] == ["node3"]  # now node3 itself is the odd one out
    assert "node3 resolves to 172.30.80.13, other nodes get 10.0.0.3" in failing[0].message


def test_a_node_whose_own_name_also_resolves_to_its_rail_addresses_passes():
    """Docker (and many multi-NIC hosts) write a hosts line per network for the node's own name: the cluster
    address first, then the rails'. The ranks use the first (gloo binds it, torchrun's rendezvous connects to it),
    so the others are noted, not failed. The old judgement compared the whole list and failed every node."""
    records = load("netprobe-healthy.json")
    rails = {}
    for number, (name, record) in enumerate(sorted(records.items()), 1):
        rails[name] = [f"172.31.1.{number}", f"172.31.2.{number}"]
        record["resolve"][name] = {"hostname": name, "addresses": [record["address"], *rails[name]]}
    results = named(evaluate(records), "network.resolve")
    assert {r.status for r in results} == {Status.PASS}
    node2 = next(r for r in results if r.host == "node2")
    assert node2.data["also"] == {"node2": rails["node2"]}
    assert "172.31.1.2" in node2.message


def test_a_rail_address_resolved_first_is_still_judged():
    """The first address is what the ranks use: a node whose own name resolves first to a rail address (the others
    get its cluster address) fails, whatever follows; everywhere the same other first address warns."""
    records = load("netprobe-healthy.json")
    cluster = records["node2"]["address"]
    records["node2"]["resolve"]["node2"] = {"hostname": "node2", "addresses": ["172.31.1.2", cluster]}
    (failing,) = [r for r in named(evaluate(records), "network.resolve") if r.status is Status.FAIL]
    assert failing.host == "node2"
    assert f"node2 resolves to 172.31.1.2, other nodes get {cluster}" in failing.message
    for record in records.values():
        record["resolve"]["node2"] = {"hostname": "node2", "addresses": ["172.31.1.2", cluster]}
    results = named(evaluate(records), "network.resolve")
    assert {r.status for r in results} == {Status.WARN}
    assert f"resolves first to 172.31.1.2, not its cluster address {cluster}" in results[0].message
