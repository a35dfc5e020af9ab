"""The network probe on the Docker test cluster: real hosts, real TCP, a real firewall and real routes.

The probe is copied to every node over SSH (paramiko, host keys checked) and run on all nodes at once,
as the orchestration will run it. Every change a test makes to a node (firewall rules, routes,
/etc/hosts) is undone afterwards: the cluster is shared with the rest of the suite.
"""

from __future__ import annotations

import json
import shlex
import threading

import paramiko
import pytest
from harness import SWEEP, clustercheck, freeze_after_go, on

from clustercheck.checks import network
from clustercheck.model import Status
from clustercheck.stages import bundle
from clustercheck.stages import network as stage

pytestmark = pytest.mark.cluster

PROBE_DIR = "/tmp/clustercheck-netprobe-test"
PROBE = bundle.path(PROBE_DIR)
MASTER_PORT = 29500
CHAIN = "CLUSTERCHECK-TEST"  # our own iptables chain, so cleanup removes exactly what we added


def run(client: paramiko.SSHClient, command: str, timeout: float = 60, stdin: str | None = None) -> str:
    given, stdout, stderr = client.exec_command(command, timeout=timeout)
    if stdin is not None:
        given.write(stdin)
    given.channel.shutdown_write()
    out = stdout.read().decode()
    status = stdout.channel.recv_exit_status()
    assert status == 0, f"{command!r} exited {status}: {stderr.read().decode()}"
    return out


@pytest.fixture(scope="module")
def nodes(bare_cluster):
    """name -> (address, SSH client) with the probe uploaded and /etc/hosts listing every node."""
    clients = {}
    for node in bare_cluster.nodes:
        client = paramiko.SSHClient()
        client.load_host_keys(bare_cluster.known_hosts)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect(
            node.address,
            username="root",
            key_filename=bare_cluster.key_file,
            timeout=10,
            allow_agent=False,
            look_for_keys=False,
        )
        clients[node.name] = (node.address, client)
    hosts_lines = "".join(f"{addr} {name}\n" for name, (addr, _) in clients.items())
    saved_hosts = {}
    for _name, (_, client) in clients.items():
        run(client, f"mkdir -p {PROBE_DIR}")
        with client.open_sftp() as sftp, sftp.open(PROBE, "wb") as fh:
            fh.write(bundle.bundle())
        saved_hosts[_name] = run(client, "cat /etc/hosts")
        # What the setup playbook does: every node knows every node's cluster address by name.
        kept = "".join(line + "\n" for line in saved_hosts[_name].splitlines() if not line.endswith(tuple(clients)))
        write_hosts(client, kept + hosts_lines)
    yield clients
    for name, (_, client) in clients.items():
        write_hosts(client, saved_hosts[name])
        run(client, f"rm -rf {PROBE_DIR}")
        client.close()


def write_hosts(client: paramiko.SSHClient, text: str) -> None:
    # /etc/hosts is bind-mounted by Docker: rewrite it in place rather than replacing the file.
    run(client, f"printf %s {shlex.quote(text)} > /etc/hosts")


def mesh(nodes, duration: float = 5) -> tuple[list, dict]:
    peers = [network.Peer(name, addr) for name, (addr, _) in nodes.items()]
    ports = [MASTER_PORT, stage.pick_ephemeral_port()]
    listed = stage.peer_list(peers)
    records, errors = {}, {}

    def probe(name: str, client: paramiko.SSHClient) -> None:
        command = ["python3", PROBE, "netprobe", *stage.mesh_args(name, ports, duration)]
        try:
            records[name] = json.loads(run(client, shlex.join(command), timeout=duration + 30, stdin=listed))
        except Exception as exc:
            errors[name] = str(exc)

    threads = [threading.Thread(target=probe, args=(name, client)) for name, (_, client) in nodes.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results = network.evaluate(records, peers, master="node1", master_port=MASTER_PORT, errors=errors)
    return results, records


def by_name(results, name):
    return [r for r in results if r.name == name]


def test_a_healthy_cluster_passes_every_network_check(nodes):
    results, records = mesh(nodes)
    measured = {"network.rtt", "network.throughput"}  # measured only with --perf-port, which this probe omits
    assert [r for r in results if r.status is not Status.PASS and r.name not in measured] == []
    assert {r.status for r in results if r.name in measured} == {Status.SKIP}
    assert {r.name for r in results} == {
        "network.probe",
        "network.master_port",
        "network.listen",
        "network.tcp",
        "network.resolve",
        "network.mtu",
        *measured,
    }
    tcp = by_name(results, "network.tcp")[0]
    assert tcp.data["pairs"] == 6 and tcp.data["connections"] == 12
    assert all(r["interface"] == "eth0" and r["mtu"] for r in records.values())
    # All done well before the deadline: the probes end as soon as every connection in and out is made.
    assert max(r["seconds"] for r in records.values()) < 4


@pytest.fixture
def node3_firewall(nodes):
    """node3 drops new TCP connections from node1 and node2 to any port but SSH, like a default-deny firewall."""
    _, client = nodes["node3"]
    run(
        client,
        "command -v iptables >/dev/null || (apt-get update -qq && "
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iptables >/dev/null)",
        timeout=300,
    )
    sources = ",".join(addr for name, (addr, _) in nodes.items() if name != "node3")
    run(client, f"iptables -N {CHAIN} && iptables -I INPUT -j {CHAIN}")
    try:
        run(client, f"iptables -A {CHAIN} -p tcp -s {sources} -m conntrack --ctstate NEW ! --dport 22 -j DROP")
        yield
    finally:
        run(client, f"iptables -D INPUT -j {CHAIN}; iptables -F {CHAIN}; iptables -X {CHAIN}")


