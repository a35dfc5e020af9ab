"""The network probe worker's own logic: who holds a port, and the probe on loopback for real."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from clustercheck.checks import netperf, network
from clustercheck.model import Status
from clustercheck.remote import mesh, netinfo
from clustercheck.remote import rounds as perf
from clustercheck.stages import bundle
from clustercheck.stages import network as stage

PROC_NET_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 18211 1 0
   1: 0100007F:7274 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 99123 1 0
   2: 0B521EAC:7274 0C521EAC:C350 01 00000000:00000000 00:00000000 00000000     0        0 99555 1 0
"""


def test_listening_inodes_reads_only_listening_sockets_on_the_port():
    assert netinfo.listening_inodes(PROC_NET_TCP, 29300) == {"99123"}  # 0x7274; the established one is not
    assert netinfo.listening_inodes(PROC_NET_TCP, 22) == {"18211"}
    assert netinfo.listening_inodes(PROC_NET_TCP, 80) == set()


def test_port_holders_names_a_real_process():
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
            "print(s.getsockname()[1], flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(holder.stdout.readline())
        holders = netinfo.port_holders(port)
        assert [h["pid"] for h in holders] == [holder.pid]
        assert "time.sleep(60)" in holders[0]["command"]
    finally:
        holder.kill()
        holder.wait()


def tmp_dir() -> str:
    return tempfile.mkdtemp(prefix="clustercheck-test-")


def free_port() -> int:
    """A port free on every loopback address the tests' "nodes" listen on (127.0.0.1 to .4), not on the first only:
    a port the kernel hands out on 127.0.0.1 can be held on 127.0.0.2 by a connection of another test's process, and
    a listener there then fails to open."""
    for _ in range(50):
        with contextlib.ExitStack() as held:
            first = held.enter_context(socket.socket())
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            try:
                for address in set(FOUR.values()) - {"127.0.0.1"}:
                    held.enter_context(socket.socket()).bind((address, port))
            except OSError:
                continue
            return port
    raise AssertionError("no port free on 127.0.0.1 to 127.0.0.4 in 50 tries")


def start_probe(argv: list[str], peers: list[network.Peer]) -> subprocess.Popen:
    """A probe started as the stage starts it: the node list on its standard input."""
    with tempfile.TemporaryFile() as listed:
        listed.write(stage.peer_list(peers).encode())
        listed.seek(0)
        return subprocess.Popen(argv, stdin=listed, stdout=subprocess.PIPE, text=True)


def run_mesh(names_addrs: dict[str, str], ports: list[int], duration: float, only: list[str] | None = None):
    probe = bundle.write(tmp_dir())
    peers = [network.Peer(n, a) for n, a in names_addrs.items()]
    procs = {
        name: start_probe([sys.executable, probe, "netprobe", *stage.mesh_args(name, ports, duration)], peers)
        for name in (only or names_addrs)
    }
    records = {}
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=duration + 20)
        assert proc.returncode == 0
        records[name] = json.loads(out)
    return records, peers


# Three "nodes" on three loopback addresses: real sockets, real connections.
LOOPBACK = {"localhost": "127.0.0.1", "n2": "127.0.0.2", "n3": "127.0.0.3"}


def test_three_probes_on_loopback_connect_all_pairs_and_exit_early():
    ports = [free_port(), free_port()]
    started = time.monotonic()
    records, peers = run_mesh(LOOPBACK, ports, duration=10)
    assert time.monotonic() - started < 5  # they stop as soon as every connection is made, not at the deadline
    results = network.evaluate(records, peers, master="localhost", master_port=ports[0])
    tcp = [r for r in results if r.name == "network.tcp"]
    assert [r.status for r in tcp] == [Status.PASS]
    assert tcp[0].data["connections"] == 12
    assert records["localhost"]["mtu"] and records["localhost"]["interface"] == "lo"
    # What was expected is counted, not listed: 2 connections out and in per peer and port, 3 names each.
    assert records["n2"]["outgoing"] == {"ok": 4, "failed": []}
    assert records["n2"]["incoming"] == {"peers": 4, "others": []}
    assert records["localhost"]["resolve"]["names"] == 3


