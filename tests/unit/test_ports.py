"""The ephemeral port range sampled by the network probe (remote/portsample.py, the probe's mesh) and judged
(checks/ports.py): a rule that drops or rejects part of the range torch's collectives listen on is named with the
node, the range and the rule, before any torch job runs."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from test_firewall import answer

from clustercheck.checks import network, ports, setup_roles
from clustercheck.facts import firewall
from clustercheck.model import Status
from clustercheck.remote import mesh, netprobe, portsample


def test_one_port_from_each_eighth_of_the_range_drawn_by_the_seed():
    tries = portsample.candidates(32768, 60999, seed=7, avoid={29500})
    firsts = [t[0] for t in tries]
    bounds = portsample.slices(32768, 60999)
    assert len(firsts) == 8 and all(low <= p <= high for p, (low, high) in zip(firsts, bounds, strict=True))
    assert bounds[0][0] == 32768 and bounds[-1][1] == 60999
    assert portsample.candidates(32768, 60999, seed=7, avoid=set()) == tries  # the seed decides the draw
    assert portsample.candidates(32768, 60999, seed=8, avoid=set()) != tries


def test_the_range_is_read_from_the_kernel_file(tmp_path):
    path = tmp_path / "ip_local_port_range"
    path.write_text("32768\t60999\n")  # as /proc/sys/net/ipv4/ip_local_port_range reads on Debian 12 and here
    assert portsample.local_range(str(path)) == (32768, 60999)
    assert portsample.local_range(str(tmp_path / "absent")) is None


def _probe(me, peers, go, ready, records):
    records[me] = netprobe.summarise(
        netprobe.mesh(me, peers, [], 8.0, me, {}, go_file=go, ready_file=ready, ready_timeout=20, sample_seed=11),
        peers,
    )


def test_two_probes_connect_to_each_others_sampled_ports(tmp_path):
    """Two probes on two loopback addresses, let go as the controller does: each listens on a sample of the range
    and connects to the other's, named in the go file from the ready files."""
    peers = {"a": "127.0.0.1", "b": "127.0.0.2"}
    go = {n: str(tmp_path / f"{n}.go") for n in peers}
    ready = {n: tmp_path / f"{n}.ready" for n in peers}
    records: dict = {}
    threads = [threading.Thread(target=_probe, args=(n, peers, go[n], str(ready[n]), records)) for n in peers]
    for thread in threads:
        thread.start()
    give_up = time.monotonic() + 20
    while not all(r.exists() for r in ready.values()) and time.monotonic() < give_up:
        time.sleep(0.05)
    samples = {n: json.loads(ready[n].read_text())["sample"] for n in peers}
    # The window is an upper bound: the probes end it as soon as every connection is made both ways. A loaded
    # machine once let 6 s pass before a probe tried any.
    for n in peers:  # written whole, as `netprobe go` writes it: a probe reading an empty go file gets no window
        mesh.write_atomic(go[n], json.dumps({"window": 60, "samples": samples}))
    for thread in threads:
        thread.join(120)
    low, high = portsample.local_range()
    for record in records.values():
        sample = record["sample"]
        assert sample["range"] == [low, high] and sample["seed"] == 11
        assert len(sample["ports"]) == 8 and all(low <= p <= high for p in sample["ports"])
        assert sample["outgoing"] == {"ok": 8, "failed": []}
        assert set(sample["incoming"].values()) == {1}  # the other probe reached every sampled port
        assert record["incoming"]["peers"] == 0  # the sampled ports are counted apart from the probe's own
    (passed,) = ports.sample_check(records, {})
    assert passed.status is Status.PASS and "16 connections" in passed.message


def test_the_rules_covering_a_port_are_found():
    rules = firewall.port_rules({}, answer("iptables-S-ufw-cloudflareiptables-3.txt"))
    assert len(rules) == 1 and "--dports 22 " in rules[0]  # the fail2ban jump; the ufw rules match no port
    assert firewall.covering(rules, 22) == list(rules) and firewall.covering(rules, 23) == []
    nft = firewall.port_rules(answer("nft-input-policy-drop-opensnitch-1423.txt"), {})
    (covered,) = firewall.covering(nft, 22)
    assert "dport 22 accept" in covered


RECORDS = Path(__file__).parent / "records"
PEERS = [network.Peer(f"node{i}", f"172.30.81.1{i}") for i in (1, 2, 3)]


def recorded(name: str) -> dict:
    """The probes' records as they printed them (netprobe.summarise'd), keyed by node."""
    return json.loads((RECORDS / name).read_text())


def test_a_node_dropping_part_of_its_range_is_named_with_the_range_and_its_rule():
    """node3 of the test cluster dropping new connections to 32768-45000 (iptables), the rendezvous port and the
    probe's own ports open: network.tcp passes, network.ports names node3, the range and the rule."""
    records = recorded("netprobe-node3-ephemeral-drop.json")
    rules = firewall.port_rules({}, answer("iptables-S-ephemeral-drop-testcluster.txt"))
    (found,) = ports.sample_check(records, {"node3": rules}, cidr="172.30.81.0/24")
    assert found.status is Status.FAIL and found.host == "node3"
    assert found.message.startswith("node3 drops new connections to ports 32768-45000 of its ephemeral range")
    assert "timed out" in found.message and "connected" in found.message and "--dport 32768:45000" in found.message
    assert found.data["blocked"] == [35000, 37259, 41168, 44902] and len(found.data["connected"]) == 4
    assert found.data["from"] == ["node1", "node2"]
    assert "172.30.81.0/24" in found.remediation and "32768:60999" in found.remediation
    tcp = [r for r in network.evaluate(records, PEERS, "node1", 29500) if r.name == "network.tcp"]
    assert [r.status for r in tcp] == [Status.PASS]  # the probe's own ports are open: only the sample finds it


