"""What users' jobs see on the test cluster: package drift between nodes, a launch environment that names a
missing interface, and the interface gloo's ranks really bound to. One run of the core and collectives stages,
with the faults put on the nodes for real and removed afterwards."""

from __future__ import annotations

import pytest
from harness import PYTHON, checks_of, clustercheck, ssh_client, ssh_run

pytestmark = pytest.mark.cluster

DRIFTED = "mpmath"  # a dependency of torch, installed on every node of the torch environment
LOCATE_METADATA = (
    f'{PYTHON} -c \'from importlib import metadata; d = metadata.distribution("{DRIFTED}"); '
    'print("META=" + str(d._path) + "/METADATA"); print("VERSION=" + d.version)\''
)


def _value(out: str, key: str) -> str:
    return next(ln[len(key) + 1 :] for ln in out.splitlines() if ln.startswith(key + "="))


def test_package_drift_a_bad_launch_interface_and_gloos_interface_are_named(torch_cluster, tmp_path):
    node2, node3 = torch_cluster.node("node2"), torch_cluster.node("node3")
    with ssh_client(torch_cluster, node2) as c2, ssh_client(torch_cluster, node3) as c3:
        status, out = ssh_run(c2, LOCATE_METADATA)
        assert status == 0, out
        metadata, version = _value(out, "META"), _value(out, "VERSION")
        # node2's mpmath is relabelled 0.0.1 (its METADATA edited, the code unchanged); node3's /etc/environment
        # points GLOO_SOCKET_IFNAME at an interface it does not have. Both restored afterwards.
        status, out = ssh_run(
            c2, f"cp -p {metadata} {metadata}.orig && sed -i 's/^Version: .*/Version: 0.0.1/' {metadata}"
        )
        assert status == 0, out
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
            ssh_run(c2, f"mv {metadata}.orig {metadata}")
            ssh_run(c3, "mv /etc/environment.orig /etc/environment")
    checks = checks_of(proc)
    assert proc.returncode == 1, proc.stderr[-2000:]

    drift = checks[("consistency.packages", None)]
    assert drift["status"] == "WARN", drift
    assert f"{DRIFTED}: node2 has 0.0.1, the others {version}" in drift["message"]
    assert (tmp_path / "run" / "hosts" / "node2" / "packages.txt").read_text().count(f"{DRIFTED}==0.0.1") == 1
    assert f"{DRIFTED}=={version}" in (tmp_path / "run" / "hosts" / "node1" / "packages.txt").read_text()

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