def test_a_node_whose_probe_never_starts_is_refused_until_the_deadline():
    ports = [free_port(), free_port()]
    records, _ = run_mesh(LOOPBACK, ports, duration=2, only=["localhost", "n2"])
    outs = [o for o in records["localhost"]["outgoing"]["failed"] if o["to"] == "n3"]
    assert {o["result"] for o in outs} == {"refused"}
    assert all(o["attempts"] > 1 for o in outs)  # retried: the peer may just be late
    # each attempt's own source port, for the first ones (what tells a node's own stateless rule: checks/replies.py)
    assert all(len(o["source_ports"]) == min(o["attempts"], mesh.SOURCE_PORTS_KEPT) for o in outs), outs
    assert all(1024 <= p <= 65535 for o in outs for p in o["source_ports"])


def test_a_held_master_port_is_named_with_pid_and_command():
    """Another process listens on the master port: the check names its pid and command line. The holder is a
    process of its own, as on a node: held by the test process itself, the port's socket is also, for a moment,
    in every child the test process forks (its probes), which carry pytest's command line."""
    ports = [free_port(), free_port()]
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); "
            "print('listening', flush=True); time.sleep(60)",
            str(ports[0]),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "listening"
        records, peers = run_mesh({"localhost": "127.0.0.1", "n2": "127.0.0.2"}, ports, duration=2)
    finally:
        holder.kill()
        holder.wait()
    results = network.evaluate(records, peers, master="localhost", master_port=ports[0])
    (port,) = [r for r in results if r.name == "network.master_port"]
    assert port.status is Status.FAIL
    assert "Address already in use" in port.message
    assert f"pid {holder.pid} (" in port.message and "time.sleep(60)" in port.message, port.message