def test_a_node_whose_firewall_drops_cluster_traffic_is_named_with_the_pairs(nodes, node3_firewall):
    results, _ = mesh(nodes, duration=5)
    failures = [r for r in by_name(results, "network.tcp") if r.status is Status.FAIL]
    assert sorted((r.data["from"], r.data["to"]) for r in failures) == [("node1", "node3"), ("node2", "node3")]
    for r in failures:
        assert r.message.startswith(f"{r.data['from']} -> node3")
        assert r.data["cause"] == "firewall"
        assert "timed out" in r.message and "no node reaches node3" in r.message
        assert "On node3, allow TCP" in r.remediation
    # Traffic node3 starts is answered: only its inbound side is blocked.
    assert not [r for r in failures if r.data["from"] == "node3"]


def test_a_missing_route_is_reported_as_routing(nodes):
    _, node1 = nodes["node1"]
    node2_addr = nodes["node2"][0]
    run(node1, f"ip route add unreachable {node2_addr}/32")
    try:
        results, _ = mesh(nodes, duration=4)
    finally:
        run(node1, f"ip route del unreachable {node2_addr}/32")
    pair = next(r for r in by_name(results, "network.tcp") if r.data.get("from") == "node1" and r.data["to"] == "node2")
    assert pair.status is Status.FAIL
    assert pair.data["cause"] == "routing"
    assert "node1 -> node2" in pair.message and "ip route get" in pair.remediation


def test_a_hostname_mapped_to_loopback_fails_on_the_node_that_maps_it(nodes):
    # Ubuntu's installer writes "127.0.1.1 <hostname>": torch on that node would then advertise loopback.
    _, node2 = nodes["node2"]
    before = run(node2, "cat /etc/hosts")
    write_hosts(node2, "127.0.1.1 node2\n" + before)
    try:
        results, _ = mesh(nodes)
    finally:
        write_hosts(node2, before)
    failing = [r for r in by_name(results, "network.resolve") if r.status is Status.FAIL]
    assert [r.host for r in failing] == ["node2"]
    assert "node2 resolves to loopback 127.0.1.1" in failing[0].message
    assert "127.0.1.1" in failing[0].remediation


