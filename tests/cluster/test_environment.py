"""What users' jobs see on the test cluster: a launch environment that names a missing interface, and the interface
gloo's ranks really bound to. One run of the core and collectives stages, with the fault put on the node for real
and removed afterwards. (A package at another version on one node is a row of tests/faults.)"""

from __future__ import annotations

import pytest
from harness import checks_of, clustercheck, ssh_client, ssh_run

pytestmark = pytest.mark.cluster


def test_a_bad_launch_interface_and_gloos_interface_are_named(torch_cluster, tmp_path):
    node3 = torch_cluster.node("node3")
    with ssh_client(torch_cluster, node3) as c3:
        # node3's /etc/environment points GLOO_SOCKET_IFNAME at an interface it does not have; restored afterwards.
        status, out = ssh_run(
            c3, "cp -p /etc/environment /etc/environment.orig && echo GLOO_SOCKET_IFNAME=eth9 >> /etc/environment"
        )
        assert status == 0, out
        try:
            proc = clustercheck(
                torch_cluster,
                tmp_path,
                "--format",
                "json",
                "--skip",
                "local.*",
                "--only",
                "collectives",
                "--master-port",
                "29631",
            )
        finally:
            ssh_run(c3, "mv /etc/environment.orig /etc/environment")
    checks = checks_of(proc)
    assert proc.returncode == 1, proc.stderr[-2000:]

    launch = checks[("env.launch", "node3")]
    assert launch["status"] == "FAIL", launch
    assert "/etc/environment sets GLOO_SOCKET_IFNAME=eth9: no interface eth9 on this node" in launch["message"]
    assert launch["message"].startswith("node3: ")
    assert checks[("env.launch", "node1")]["status"] == "PASS"

    # clustercheck's own job chose the cluster interface itself, whatever /etc/environment says.
    for node in torch_cluster.nodes:
        result = checks[("transport.network", node.name)]
        interface = result["data"]["cluster_interface"]
        assert result["status"] == "PASS", result
        assert result["data"]["interfaces"] == [interface]
        assert result["message"].startswith(f"{node.name}: gloo ranks bound to {interface} ({node.address}")
    assert checks[("allreduce", None)]["status"] == "PASS"