def test_a_node_rejecting_another_part_of_its_range_is_named_without_its_rules_read():
    """node2 rejecting 38000-48000 with tcp-reset: the node, the verb and the sampled ports; with no rule read,
    the part of the range is said as the samples show it."""
    records = recorded("netprobe-node2-ephemeral-reject.json")
    (found,) = ports.sample_check(records, {})
    assert found.status is Status.FAIL and found.host == "node2"
    assert found.message.startswith("node2 rejects new connections to part of its ephemeral range 32768-60999")
    assert "41837, 45544, 47317 refused" in found.message and "`" not in found.message
    rules = firewall.port_rules({}, answer("iptables-S-ephemeral-reject-testcluster.txt"))
    (quoted,) = ports.sample_check(records, {"node2": rules})
    assert "ports 38000-48000" in quoted.message and "REJECT --reject-with tcp-reset" in quoted.message


def test_a_node_whose_own_stateless_rule_resets_the_replies_to_its_connections_is_named_with_the_rule():
    """node2 rejecting 38000-48000 with a TCP reset and no connection state, its ip_local_port_range set to that
    range: every connection node2 makes leaves from a port its own rule covers, so the answers never get in.
    network.tcp names node2 and its rule (not node1's or node3's firewall, as it did), and the fix goes to node2."""
    records = recorded("netprobe-node2-stateless-reject.json")
    peers = [network.Peer(name, r["address"]) for name, r in sorted(records.items())]
    rules = firewall.port_rules({}, answer("iptables-S-stateless-reject-testcluster.txt"))
    tcp = [
        r for r in network.evaluate(records, peers, "node1", 29500, rules={"node2": rules}) if r.name == "network.tcp"
    ]
    assert [(r.status, r.host, r.data["to"]) for r in tcp] == [
        (Status.FAIL, "node2", "node1"),
        (Status.FAIL, "node2", "node3"),
    ]
    to_node1 = tcp[0]
    assert to_node1.data["side"] == "source" and to_node1.data["cause"] == "replies lost"
    assert "node1 accepted the same port(s) from node3" in to_node1.message
    assert "the replies to node2's own ephemeral port(s) 40351, 42297, 43853, 45939 never got in" in to_node1.message
    assert "--dport 38000:48000 -j REJECT --reject-with tcp-reset`" in to_node1.message
    assert to_node1.remediation.startswith("On node2,") and "--ctstate ESTABLISHED,RELATED" in to_node1.remediation
    assert setup_roles.nodes_of(to_node1) == ["node2"]
    # Without the rules read, the old attribution stands: nothing is said that the facts do not show.
    plain = [r for r in network.evaluate(records, peers, "node1", 29500) if r.name == "network.tcp"]
    assert all(r.data["cause"] == "firewall" and "side" not in r.data for r in plain)


def test_no_sample_is_a_skip():
    records = recorded("netprobe-node3-ephemeral-drop.json")
    bare = {n: {k: v for k, v in r.items() if k != "sample"} for n, r in records.items()}
    (found,) = ports.sample_check(bare, {})
    assert found.status is Status.SKIP


def _sample(peers: list[str], ports: list[int], failed: list[tuple[str, int]]) -> dict:
    """A probe's sample (the shape remote/mesh.py records) with the connections to FAILED timed out: a scenario for
    the judgement, not a recorded output (the recorded ones are above)."""
    lost = [{"to": to, "port": port, "result": "timeout", "detail": "no answer within 2 s"} for to, port in failed]
    return {
        "range": [32768, 60999],
        "seed": 3,
        "ports": ports,
        "incoming": {str(p): 1 for p in ports},
        "peers": peers,
        "outgoing": {"ok": 2 * len(peers) - len(lost), "failed": lost},
    }


def test_a_node_that_drops_everything_is_named_and_the_nodes_it_cannot_reach_are_not():
    """node3 drops every packet from the other nodes (the `firewall` fault row): its peers cannot reach its ports,
    and its own connections get no replies. node1's and node2's ports, which the other peer reached, are open: the
    failures to them are node3's, not theirs."""
    ports_of = {"node1": [40000, 50000], "node2": [41000, 51000], "node3": [42000, 52000]}
    records = {
        "node1": {"sample": _sample(["node2", "node3"], ports_of["node1"], [("node3", 42000), ("node3", 52000)])},
        "node2": {"sample": _sample(["node1", "node3"], ports_of["node2"], [("node3", 42000), ("node3", 52000)])},
        "node3": {
            "sample": _sample(
                ["node1", "node2"], ports_of["node3"], [(n, p) for n in ("node1", "node2") for p in ports_of[n]]
            )
        },
    }
    found = ports.sample_check(records, {})
    assert [(r.host, r.status) for r in found] == [("node3", Status.FAIL)]
    assert found[0].data["from"] == ["node1", "node2"] and found[0].data["blocked"] == [42000, 52000]
    # node3 alone cannot reach node1's 40000, which node2 reached: the replies to node3 are lost on their way back
    records["node1"]["sample"]["outgoing"]["failed"] = []
    records["node2"]["sample"]["outgoing"]["failed"] = []
    (lost,) = ports.sample_check(records, {})
    assert lost.host == "node3" and "replies" in lost.message and "ESTABLISHED" in lost.remediation
    assert {(o["to"], o["port"]) for o in lost.data["replies_lost"]} == {
        (n, p) for n in ("node1", "node2") for p in ports_of[n]
    }
