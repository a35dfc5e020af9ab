"""A stalled torch job explained by its ranks' connections: the rows of /proc/<pid>/net/tcp{,6} read on each node
(remote/heartbeats.py --sockets), decoded (facts/sockets.py), joined across nodes (checks/waits.py), told in the
stall's finding by the runner before the job is stopped.

The recorded rows (tests/unit/data/proc/, README.md there says how) are the DDP ranks of the torch test cluster
while node1's firewall dropped new connections to 32768-60999 from the other nodes: node2's and node3's ranks sat in
SYN_SENT to node1's rank's listening port 34013."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from test_pipeline import NAMES, Cluster, _waits_until_stopped, by_key, is_torch_job

from clustercheck.checks import waits
from clustercheck.facts import sockets
from clustercheck.inventory import Node
from clustercheck.model import Status
from clustercheck.remote import heartbeats
from clustercheck.selection import Selection
from clustercheck.stages import launch
from clustercheck.transport import CommandResult

DATA = Path(__file__).parent / "data" / "proc"
ADDRESSES = {f"node{i}": {f"172.30.81.1{i}"} for i in (1, 2, 3)}


def rank_rows(node: str) -> list[str]:
    """The rank's own rows of a recorded capture: its heartbeat, its fds' sockets, then /proc/<pid>/net/tcp and
    tcp6 as `cat` printed them."""
    _beat, fds, *tables = (DATA / f"ddp-rank-sockets-node1-drops-{node}.txt").read_text().splitlines()
    inodes = {fd[len("socket:[") : -1] for fd in fds.split()}
    return heartbeats.own_rows("\n".join(tables), inodes)


def test_a_row_is_decoded_as_the_kernel_prints_it():
    (waiting,) = [s for s in sockets.parse_rows(rank_rows("node2")) if s.state == "SYN_SENT"]
    assert (waiting.local, waiting.local_port) == ("172.30.81.12", 51820)
    assert (waiting.remote, waiting.remote_port) == ("172.30.81.11", 34013)
    (listening,) = [s for s in sockets.parse_rows(rank_rows("node1")) if s.state == "LISTEN"]
    assert listening.local_port == 34013
    mapped = "1: 0000000000000000FFFF00000C511EAC:8100 0000000000000000FFFF00000B511EAC:733C 01 00000000:00000000"
    mapped += " 00:00000000 00000000     0        0 3295524 1 000000004c2bdf5a 20 4 14 24 -1"  # node2's tcp6, as read
    decoded = sockets.parse_row(mapped)
    assert decoded is not None and decoded.remote == "172.30.81.11" and decoded.remote_port == 29500
    assert sockets.parse_row("  sl  local_address rem_address   st tx_queue rx_queue") is None


def test_ranks_waiting_to_connect_name_the_node_that_listens_and_drops():
    rows = {node: [rank_rows(node)] for node in NAMES}
    nodes, said, data = waits.explain(rows, ADDRESSES)
    assert nodes == ("node1",)
    assert said.startswith("node2 and node3 wait to connect to node1:34013 (a port node1's rank listens on)")
    assert "node1 drops or rejects it" in said
    assert data["waits"][0]["from"] == ["node2", "node3"] and data["waits"][0]["listening"] is True
    assert "On node1" in data["fix"] and "ip_local_port_range" in data["fix"]
    rule = (
        "-A CLUSTERCHECK-FAULTS -s 172.30.81.12/32 -p tcp -m tcp --dport 32768:60999 -m conntrack --ctstate NEW -j DROP"
    )
    _, quoted, _ = waits.explain(rows, ADDRESSES, {"node1": (rule,)})
    assert f"node1's rule covering it: `{rule}`" in quoted


def test_no_rank_waiting_to_connect_explains_nothing():
    assert waits.explain({"node1": [rank_rows("node1")]}, ADDRESSES) is None


def test_the_program_reads_the_ranks_own_sockets(tmp_path):
    """heartbeats --sockets on this machine, with a heartbeat naming this test's own process: its listener's row
    comes back, decoded as LISTEN on its port."""
    beats = tmp_path / "ddp" / "heartbeat"
    beats.mkdir(parents=True)
    (beats / "rank-0.json").write_text(json.dumps({"step": 0, "phase": "starting", "pid": os.getpid()}))
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        command = launch.progress_command(sys.executable, str(tmp_path), "ddp", sockets=True)
        proc = subprocess.run(command, capture_output=True, text=True, check=True)
        port = listener.getsockname()[1]
    found = sockets.parse_rows(json.loads(proc.stdout)["0"]["tcp"])
    assert any(s.state == "LISTEN" and s.local_port == port for s in found)


def test_a_hang_every_node_shares_is_named_by_its_connections_before_the_job_is_stopped(tmp_path):
    """Every rank waits at step 0; asked for their sockets, node2's and node3's ranks show SYN_SENT to node1's
    listening port: the finding names node1 and the fix is its firewall's, not the rank logs."""
    asked = []

    def node(transport, command, timeout):
        if is_torch_job(command):
            return _waits_until_stopped(transport, timeout)
        if "heartbeat" in " ".join(command):
            beat = {"step": 0, "phase": "starting", "age": 0.4, "cpu": 1.0}
            if "--sockets" in command:
                asked.append(transport.host)
                beat["tcp"] = rank_rows(transport.host)
            return answer({"0": beat})
        return None

    cluster = Cluster(behaviour=dict.fromkeys(NAMES, node))
    cluster.nodes = [Node(name=n, address=next(iter(ADDRESSES[n]))) for n in NAMES]
    outcome = cluster.run(
        tmp_path, selection=Selection(only=("ddp",), skip=("local.*",)), job_timeout=120, stall_timeout=5
    )
    ddp = by_key(outcome.results)[("ddp_equivalence", None)]
    assert ddp.status is Status.FAIL and sorted(asked) == list(NAMES)
    assert "node2 and node3 wait to connect to node1:34013" in ddp.message
    assert ddp.data["stalled_nodes"] == ["node1"]
    assert ddp.remediation.startswith("On node1")


def answer(value) -> CommandResult:
    return CommandResult(0, json.dumps(value) + "\n", "")
