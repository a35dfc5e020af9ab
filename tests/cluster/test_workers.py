"""The torch workers across real hosts: torchrun on each Docker test node, launched over SSH with the command
lines and environments clustercheck.launch builds, gloo over the nodes' cluster interface (eth0).

This is the multi-node path without the orchestration that drives it in `clustercheck run`: the test itself
plays the orchestrator (upload, start every node at once, fetch the records, judge).
"""

from __future__ import annotations

import shlex
import threading

import paramiko
import pytest
import torchenv
from harness import torch_fault_on_node

from clustercheck.checks import collectives, ddp
from clustercheck.model import Status
from clustercheck.stages import bundle, launch

pytestmark = pytest.mark.cluster

PYTHON = torchenv.PYTHON  # the session's torch environment on every node (the torch_cluster fixture)
RUN_DIR = "/tmp/clustercheck-test-run"


def run(client: paramiko.SSHClient, command: str, timeout: float = 300) -> tuple[int, str, str]:
    _, stdout, stderr = client.exec_command(command, timeout=timeout)
    out, err = stdout.read().decode(), stderr.read().decode()
    return stdout.channel.recv_exit_status(), out, err


def parallel(function, items) -> None:
    errors = []

    def call(item):
        try:
            function(item)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(item,)) for item in items]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


@pytest.fixture(scope="module")
def torch_nodes(torch_cluster):
    """node name -> (address, SSH client), each node with torch importable through PYTHON."""
    clients = {node.name: (node.address, torchenv.ssh_client(torch_cluster, node)) for node in torch_cluster.nodes}
    yield clients
    for _, client in clients.values():
        run(client, f"rm -rf {RUN_DIR}")
        client.close()


def job(nodes, worker: str, master_port: int, extra_env=None, worker_args=None):
    """Start WORKER on every node at once, wait for all, return (rank records, world size)."""
    specs = [launch.NodeSpec(name, addr, 0, PYTHON, RUN_DIR) for name, (addr, _) in nodes.items()]
    plans = launch.plan(
        specs,
        worker=worker,
        stage=worker,
        master_port=master_port,
        interface="eth0",
        nproc_override=1,  # three single-rank nodes: the test machine has two cores for all of them
        worker_args=worker_args,
        extra_env=extra_env,
    )
    for plan in plans:
        client = nodes[plan.node.name][1]
        run(client, f"rm -rf {plan.node.run_dir}/{worker} && mkdir -p {plan.node.run_dir}")
        with client.open_sftp() as sftp, sftp.open(bundle.path(plan.node.run_dir), "wb") as fh:
            fh.write(bundle.bundle())
    exits = {}
    parallel(lambda p: exits.__setitem__(p.node.name, run(nodes[p.node.name][1], p.shell(), timeout=240)), plans)
    records = []
    for plan in plans:
        client = nodes[plan.node.name][1]
        records += launch.parse_collected(
            run(client, shlex.join(launch.collect_command("python3", plan.node.run_dir, worker)))[1]
        )[0]
        # Every torchrun and rank is gone once the job ends.
        assert run(client, "pgrep -f 'torch[.]distributed[.]run'")[0] == 1, f"torchrun left running on {plan.node.name}"
    assert {name: e[0] for name, e in exits.items()} == dict.fromkeys(nodes, 0), exits
    return records, launch.world_size(plans)


def test_collectives_across_three_hosts(torch_nodes):
    records, world = job(torch_nodes, "collectives", 29501)
    assert sorted(r["host"] for r in records) == ["node1", "node2", "node3"]
    checks = collectives.evaluate(records, world) + collectives.evaluate_bandwidth(records, world)
    assert [(c.name, c.status) for c in checks] == [
        ("allreduce", Status.PASS),
        ("allgather", Status.PASS),
        ("broadcast", Status.PASS),
        ("allreduce.bandwidth", Status.PASS),
    ]
    assert checks[-1].data["ranks"] == 3 and checks[-1].data["peak_busbw_gbps"] > 0


def test_ddp_across_three_hosts_matches_one_process(torch_nodes):
    records, world = job(torch_nodes, "ddp", 29502)
    result = ddp.evaluate(records, world)
    assert result.status is Status.PASS, result.message
    assert result.data["world_size"] == 3 and result.data["max_abs_param_diff"] < 1e-12


def test_one_host_with_another_learning_rate_fails_ddp_equivalence_naming_it(torch_cluster, torch_nodes):
    with torch_fault_on_node(torch_cluster, torch_cluster.node("node3"), "lr"):
        records, world = job(torch_nodes, "ddp", 29503)
    result = ddp.evaluate(records, world)
    assert result.status is Status.FAIL
    assert "rank 2 (node3)" in result.message and "from step 1" in result.message
    assert result.data["curves_part_at_step"] == 2
