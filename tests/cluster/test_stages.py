"""The multi-node stages of `clustercheck run` on the 3-node test cluster, gloo on CPUs, failures made for real:
a firewall on one node, a node's ranks killed mid-job, Ctrl-C mid-job, a node whose training diverges.

Every test restores the shared session cluster (firewall rules, /etc/environment) at the end. The torch jobs
run one rank per node (--nproc-per-node 1): the test machine has two cores for all three nodes.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import (
    DDP_RANKS,
    checks_of,
    clustercheck,
    clustercheck_command,
    leftovers,
    ssh_client,
    ssh_run,
    torch_fault_on_node,
)

pytestmark = pytest.mark.cluster
CHAIN = "CLUSTERCHECK-STAGES-TEST"


def test_a_firewall_on_one_node_fails_the_network_stage_and_no_torch_job_starts(torch_cluster, tmp_path):
    """node3 drops new TCP connections from the other nodes to any port but SSH, like a default-deny firewall."""
    node3 = torch_cluster.node("node3")
    sources = ",".join(n.address for n in torch_cluster.nodes if n.name != "node3")
    with ssh_client(torch_cluster, node3) as client:
        status, out = ssh_run(
            client,
            "command -v iptables >/dev/null || (apt-get update -qq && "
            "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iptables >/dev/null)",
        )
        assert status == 0, out
        status, out = ssh_run(
            client,
            f"iptables -N {CHAIN} && iptables -I INPUT -j {CHAIN} && "
            f"iptables -A {CHAIN} -p tcp -s {sources} -m conntrack --ctstate NEW ! --dport 22 -j DROP",
        )
        assert status == 0, out
        try:
            proc = clustercheck(
                torch_cluster, tmp_path, "--format", "json", "--skip", "local.*", "--master-port", "29651", timeout=300
            )
        finally:
            ssh_run(client, f"iptables -D INPUT -j {CHAIN}; iptables -F {CHAIN}; iptables -X {CHAIN}")
        assert ssh_run(client, f"iptables -S | grep -c {CHAIN}")[1].strip() == "0"  # restored
    assert proc.returncode == 1, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    failures = [c for c in report["checks"] if c["name"] == "network.tcp" and c["status"] == "FAIL"]
    assert sorted((c["data"]["from"], c["data"]["to"]) for c in failures) == [("node1", "node3"), ("node2", "node3")]
    for c in failures:
        assert c["message"].startswith(f"{c['data']['from']} -> node3") and c["data"]["cause"] == "firewall"
    checks = checks_of(proc)
    for name in ("allreduce", "allgather", "broadcast", "allreduce.bandwidth", "ddp_equivalence"):
        skipped = checks[(name, None)]
        assert skipped["status"] == "SKIP", skipped
        assert "network stage failed, so no torch job was started" in skipped["message"]
    for node in torch_cluster.nodes:  # no torchrun was started anywhere: no command, no log came back
        host_dir = tmp_path / "run" / "hosts" / node.name
        assert (host_dir / "network.json").exists()
        assert not list(host_dir.glob("*.command")) and not (host_dir / "collectives").exists()
    assert leftovers(torch_cluster) == {}


# Only the multi-node DDP stage, one rank per node, JSON on stdout.
DDP_ONLY = ("--format", "json", "--skip", "local.*", "--only", "ddp", "--nproc-per-node", "1")
RANKS = DDP_RANKS
LONG_DDP = str(Path(__file__).parent / "clustercheck_long_ddp.py")


@contextlib.contextmanager
def long_ddp_job(cluster, tmp_path, master_port: int, timeout: int, *extra: str):
    """`clustercheck run --only ddp` (plus EXTRA arguments) with a DDP job that would run for minutes, yielded once
    its ranks train on every node, with an SSH client per node; clustercheck is killed at the end if it still
    runs."""
    command = clustercheck_command(
        cluster, tmp_path, *DDP_ONLY, "--timeout", str(timeout), "--master-port", str(master_port), *extra
    )
    # clustercheck's own command line, with a DDP job that would run for minutes unless something stops it.
    command = [sys.executable, LONG_DDP, "1000000", *command[1:]]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    clients = {node.name: ssh_client(cluster, node) for node in cluster.nodes}
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if all(ssh_run(client, RANKS, timeout=30)[1].strip() for client in clients.values()):
                break
            time.sleep(0.3)
        assert proc.poll() is None, "clustercheck ended before the DDP ranks ran on every node"
        time.sleep(2)  # well inside the training loop
        yield proc, clients
    finally:
        if proc.poll() is None:
            proc.kill()
        for client in clients.values():
            client.close()


def test_a_node_whose_ranks_are_killed_mid_job_is_named_and_every_node_is_stopped(torch_cluster, tmp_path):
    timeout = 150
    with long_ddp_job(torch_cluster, tmp_path, 29661, timeout) as (proc, clients):
        killed_at = time.monotonic()
        _, out = ssh_run(clients["node2"], f"for p in $({RANKS}); do kill -9 $p && echo killed $p; done")
        assert "killed" in out, out
        stdout, stderr = proc.communicate(timeout=timeout + 60)
        reported_after = time.monotonic() - killed_at
    assert proc.returncode == 1, stderr[-2000:]
    assert reported_after < 45, f"the killed node was reported {reported_after:.0f} s later"
    ddp = {c["name"]: c for c in json.loads(stdout)["checks"]}["ddp_equivalence"]
    assert ddp["status"] == "FAIL"
    assert ddp["data"]["first_failed_node"] == "node2", ddp
    assert "torchrun failed on node2 first" in ddp["message"] and "every node's job was stopped" in ddp["message"]
    assert ddp["data"]["error_lines"]
    assert leftovers(torch_cluster) == {}  # no torchrun, rank, marker or work directory on any node


def test_ctrl_c_during_the_multi_node_job_stops_it_on_every_node(torch_cluster, tmp_path):
    with long_ddp_job(torch_cluster, tmp_path, 29681, 150) as (proc, _):
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=90)
    assert proc.returncode == 2, stderr[-2000:]
    assert "interrupted" in stderr and "Traceback" not in stderr
    assert leftovers(torch_cluster) == {}  # the torchrun agents and ranks of all three nodes are gone


def test_a_node_whose_training_diverges_fails_ddp_equivalence_naming_it(torch_cluster, tmp_path):
    """node3's torch environment trains with a 10% larger learning rate (a module loaded at interpreter start from
    its site-packages, as a patched or broken library would be): seen only by the ranks on node3."""
    with torch_fault_on_node(torch_cluster, torch_cluster.node("node3"), "lr"):
        proc = clustercheck(torch_cluster, tmp_path, *DDP_ONLY, "--master-port", "29671", timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    ddp = checks_of(proc)[("ddp_equivalence", None)]
    assert ddp["status"] == "FAIL", ddp["message"]
    assert "rank 2 (node3)" in ddp["message"]
    assert ddp["data"]["world_size"] == 3 and ddp["data"]["backend"] == "gloo"
    assert ddp["data"]["max_abs_param_diff"] > 1e-6
    assert checks_of(proc)[("network.tcp", None)]["status"] == "SKIP"  # --only ddp
