"""The network stage on the network training uses: the interface NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME or the
cluster interface name (facts/trainnet.py), the probe run over its address, and the report saying so."""

from __future__ import annotations

from clustercheck.checks import network
from clustercheck.facts import trainnet
from clustercheck.model import CheckResult, Status
from clustercheck.remote import netprobe
from clustercheck.stages import network as stage

# A node as the test cluster's rails make it: eth0 holds the SSH (cluster) address, eth1 and eth2 the rails'.
ADDRESSES = [("lo", "127.0.0.1"), ("eth0", "172.30.80.11"), ("eth1", "172.31.1.11"), ("eth2", "172.31.2.11")]
NAMES = [name for name, _ in ADDRESSES]
CLUSTER = ("eth0", "172.30.80.11")


def path(*settings, gpus=0, cluster=CLUSTER, ssh="172.30.80.11"):
    return trainnet.training_path(list(settings), ADDRESSES, cluster, ssh, gpus)


def test_nccl_socket_ifname_is_read_as_nccl_reads_it():
    """NCCL's syntax (env.html, NCCL_SOCKET_IFNAME): prefixes, `^` to exclude, `=` for exact names."""
    nccl = trainnet.NCCL
    assert trainnet.selected(nccl, "eth", NAMES) == ["eth0", "eth1", "eth2"]  # a prefix, in the node's order
    assert trainnet.selected(nccl, "eth1,eth2", NAMES) == ["eth1", "eth2"]
    assert trainnet.selected(nccl, "^eth0,lo", NAMES) == ["eth1", "eth2"]
    assert trainnet.selected(nccl, "^eth", NAMES) == []  # loopback is never what an exclusion leaves
    assert trainnet.selected(nccl, "=eth", NAMES) == []  # exact: no interface is named `eth`
    assert trainnet.selected(nccl, "=eth2", NAMES) == ["eth2"]
    assert trainnet.selected(nccl, "^=eth0", NAMES) == ["eth1", "eth2"]
    assert trainnet.selected(nccl, "ib", NAMES) == []


def test_gloo_socket_ifname_is_exact_names_in_the_order_given():
    gloo = trainnet.GLOO
    assert trainnet.selected(gloo, "eth2,eth1", NAMES) == ["eth2", "eth1"]
    assert trainnet.selected(gloo, "eth", NAMES) == []  # not a prefix for gloo


def test_the_environment_moves_the_training_traffic_to_another_interface():
    moved = path(("/etc/environment:3", "GLOO_SOCKET_IFNAME", "eth1"))
    assert (moved.interface, moved.address, moved.variable, moved.elsewhere) == (
        "eth1",
        "172.31.1.11",
        "GLOO_SOCKET_IFNAME",
        True,
    )
    assert "/etc/environment:3 sets GLOO_SOCKET_IFNAME=eth1" in moved.why
    # A GPU node's NCCL reads NCCL_SOCKET_IFNAME first; a CPU node's gloo GLOO_SOCKET_IFNAME.
    both = (
        ("/etc/nccl.conf:1", "NCCL_SOCKET_IFNAME", "^eth0,lo"),
        ("/etc/environment:1", "GLOO_SOCKET_IFNAME", "eth2"),
    )
    assert path(*both, gpus=8).address == "172.31.1.11"
    assert path(*both, gpus=0).address == "172.31.2.11"
    # The last assignment of a variable is the one the job inherits.
    later = path(
        ("/etc/environment:1", "GLOO_SOCKET_IFNAME", "eth1"), ("/etc/profile.d/x.sh:2", "GLOO_SOCKET_IFNAME", "eth2")
    )
    assert later.interface == "eth2"


def test_without_a_variable_or_with_one_naming_the_cluster_interface_the_cluster_address_is_probed():
    plain = path()
    assert (plain.interface, plain.address, plain.elsewhere) == ("eth0", "172.30.80.11", False)
    same = path(("/etc/nccl.conf:1", "NCCL_SOCKET_IFNAME", "eth0"), gpus=1)
    assert (same.address, same.elsewhere) == ("172.30.80.11", False)
    # A variable that selects nothing here is env.launch's to judge: the cluster interface is probed meanwhile.
    assert path(("/etc/nccl.conf:1", "NCCL_SOCKET_IFNAME", "ib"), gpus=1).address == "172.30.80.11"
    # The inventory's cluster_interface naming another interface than the SSH address's: that one, and said so.
    rail = path(cluster=("eth1", "172.31.1.11"))
    assert (rail.address, rail.elsewhere) == ("172.31.1.11", True)
    assert "not the SSH address 172.30.80.11" in rail.why


def test_the_probe_is_told_the_training_address_and_the_name_still_resolves_to_the_cluster_address():
    peers = [network.Peer("node1", "172.31.1.11", None, "172.30.80.11"), network.Peer("node2", "172.30.80.12")]
    listed = stage.peer_list(peers)
    assert "resolves=172.30.80.11" in listed.splitlines()[0] and "resolves" not in listed.splitlines()[1]
    assert netprobe.parse_peer_list(listed) == (
        {"node1": "172.31.1.11", "node2": "172.30.80.12"},
        {},
        {"node1": "172.30.80.11"},
    )
    with_hostname = stage.peer_list([network.Peer("node1", "172.31.1.11", "gpu-01", "172.30.80.11")])
    assert netprobe.parse_peer_list(with_hostname)[1:] == ({"node1": "gpu-01"}, {"node1": "172.30.80.11"})
    # The probe judges the names by the cluster address: node1 resolving to it is expected, not listed.
    names = {"node1": {"hostname": "node1", "addresses": ["172.30.80.11"]}}
    summary = netprobe.resolve_summary(names, {"node1": "172.30.80.11"})
    assert summary["unexpected"] == {}
    (judged,) = network.resolve_checks({"node1": {"resolve": summary}}, peers[:1])
    assert judged.status is Status.PASS


