"""Issue 54, item 1: what the fabric is, per node and per rail. The rail map (which HCA or interface each GPU's
inter-node channels, or each gloo rank's connections, went through) read from recorded NCCL INFO logs of public
threads (tests/unit/data/README.md), and a node whose fabric differs from the majority's failing with no
expectation set."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from test_hardware_env import facts
from wording import says

from clustercheck.checks import nccl_net
from clustercheck.facts.nccl_log import parse_nccl_log, rail_map
from clustercheck.model import Status

NCCL = Path(__file__).parent / "data" / "nccl"


def log(name: str, only: str | None = None) -> str:
    """A recorded log, or only its lines holding ONLY (one node's lines of a log that holds several)."""
    text = (NCCL / name).read_text()
    return text if only is None else "\n".join(line for line in text.splitlines() if only in line)


# ----------------------------------------------------------------------------- the rail map, per fabric kind


@pytest.mark.parametrize(
    "name, only, network, rails",
    [
        # NCCL's own IB with GPUDirect RDMA: GPU 5's channels go through NET/IB/4, the HCA beside GPU 4.
        (
            "ib-gdr-aks-rdma-infiniband-pr36.log",
            None,
            "ib",
            {"0": ("NET/IB/0", "IB", True), "5": ("NET/IB/4", "IB", True), "6": ("NET/IB/6", "IB", True)},
        ),
        # RoCE through the IBext_v8 plugin, NCCL >= 2.20's merged NICs: device [1] is mlx5_0 and mlx5_1.
        ("roce-merged-ibext-nccl-tests-373.log", None, "roce", {"0": ("mlx5_0+mlx5_1", "RoCE", False)}),
        # Sockets over two interfaces (NCCL_IB_DISABLE=1): NET/Socket/0 is ibs85f0 on the node at 192.168.1.14.
        ("socket-two-ifs-nccl-tests-188.log", "user:852", "socket", {"1": ("ibs85f0", "Socket", False)}),
        # AWS's Libfabric plugin on EFA (p4d.24xlarge): two GPUs per EFA device, the plugin's index as NCCL names it.
        (
            "efa-aws-ofi-nccl-aws-efa-eks.log",
            "worker-0:",
            "efa",
            {
                "0": ("NET/AWS Libfabric/1", "EFA", True),
                "1": ("NET/AWS Libfabric/1", "EFA", True),
                "2": ("NET/AWS Libfabric/3", "EFA", True),
                "4": ("NET/AWS Libfabric/0", "EFA", True),
                "7": ("NET/AWS Libfabric/2", "EFA", True),
            },
        ),
    ],
)
def test_each_gpus_rail_is_read_from_the_channel_lines(name, only, network, rails):
    found = parse_nccl_log(log(name, only))
    assert found.network == network
    got = rail_map(found)
    for gpu, (device, kind, gdr) in rails.items():
        assert (got[gpu]["device"], got[gpu]["kind"], got[gpu]["gdr"]) == (device, kind, gdr), gpu


def test_a_rails_port_and_interface_come_from_the_device_list():
    roce = rail_map(parse_nccl_log(log("roce-merged-ibext-nccl-tests-373.log")))
    assert roce["0"]["port"] == 1 and roce["0"]["channels"] == 3
    sockets = rail_map(parse_nccl_log(log("socket-two-ifs-nccl-tests-188.log", "user:852")))
    assert sockets["1"]["interface"] == "ibs85f0"
    # A channel through a device no process of the node listed keeps NCCL's own name for it.
    other = rail_map(parse_nccl_log(log("socket-two-ifs-nccl-tests-188.log", "user:169")))
    assert other["7"]["device"] == "NET/Socket/3" and other["7"]["interface"] is None


def test_merged_roce_devices_are_roce_hcas():
    found = parse_nccl_log(log("roce-merged-ibext-nccl-tests-373.log"))
    assert found.hcas == {"mlx5_2:1": "RoCE", "mlx5_3:1": "RoCE", "mlx5_0:1": "RoCE", "mlx5_1:1": "RoCE"}


def test_the_finding_carries_the_rail_map_and_names_the_devices():
    found = nccl_net.judge_nccl(parse_nccl_log(log("efa-aws-ofi-nccl-aws-efa-eks.log", "worker-0:")), facts(), None)
    assert found.status is Status.PASS
    assert says(found.message, "EFA", "GPUDirect RDMA used", "NET/AWS Libfabric/1 (GPU 0, 1)")
    assert found.data["rails_by"] == "gpu" and found.data["rails"]["6"]["device"] == "NET/AWS Libfabric/2"
    assert found.data["network"] == "efa"


# ----------------------------------------------------------------------------- the majority, through the stage


def transport(tmp_path, logs: dict[str, str], expect: str | None = None):
    """transport.network of each node whose NCCL log is LOGS[node], as the collectives stage judges them."""
    from clustercheck.config import RunConfig
    from clustercheck.reach import Fanout
    from clustercheck.stages import Context, Member, collectives, torchjob
    from clustercheck.transport import factory

    config = RunConfig(run_dir=tmp_path, expect_transport=expect)
    members = []
    for name, text in logs.items():
        node = facts(name)
        members.append(Member(node.node, None, node, "10.0.0.5", "eth0", name, 8))
        (config.host_dir(name) / f"nccl-{name}-100.log").write_text(text)
    ctx = Context(config, lambda h, s: None, tuple(logs), Fanout(factory.default(config.ssh)))
    outcome = torchjob.JobOutcome([], 8 * len(logs), "nccl")
    return {r.host: r for r in collectives.transport_results(members, outcome, ctx, time.time() - 60)}


def test_one_node_on_sockets_among_infiniband_nodes_fails_with_no_expectation(tmp_path):
    ib = log("ib-gdr-aks-rdma-infiniband-pr36.log")
    results = transport(tmp_path, {"node1": ib, "node2": ib, "node3": log("socket-nccl-1232.log"), "node4": ib})
    odd = results["node3"]
    assert odd.status is Status.FAIL
    assert says(odd.message, "node3", "Socket", "3 of 4 nodes use IB with GPUDirect RDMA", "node1")
    assert says(odd.remediation, "NCCL_IB_HCA", "ibv_devinfo", "NCCL_NET", "/dev/infiniband")
    assert odd.data["rails"]["0"]["kind"] == "Socket"
    assert all(results[n].status is Status.PASS for n in ("node1", "node2", "node4"))


def test_every_node_on_sockets_passes_as_before(tmp_path):
    sockets = log("socket-nccl-1232.log")
    results = transport(tmp_path, {"node1": sockets, "node2": sockets, "node3": sockets})
    assert {r.status for r in results.values()} == {Status.PASS}


def test_one_node_without_gpudirect_rdma_among_gdr_nodes_is_named_with_peermem(tmp_path):
    ib = log("ib-gdr-aks-rdma-infiniband-pr36.log")
    results = transport(tmp_path, {"node1": ib, "node2": log("ib-p2p-nccl-1412.log"), "node3": ib})
    odd = results["node2"]
    assert odd.status is Status.FAIL
    assert (
        says(odd.message, "IB without GPUDirect RDMA", "IB with GPUDirect RDMA") and "nvidia-peermem" in odd.remediation
    )
    assert results["node1"].status is Status.PASS


def test_two_nodes_that_disagree_both_fail_with_no_majority(tmp_path):
    results = transport(
        tmp_path, {"node1": log("ib-gdr-aks-rdma-infiniband-pr36.log"), "node2": log("socket-nccl-1232.log")}
    )
    assert {r.status for r in results.values()} == {Status.FAIL}
    assert says(results["node1"].message, "no fabric has a majority", "uses IB", "Socket")


def test_an_expectation_still_decides_first(tmp_path):
    ib = log("ib-gdr-aks-rdma-infiniband-pr36.log")
    results = transport(tmp_path, {"node1": ib, "node2": ib, "node3": log("socket-nccl-1232.log")}, expect="ib")
    assert says(results["node3"].message, "ib was expected") and results["node3"].status is Status.FAIL


# ----------------------------------------------------------------------------- gloo: each rank's bound address

RAILS_IP = (
    "2: eth0    inet 10.0.0.5/24 brd 10.0.0.255 scope global eth0\\       valid_lft forever preferred_lft forever\n"
    "3: eth1    inet 10.1.0.5/24 brd 10.1.0.255 scope global eth1\\       valid_lft forever preferred_lft forever\n"
    "4: eth2    inet 10.2.0.5/24 brd 10.2.0.255 scope global eth2\\       valid_lft forever preferred_lft forever"
)


def rank(local_rank: int, local: str, remote: str) -> dict:
    return {
        "local_rank": local_rank,
        "endpoints": [
            {"local": local, "local_port": 40000, "remote": remote, "remote_port": 41000, "state": "established"}
        ],
    }


def rails_node(name: str):
    route = "1.1.1.1 via 10.0.0.1 dev eth0 src 10.0.0.5 uid 0"
    return facts(name, commands={"ip_addr": {"rc": 0, "out": RAILS_IP}, "ip_route": {"rc": 0, "out": route}})


def test_each_gloo_rank_s_rail_is_the_interface_of_its_bound_address():
    records = [rank(0, "10.1.0.5", "10.1.0.6"), rank(1, "10.2.0.5", "10.2.0.6")]
    found = nccl_net.judge_gloo(records, rails_node("node1"), None, 29500, None)
    assert found.data["rails_by"] == "local_rank"
    assert found.data["rails"]["0"]["interface"] == "eth1" and found.data["rails"]["1"]["interface"] == "eth2"
    assert found.data["rails"]["1"]["kind"] == "Socket" and found.data["rails"]["1"]["address"] == "10.2.0.5"
    assert says(found.message, "eth1 (local rank 0)", "eth2 (local rank 1)")


def test_a_gloo_node_whose_ranks_use_fewer_interfaces_than_the_others_fails():
    two = [rank(0, "10.1.0.5", "10.1.0.6"), rank(1, "10.2.0.5", "10.2.0.6")]
    one = [rank(0, "10.0.0.5", "10.0.0.6"), rank(1, "10.0.0.5", "10.0.0.7")]
    nodes = {n: rails_node(n) for n in ("node1", "node2", "node3")}
    records = {"node1": two, "node2": one, "node3": two}
    fabrics = {
        n: nccl_net.gloo_fabric(nccl_net.gloo_interface(records[n], nodes[n], 29500))
        for n in ("node1", "node2", "node3")
    }
    odd = nccl_net.judge_gloo(records["node2"], nodes["node2"], None, 29500, None, fabrics)
    assert odd.status is Status.FAIL and says(odd.message, "Socket, 1 device", "2 of 3 nodes use Socket, 2 devices")
    assert nccl_net.judge_gloo(records["node1"], nodes["node1"], None, 29500, None, fabrics).status is Status.PASS


def test_with_rails_each_local_rank_must_bind_its_own_rail_not_the_cluster_interface():
    on_rails = [rank(0, "10.1.0.5", "10.1.0.6"), rank(1, "10.2.0.5", "10.2.0.6"), rank(2, "10.1.0.5", "10.1.0.7")]
    node = rails_node("node1")
    found = nccl_net.judge_gloo(on_rails, node, "eth0", 29500, None, rails=("eth1", "eth2"))
    assert found.status is Status.PASS  # local rank 2 on eth1: item 2 mod 2
    swapped = [rank(0, "10.2.0.5", "10.2.0.6"), rank(1, "10.2.0.5", "10.2.0.6")]
    off = nccl_net.judge_gloo(swapped, node, "eth0", 29500, None, rails=("eth1", "eth2"))
    assert off.status is Status.FAIL
    assert says(off.message, "local rank 0 bound to eth2, not its rail eth1", "cluster_rail_interfaces")
    assert "local rank 1" not in off.message and "ip -br addr" in off.fix
    # Without rails the cluster interface stays the rule.
    assert nccl_net.judge_gloo(on_rails, node, "eth0", 29500, None).status is Status.FAIL


def test_a_gloo_rank_s_rail_is_its_listening_address_not_where_its_connections_went():
    # As on the test cluster's two rails: local rank 1 listens on its rail (eth2), but reaches the peers on rail 0
    # through eth1 (the route to their listening address), so most of its connections are on eth1.
    def conn(local, remote):
        return {"local": local, "local_port": 40000, "remote": remote, "remote_port": 41000, "state": "established"}

    listen = {"local": "10.2.0.5", "local_port": 45000, "remote": "0.0.0.0", "remote_port": 0, "state": "listen"}
    store = {"local": "0.0.0.0", "local_port": 29500, "remote": "0.0.0.0", "remote_port": 0, "state": "listen"}
    one = {
        "local_rank": 1,
        "endpoints": [
            listen,
            store,
            conn("10.1.0.5", "10.1.0.6"),
            conn("10.1.0.5", "10.1.0.7"),
            conn("10.1.0.5", "10.1.0.5"),
            conn("10.2.0.5", "10.2.0.6"),
            conn("10.2.0.5", "10.2.0.7"),
        ],
    }
    found = nccl_net.judge_gloo([one], rails_node("node1"), "eth0", 29500, None, rails=("eth1", "eth2"))
    assert found.status is Status.PASS, found.message
    assert found.data["rails"]["1"]["interface"] == "eth2" and found.data["rails"]["1"]["devices"] == ["eth1", "eth2"]


RECORDS = Path(__file__).parent / "records"
TEST_RAILS_IP = "\n".join(
    f"{i}: {iface}    inet 172.30.{net}.{{host}}/24 brd 172.30.{net}.255 scope global {iface}\\       valid_lft forever"
    for i, iface, net in ((2, "eth0", 80), (3, "eth1", 84), (4, "eth2", 85))
)


def gloo_transport(tmp_path, rails: tuple[str, ...]):
    """transport.network of the three test nodes, judged by the collectives stage on their ranks' recorded
    records (tests/unit/records/collectives-gloo-rails-3x2.json), the inventory naming RAILS."""
    from dataclasses import replace

    from clustercheck.config import RunConfig
    from clustercheck.reach import Fanout
    from clustercheck.stages import Context, Member, collectives, torchjob
    from clustercheck.transport import factory

    records = json.loads((RECORDS / "collectives-gloo-rails-3x2.json").read_text())
    config = RunConfig(run_dir=tmp_path, master_port=29631)
    members = []
    for n in (1, 2, 3):
        route = f"1.1.1.1 via 172.30.80.1 dev eth0 src 172.30.80.1{n} uid 0"
        ip = {"rc": 0, "out": TEST_RAILS_IP.replace("{host}", f"1{n}")}
        node = facts(f"node{n}", commands={"ip_addr": ip, "ip_route": {"rc": 0, "out": route}})
        node = replace(node, node=replace(node.node, rail_interfaces=rails))
        members.append(Member(node.node, None, node, f"172.30.80.1{n}", "eth0", f"node{n}", 2))
    outcome = torchjob.JobOutcome([{**r, "node": r["host"]} for r in records], 6, "gloo")
    ctx = Context(config, lambda h, s: None, ("node1", "node2", "node3"), Fanout(factory.default(config.ssh)))
    return {r.host: r for r in collectives.transport_results(members, outcome, ctx, time.time())}


def test_the_test_clusters_gloo_ranks_each_on_their_rail_pass_with_the_rail_map(tmp_path):
    results = gloo_transport(tmp_path, ("eth1", "eth2"))
    for name, result in results.items():
        assert result.status is Status.PASS, result.message
        assert says(result.message, name, "eth1 (local rank 0)", "eth2 (local rank 1)")
        assert [result.data["rails"][k]["interface"] for k in ("0", "1")] == ["eth1", "eth2"]
    assert results["node2"].data["rails"]["1"]["address"] == "172.30.85.12"


def test_ranks_off_the_rail_the_inventory_gives_them_are_named(tmp_path):
    results = gloo_transport(tmp_path, ("eth2", "eth1"))  # the same runs judged against rails named the other way
    assert {r.status for r in results.values()} == {Status.FAIL}
    assert says(results["node3"].message, "node3", "local rank 0 bound to eth1, not its rail eth2", "local rank 1")