def test_a_node_frozen_during_the_rounds_costs_its_own_pairs_and_the_stage_goes_on(bare_cluster, tmp_path):
    """node3's probe stopped (SIGSTOP) 0.3 s after it got the go signal, in its first rounds (at 3 nodes the
    connections and the rounds take about a second: the stop is made inside the node, no docker round trip late):
    the stage waits STRAGGLER_GRACE past the moment every probe's rounds were to end (and the other probes' end),
    not node3's probe's own time limit, names node3's probe as frozen and judges the other pairs. The whole node
    paused (docker pause) is benchmarks/network_scale.py's case at 64 nodes, where the rounds take long enough for
    it."""
    node3 = bare_cluster.node("node3")
    done, frozen = threading.Event(), []
    freezer = threading.Thread(
        target=freeze_after_go, args=(node3.container, "node3", 0.3, done, frozen), kwargs={"whole_node": False}
    )
    freezer.start()
    try:
        proc = clustercheck(
            bare_cluster,
            tmp_path,
            "--only",
            "network",
            "--skip",
            "local.*",
            "--format",
            "json",
            "--master-port",
            "29637",
        )
    finally:
        done.set()
        freezer.join()
        on(node3, SWEEP, check=False)  # what the run could not clean up on the frozen node (it ends by itself later)
    assert frozen, f"node3's probe never had the go signal:\n{proc.stderr[-2000:]}"
    report = json.loads(proc.stdout)
    probe = {c["host"]: c for c in report["checks"] if c["name"] == "network.probe"}
    assert probe["node3"]["status"] == "ERROR" and "the node froze" in probe["node3"]["message"], probe["node3"]
    assert probe["node1"]["status"] == probe["node2"]["status"] == "PASS", probe
    tcp = next(c for c in report["checks"] if c["name"] == "network.tcp")
    assert tcp["status"] == "PASS", tcp  # node1 and node2 reach each other; node3's connections are not judged
    # The probe's own time limit at 3 nodes (the ready wait, the connect window, the rounds): the stage ended long
    # before it, STRAGGLER_GRACE after the other probes.
    peers = [network.Peer(n.name, n.address) for n in bare_cluster.nodes]
    limit = stage.ready_timeout(3) + stage.GO_SLACK + stage.connect_window(10.0, 3)
    limit += stage.perf_time(stage.round_count(peers, 8)) + 30
    seconds = next(s["duration_s"] for s in report["stages"] if s["name"] == "network")
    assert seconds < limit - 20, f"the network stage took {seconds} s, node3's probe's time limit is {limit} s"


def test_rails_the_probe_runs_over_the_training_interface_and_own_names_on_every_network_pass(bare_cluster, tmp_path):
    """Two extra Docker networks ("rails") on every node: Docker writes a hosts line per network for the node's own
    name, so it resolves to its cluster address first, then its rail addresses (network.resolve PASSes, naming
    them). /etc/environment's GLOO_SOCKET_IFNAME=eth1 moves the training traffic to rail 1: the probe runs over it
    (every node's path in the data, the master port also tried at node1's cluster address), and a tbf on node3's
    eth1 (10 Mbit/s) is named there. Everything is removed afterwards."""
    import subprocess

    rails = [f"{bare_cluster.name}-trainnet-rail{r}" for r in (1, 2)]
    env_before = {}
    try:
        for rail in rails:
            subprocess.run(["docker", "network", "create", "--label", "clustercheck-test=rails", rail], check=True)
            for node in bare_cluster.nodes:
                subprocess.run(["docker", "network", "connect", rail, node.container], check=True)
        for node in bare_cluster.nodes:
            env_before[node.name] = on(node, "cat /etc/environment 2>/dev/null || true").stdout
            on(node, "echo GLOO_SOCKET_IFNAME=eth1 >> /etc/environment")
        node3 = bare_cluster.node("node3")
        on(node3, "tc qdisc add dev eth1 root tbf rate 10mbit burst 32kbit latency 400ms")
        proc = clustercheck(bare_cluster, tmp_path, "--only", "network", "--format", "json", "--master-port", "29639")
    finally:
        for node in bare_cluster.nodes:
            on(node, "tc qdisc del dev eth1 root 2>/dev/null || true", check=False)
            if node.name in env_before:
                on(node, f"printf %s {shlex.quote(env_before[node.name])} > /etc/environment", check=False)
            for rail in rails:
                subprocess.run(["docker", "network", "disconnect", rail, node.container], capture_output=True)
        for rail in rails:
            subprocess.run(["docker", "network", "rm", rail], capture_output=True)
    checks = {(c["name"], c["host"]): c for c in json.loads(proc.stdout)["checks"]}
    for node in bare_cluster.nodes:
        resolve = checks[("network.resolve", node.name)]
        assert resolve["status"] == "PASS", resolve
        assert len(resolve["data"]["also"][node.name]) == 2  # its two rail addresses, after the cluster address
    tcp = checks[("network.tcp", None)]
    assert tcp["status"] == "PASS", tcp
    assert {p["interface"] for p in tcp["data"]["paths"].values()} == {"eth1"}
    assert "GLOO_SOCKET_IFNAME=eth1" in tcp["message"] and "the rendezvous also tried at node1" in tcp["message"]
    throughput = checks[("network.throughput", None)]
    assert throughput["status"] in ("WARN", "FAIL") and "node3" in throughput["message"], throughput