def test_the_checks_measured_over_the_training_network_say_which_interface_and_why():
    paths = {
        "node1": path(("/etc/nccl.conf:1", "NCCL_SOCKET_IFNAME", "eth1"), gpus=1),
        "node2": trainnet.TrainingPath(
            "eth0", "172.30.80.12", "the cluster interface eth0, which holds the SSH address"
        ),
    }
    results = [
        CheckResult("network.tcp", Status.PASS, "all 2 pairs connect"),
        CheckResult("network.mtu", Status.PASS, "1500"),
    ]
    tcp, mtu = stage.with_paths(results, paths)
    assert "node1 over eth1" in tcp.message and "NCCL_SOCKET_IFNAME=eth1" in tcp.message
    assert tcp.data["paths"]["node1"]["interface"] == "eth1"
    assert tcp.data["paths"]["node2"]["address"] == "172.30.80.12"
    assert mtu.message == "1500" and "paths" not in mtu.data
    # Nothing moved: the message is as before, the data still names the path.
    (plain,) = stage.with_paths(results[:1], {"node2": paths["node2"]})
    assert "training" not in plain.message and plain.data["paths"]["node2"]["interface"] == "eth0"


def test_the_plan_gives_each_probe_the_address_its_training_traffic_uses():
    """Plan.of on members as the core stage makes them: node1's /etc/environment names eth1 for gloo, node2 has no
    setting; the probe list carries node1's rail address and the cluster address its name must resolve to."""
    from ipaddress import IPv4Interface
    from types import SimpleNamespace

    from clustercheck.facts.model import Address, NodeFacts
    from clustercheck.facts.records import LaunchSetting
    from clustercheck.inventory import Node
    from clustercheck.stages import Member

    def member(name, number, settings):
        node = Node(name=name, address=f"172.30.80.1{number}")
        on = [("eth0", f"172.30.80.1{number}/24"), ("eth1", f"172.31.1.1{number}/24")]
        facts = NodeFacts(
            node,
            "python3",
            "python3",
            addresses=[Address(i, IPv4Interface(a)) for i, a in on],
            launch_env=[LaunchSetting("/etc/environment", 1, n, v) for n, v in settings],
        )
        return Member(node, None, facts, node.address, "eth0", None, 0)

    members = [member("node1", 1, [("GLOO_SOCKET_IFNAME", "eth1")]), member("node2", 2, [])]
    selection = SimpleNamespace(check_selected=lambda name: True)
    config = SimpleNamespace(selection=selection, master_port=29500, network_duration=5.0, network_rounds=8)
    plan = stage.Plan.of(members, config)
    assert netprobe.parse_peer_list(plan.listed) == (
        {"node1": "172.31.1.11", "node2": "172.30.80.12"},
        {},
        {"node1": "172.30.80.11"},
    )
    assert plan.paths["node1"].interface == "eth1" and not plan.paths["node2"].elsewhere


def test_the_rendezvous_is_tried_at_the_masters_cluster_address_when_the_probe_runs_elsewhere():
    """torchrun's --master-addr is the master's cluster address while the ranks' traffic goes over the training
    interface: the master port is tried there too (netprobe.Meeting), a refusal named as a failed connection."""
    import socket
    import time

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    peers, resolves = {"node1": "127.0.0.1", "node2": "127.0.0.1"}, {"node1": "127.0.0.1"}
    assert netprobe.rendezvous_of("node1", resolves) == ("node1", "127.0.0.1")
    assert netprobe.rendezvous_of("node1", {}) is None  # the probe's own addresses are the rendezvous's
    master = netprobe.Meeting("node1", ("node1", "127.0.0.1"), port, resolves, peers)
    other = netprobe.Meeting("node2", ("node1", "127.0.0.1"), port, resolves, peers)
    states: list[dict] = []
    master.listen(states)
    assert states == [{"port": port, "ok": True, "address": "127.0.0.1", "rendezvous": True}]
    deadline = time.monotonic() + 1.0
    master.start(deadline)
    other.start(deadline)
    (connection,) = other.finish(deadline)
    assert master.finish(deadline) == []
    assert connection["result"] == "ok" and connection["to"] == "node1" and connection["rendezvous"]
    # Nobody listening any more: refused, and the far side is named with the address tried.
    late = netprobe.Meeting("node2", ("node1", "127.0.0.1"), port, resolves, peers)
    late.start(time.monotonic() + 0.5)
    (refused,) = late.finish(time.monotonic() + 0.5)
    assert refused["result"] == "refused" and f"127.0.0.1:{port}" in refused["detail"]


def test_the_firewall_advice_names_the_network_the_probe_ran_over():
    from test_network import member

    nodes = [
        member(n, f"172.30.80.1{i}", "eth0", [("eth0", f"172.30.80.1{i}/24"), ("eth1", f"172.31.1.1{i}/24")])
        for i, n in enumerate(("node1", "node2"), 1)
    ]
    assert stage.cluster_network(nodes) == "172.30.80.0/24"
    moved = {
        m.name: trainnet.TrainingPath("eth1", f"172.31.1.1{i}", "GLOO_SOCKET_IFNAME=eth1", trainnet.GLOO, True)
        for i, m in enumerate(nodes, 1)
    }
    assert stage.cluster_network(nodes, moved) == "172.31.1.0/24"
