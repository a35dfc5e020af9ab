"""Hangs on the 3-node test cluster: a node frozen during the DDP job (its container paused, as a machine that
stops answering), named alone by the progress watchdog; the other nodes left clean; nothing of clustercheck's
left on the frozen node once it comes back and its job's deadline has passed."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from harness import LEFTOVERS, ssh_client, ssh_run
from test_stages import long_ddp_job

pytestmark = pytest.mark.cluster
STALL = 20  # --stall-timeout
TIMEOUT = 60  # --timeout: the DDP job's deadline
# What a node keeps running of clustercheck's (LEFTOVERS without the work directory, which only a later run or
# the operator removes from a node that could not be reached).
PROCESSES = LEFTOVERS.replace("ls -d /tmp/clustercheck-* 2>/dev/null; ", "")
NODE_GRACE, KILL_AFTER = 30, 10  # transport's: how long after its deadline a command on a node ends by itself


def test_a_frozen_node_is_named_alone_and_ends_its_processes_after_the_deadline(torch_cluster, tmp_path):
    node2 = torch_cluster.node("node2")
    with long_ddp_job(torch_cluster, tmp_path, 29701, TIMEOUT, "--stall-timeout", str(STALL)) as (proc, clients):
        time.sleep(6)  # a heartbeat poll (every 5 s) has seen node2's ranks
        subprocess.run(["docker", "pause", node2.container], check=True, capture_output=True)
        frozen_at = time.monotonic()
        try:
            stdout, stderr = proc.communicate(timeout=300)
            reported_after = time.monotonic() - frozen_at
        finally:
            subprocess.run(["docker", "unpause", node2.container], check=False, capture_output=True)
        others = {
            name: ssh_run(client, PROCESSES + "; ls -d /tmp/clustercheck-* 2>/dev/null; true", timeout=60)[1]
            for name, client in clients.items()
            if name != "node2"
        }
    assert proc.returncode == 1, stderr[-2000:]
    ddp = {c["name"]: c for c in json.loads(stdout)["checks"]}["ddp_equivalence"]
    assert ddp["status"] == "FAIL"
    assert ddp["data"]["stalled_nodes"] == ["node2"], ddp["message"]
    # Named within 60 s of the freeze plus the stall timeout; the run then tries the frozen node's stop and
    # cleanup (CLEANUP_TIMEOUT, 15 s each) before it ends.
    assert reported_after < 60 + STALL + 2 * 15, f"the run ended {reported_after:.0f} s after the freeze: {ddp}"
    assert ddp["data"]["progress"]["node2"]["last_seen_s"] < STALL + 10, ddp["message"]
    assert "node node2 stopped making progress at step" in ddp["message"], ddp["message"]
    assert "its SSH connection does not answer" in ddp["message"]
    assert "node1" not in ddp["message"].split("; the other nodes")[0]
    assert "could not stop the processes started on node2" in stderr, stderr[-2000:]
    assert "node1" not in stderr.split("could not stop")[-1] and "node3" not in stderr.split("could not stop")[-1]
    assert others == {"node1": "", "node3": ""}  # the nodes that answered were cleaned up, work directories too

    # node2 is back: what clustercheck started there ends by itself once the job's deadline (and its grace) passed.
    with ssh_client(torch_cluster, node2) as client:
        try:
            deadline = frozen_at + TIMEOUT + NODE_GRACE + KILL_AFTER + 30
            left = ssh_run(client, PROCESSES, timeout=60)[1].strip()
            while left and time.monotonic() < deadline:
                time.sleep(2)
                left = ssh_run(client, PROCESSES, timeout=60)[1].strip()
            assert left == "", f"still running on node2 after the job's deadline:\n{left}"
        finally:
            ssh_run(client, "rm -rf /tmp/clustercheck-*")  # the work directory no one could remove
