"""The network stage at the scale users run: 64 test nodes (containers sharing this machine's two cores and one
Docker bridge), every pair connected over TCP with no false failure.

The nodes have no torch: the test is about the network probe, so the torch checks and the node-local
collectives are skipped and the run stops after the network stage.

The round trip and throughput rounds run too, 8 of them (the default --network-rounds): each node measured with 8
partners. No node may be named slow: none is slow with most of its partners. Single pairs may be: 64 nodes share
two cores here, and a pair measured while its two processes wait for a core is slower by ten times or more; that
is the measurement being honest about this machine.
"""

from __future__ import annotations

import time

import pytest
from conftest import own_cluster
from harness import checks_of, clustercheck, raise_machine_limits

pytestmark = pytest.mark.cluster
NODES = 64


@pytest.fixture(scope="module")
def big_cluster():
    problems = raise_machine_limits()
    if problems:
        pytest.fail("cannot raise the test machine's limits for 64 nodes: " + "; ".join(problems))
    started = time.monotonic()
    with own_cluster(NODES, f"the {NODES}-node test cluster", suffix="-big") as up:
        up.seconds_to_start = time.monotonic() - started
        yield up


def test_64_nodes_pass_the_core_and_network_stages_with_no_false_failure(big_cluster, tmp_path):
    started = time.monotonic()
    proc = clustercheck(
        big_cluster, tmp_path, "--only", "network", "--skip", "torch.*", "--skip", "local.*", "--format", "json"
    )
    seconds = time.monotonic() - started
    checks = checks_of(proc)
    bad = {key: c["message"] for key, c in checks.items() if c["status"] in ("FAIL", "ERROR")}
    assert not bad, f"{len(bad)} failure(s), e.g. {list(bad.items())[:3]}"
    assert proc.returncode == 0, proc.stderr[-2000:]
    network = {key: c for key, c in checks.items() if key[0].startswith("network.")}
    judged_by_pair = {("network.rtt", None), ("network.throughput", None)}
    assert {
        key: c["message"] for key, c in network.items() if c["status"] != "PASS" and key not in judged_by_pair
    } == {}
    rtt, throughput = checks[("network.rtt", None)], checks[("network.throughput", None)]
    assert rtt["data"]["slow_nodes"] == [] and rtt["data"]["unmeasured"] == [], rtt["message"]
    assert throughput["data"]["slow_senders"] == throughput["data"]["slow_receivers"] == [], throughput["message"]
    assert len(rtt["data"]["pairs"]) == 8 * NODES // 2  # 8 rounds of disjoint pairs, not every pair in N-1 rounds
    assert rtt["data"]["rounds"] == 8
    tcp = checks[("network.tcp", None)]
    assert tcp["data"]["pairs"] == NODES * (NODES - 1)
    assert tcp["data"]["connections"] == 2 * NODES * (NODES - 1)  # the master port and an ephemeral port
    probes = [checks[("network.probe", f"node{i}")] for i in range(1, NODES + 1)]
    assert all(p["data"]["ready_after"] is not None for p in probes)  # every probe listened before any connected
    print(
        f"\n{NODES} nodes: started in {big_cluster.seconds_to_start:.0f} s; core and network stages in "
        f"{seconds:.0f} s; slowest probe listening after {max(p['data']['ready_after'] for p in probes):.1f} s; "
        f"{rtt['message']}; {throughput['message']}"
    )
