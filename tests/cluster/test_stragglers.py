"""Stragglers on the 3-node test cluster: a node whose link is rate-limited (a token bucket on its interface,
as a port that negotiated a lower speed would be) is named by the network stage's throughput rounds."""

from __future__ import annotations

import pytest
from harness import checks_of, clustercheck, ssh_client, ssh_run

pytestmark = pytest.mark.cluster


def test_a_rate_limited_node_is_named_with_its_throughput(bare_cluster, tmp_path):
    node2 = bare_cluster.node("node2")
    with ssh_client(bare_cluster, node2) as client:
        status, out = ssh_run(client, "tc qdisc add dev eth0 root tbf rate 50mbit burst 64kb latency 50ms")
        assert status == 0, out
        try:
            proc = clustercheck(
                bare_cluster,
                tmp_path,
                "--only",
                "network",
                "--skip",
                "torch.*",
                "--skip",
                "local.*",
                "--format",
                "json",
            )
        finally:
            ssh_run(client, "tc qdisc del dev eth0 root")
    checks = checks_of(proc)
    assert checks[("network.tcp", None)]["status"] == "PASS"  # slow, not broken
    throughput = checks[("network.throughput", None)]
    assert throughput["status"] == "WARN", throughput["message"]
    assert throughput["data"]["slow_senders"] == ["node2"] and throughput["data"]["slow_receivers"] == []
    assert throughput["message"].startswith("node2 sends slowly to every node: ")
    assert 30 < throughput["data"]["best_out_mbps"]["node2"] < 60  # the 50 Mbit/s limit, measured
    assert proc.returncode == 0  # a warning: the cluster works, one node is slow