@pytest.mark.parametrize(
    ("listed", "said"),
    [
        (
            "a 127.0.0.1\nnonsense\n",
            "--peers -: line 2: expected NAME ADDRESS [HOSTNAME] [resolves=ADDRESS], not 'nonsense'",
        ),
        ("\n", "--peers -: no node listed"),
        ("b 127.0.0.2\n", "--self a is not among the nodes --peers lists"),
    ],
)
def test_a_bad_node_list_is_a_usage_error(listed, said):
    probe = bundle.write(tmp_dir())
    proc = subprocess.run(
        [sys.executable, probe, "netprobe", "mesh", "--self", "a", "--peers", "-", "--port", "1"],
        input=listed,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert said in proc.stderr and "Traceback" not in proc.stderr


def start_barrier_probe(name: str, peers, ports: list[int], workdir: str, window: float) -> subprocess.Popen:
    probe = bundle.write(workdir)
    barrier = (f"{workdir}/{name}.ready", f"{workdir}/{name}.go", 30.0)
    return start_probe([sys.executable, probe, "netprobe", *stage.mesh_args(name, ports, window, barrier)], peers)


def test_probes_connect_only_after_the_go_signal_so_a_late_node_is_not_a_firewall():
    """Two probes listen and wait; the third starts 3 s later (longer than the connect window). Once all three
    are ready the go signal is given: every pair connects, where a probe without the barrier would time out."""
    workdir = tmp_dir()
    ports = [free_port(), free_port()]
    peers = [network.Peer(n, a) for n, a in LOOPBACK.items()]
    procs = {n: start_barrier_probe(n, peers, ports, workdir, window=2) for n in ("localhost", "n2")}
    time.sleep(3)
    assert not any(os.path.exists(f"{workdir}/{n}.go") for n in LOOPBACK)
    procs["n3"] = start_barrier_probe("n3", peers, ports, workdir, window=2)
    for name in LOOPBACK:  # the controller's two phases: wait for every node's ready file, then go everywhere
        wait = subprocess.run(
            [sys.executable, f"{workdir}/{bundle.FILE}", "netprobe", "wait-ready", f"{workdir}/{name}.ready"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert wait.returncode == 0, wait.stdout
    for name in LOOPBACK:
        subprocess.run(
            [sys.executable, f"{workdir}/{bundle.FILE}", "netprobe", "go", f"{workdir}/{name}.go", "2"], check=True
        )
    records = {n: json.loads(p.communicate(timeout=30)[0]) for n, p in procs.items()}
    assert records["localhost"]["barrier"]["go_after"] >= 3  # it waited, listening, for the late node
    results = network.evaluate(records, peers, master="localhost", master_port=ports[0])
    (tcp,) = [r for r in results if r.name == "network.tcp"]
    assert tcp.status is Status.PASS, tcp.message
    assert tcp.data["connections"] == 12


def test_a_probe_that_gets_no_go_signal_says_so_and_ends():
    workdir = tmp_dir()
    ports = [free_port(), free_port()]
    peers = [network.Peer(n, a) for n, a in LOOPBACK.items()]
    probe = bundle.write(workdir)
    barrier = (f"{workdir}/r", f"{workdir}/g", 1.0)
    out = subprocess.run(
        [sys.executable, probe, "netprobe", *stage.mesh_args("localhost", ports, 2, barrier)],
        input=stage.peer_list(peers),
        capture_output=True,
        text=True,
        timeout=30,
    )
    record = json.loads(out.stdout)
    assert record["barrier"]["no_go"] is True
    assert {o["detail"] for o in record["outgoing"]["failed"]} == {"no go signal from the controller"}
    assert os.path.exists(f"{workdir}/r")


def test_probes_measure_round_trips_and_throughput_of_every_pair_in_rounds():
    workdir = tmp_dir()
    ports = [free_port(), free_port()]
    perf_port = free_port()
    peers = [network.Peer(n, a) for n, a in LOOPBACK.items()]
    probe = bundle.write(workdir)
    procs = {
        n: start_probe(
            [sys.executable, probe, "netprobe", *stage.mesh_args(n, ports, 5), "--perf-port", str(perf_port)], peers
        )
        for n in LOOPBACK
    }
    records = {n: json.loads(p.communicate(timeout=60)[0]) for n, p in procs.items()}
    measured, failed = netperf.perf_pairs(records)
    assert failed == []
    assert sorted(tuple(sorted((p["a"], p["b"]))) for p in measured) == [
        ("localhost", "n2"),
        ("localhost", "n3"),
        ("n2", "n3"),
    ]
    assert all(p["rtt_ms"] > 0 and p["a_to_b"] > 0 and p["b_to_a"] > 0 for p in measured)
    assert [r.status for r in network.perf_checks(records)] == [Status.PASS, Status.PASS]


FOUR = {"n1": "127.0.0.1", "n2": "127.0.0.2", "n3": "127.0.0.3", "n4": "127.0.0.4"}


def perf_in_threads(present: list[str], late: dict[str, float] | None = None):
    """The perf rounds of FOUR's nodes in PRESENT (the others never start), every pair, on real sockets; a node in
    LATE starts that many seconds after the shared start. Returns (node -> {"perf": its entries}, seconds taken)."""
    late = late or {}
    port = free_port()
    rounds = perf.schedule(list(FOUR), None, seed=1)
    opened = {n: mesh.open_listener(FOUR[n], port) for n in present}
    assert all(sock for sock, _ in opened.values()), {n: state for n, (_, state) in opened.items()}
    listeners = {n: sock for n, (sock, _) in opened.items()}
    start = time.monotonic() + 0.5
    results: dict[str, dict] = {}

    def node(name: str) -> None:
        time.sleep(max(0.0, start + late.get(name, 0.0) - time.monotonic()))
        results[name] = {
            "perf": perf.perf_rounds(
                name, FOUR, port, listeners[name], perf.PERF_SECONDS, perf.MEASUREMENTS, rounds, start
            )
        }

    threads = [threading.Thread(target=node, args=(n,)) for n in present]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for listener in listeners.values():
        listener.close()
    return results, time.monotonic() - start


def test_a_missing_node_costs_its_own_pairs_only_and_the_rounds_end_on_time():
    results, seconds = perf_in_threads(["n1", "n2", "n3"])
    measured, failed = netperf.perf_pairs(results)
    assert sorted(tuple(sorted((p["a"], p["b"]))) for p in measured) == [("n1", "n2"), ("n1", "n3"), ("n2", "n3")]
    assert {f["b"] for f in failed} == {"n4"} and len(failed) == 3
    assert seconds < 3 * perf.ROUND_SECONDS + 2  # three rounds, each over by its end at the latest


def test_a_node_behind_the_schedule_skips_to_the_current_round():
    """n1 starts after the first round ended: it skips that round (its partner of that round gives it up at the
    round's end) and measures its later rounds with everyone, instead of holding every later partner up."""
    results, _ = perf_in_threads(list(FOUR), late={"n1": perf.ROUND_SECONDS + 0.5})
    first = results["n1"]["perf"][0]
    assert first["round"] == 0 and first["error"] == "skipped: n1 was behind the schedule (round 0 had ended)"
    partner = first["peer"]
    theirs = next(e for e in results[partner]["perf"] if e["round"] == 0)
    assert "error" in theirs
    measured, _ = netperf.perf_pairs(results)
    pairs = {tuple(sorted((p["a"], p["b"]))) for p in measured}
    assert all(
        tuple(sorted(("n1", e["peer"]))) in pairs for e in results["n1"]["perf"][1:]
    )  # its later rounds, measured
    assert len(pairs) == 5  # every pair but the one n1 missed
