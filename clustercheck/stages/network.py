"""The network stage: a TCP probe on every node at once (python3 only, no torch), before any torch job.

Every node listens on the master port and an ephemeral port, connects to every other node on both, resolves
every node's hostname and reads its cluster interface's MTU; checks/network.py judges the records.

After the connections, round trip times and TCP throughput (both ways) are measured in rounds of disjoint pairs:
--network-rounds of them (8 by default, so each node is measured with 8 partners whatever the cluster's size;
`all`: every pair, N-1 rounds), paced from the shared deadline so that a missing or slow node costs only its own
pairs. A node slow with most of its partners, or a link far slower than the others, is named.

A barrier keeps a slow start from looking like a firewall: every probe first binds its listeners and reports
ready; only once every node is ready (or the wait for the late ones ran out) does the controller write the go
signal on every node, and connection attempts run until a shared deadline. A node that reported ready late, or
never, is named as such, and its connections are not judged as the network's.
"""

from __future__ import annotations

import ipaddress
import json
import random
import threading
import time

from clustercheck.checks import network, registry
from clustercheck.model import CheckResult, Status
from clustercheck.remote import netprobe
from clustercheck.stages import Context, Member, bundle

NAME = "network"
EPHEMERAL_RANGE = (49152, 60999)  # IANA dynamic ports, below Linux's default ip_local_port_range top
READY_BASE, READY_PER_NODE = 30.0, 1.0  # seconds every probe gets to listen: 30 s, plus 1 s a node
GO_SLACK = 30.0  # the probe waits this much longer for the go file than the controller waits for ready
# Every probe ends by the same paced moment, whatever its partners do: the connect window after the go signal,
# then the rounds (a partner that froze costs a node its connect window, waiting for the frozen node's connections,
# and that round). Once more than half the probes ended, one still running this long after that moment and after
# the last of the others has frozen or fallen far behind (its pairs are lost either way): the stage goes on without
# it instead of waiting out its probe's own time limit (minutes at 64 nodes).
STRAGGLER_GRACE = 30.0
# The perf rounds' node order is shuffled with a fixed seed: the same partners on every run of the same nodes, so
# a baseline compares the same pairs (--network-rounds all measures every pair).
SCHEDULE_SEED = 0


def pick_ephemeral_port(rng: random.Random | None = None) -> int:
    """A port from the dynamic range for the second probe; the same on every node of one run."""
    return (rng or random.SystemRandom()).randint(*EPHEMERAL_RANGE)


def mesh_args(
    me: str,
    ports: list[int],
    duration: float,
    barrier: tuple[str, str, float] | None = None,
    perf: tuple[int, tuple[str, ...]] | None = None,
    rounds: int | None = netprobe.DEFAULT_ROUNDS,
) -> list[str]:
    """The probe's arguments on node ME, which reads the nodes from its standard input (peer_list()).
    BARRIER: (ready file, go file, seconds to wait for the go file). PERF: (port, measurements) for the perf rounds
    (network.plan()); none when no measurement is wanted. ROUNDS: how many perf rounds (None: every pair)."""
    args = ["mesh", "--self", me, "--duration", f"{duration:g}", "--peers", "-"]
    for port in ports:
        args += ["--port", str(port)]
    if barrier:
        ready, go, wait = barrier
        args += ["--ready-file", ready, "--go-file", go, "--ready-timeout", f"{wait:g}"]
    if perf and perf[1]:
        args += ["--rounds", "all" if rounds is None else str(rounds), "--seed", str(SCHEDULE_SEED)]
        args += ["--perf-port", str(perf[0])]
        for measurement in perf[1]:
            args += ["--measure", measurement]
    return args


def peer_list(peers: list[network.Peer]) -> str:
    """The probe's --peers list: a line per node, NAME ADDRESS, and the hostname to resolve where it is not NAME."""
    lines = []
    for peer in peers:
        other = peer.hostname if peer.hostname and peer.hostname != peer.name else ""
        lines.append(f"{peer.name} {peer.address} {other}".rstrip())
    return "\n".join(lines) + "\n"


def ready_timeout(nodes: int) -> float:
    """How long every node's probe gets to start listening: python's start on a loaded node, over SSH."""
    return READY_BASE + READY_PER_NODE * nodes


def connect_window(duration: float, nodes: int) -> float:
    """The seconds connection attempts may run once every node listens (each node makes 2 (N-1) of them)."""
    return duration * max(1.0, nodes / 16)


def round_count(peers: list[network.Peer], rounds: int | None) -> int:
    """How many perf rounds the probes run for ROUNDS (--network-rounds; None: every pair)."""
    return len(netprobe.schedule([p.name for p in peers], rounds, SCHEDULE_SEED))


def perf_time(rounds: int) -> float:
    """The longest the RTT and throughput rounds may take: each ends at a fixed time after the shared deadline,
    however late a node is."""
    return rounds * netprobe.ROUND_SECONDS


def past_waiting(finished: dict[str, float], nodes: int, paced_end: float, now: float) -> bool:
    """Whether the probes still running at NOW are stragglers (STRAGGLER_GRACE): more than half of the NODES' probes
    ended (FINISHED: node -> when), and the grace has passed since both PACED_END, when every probe's connect window
    and rounds were to end, and the last of them."""
    if 2 * len(finished) <= nodes:
        return False
    return now - max(max(finished.values()), paced_end) > STRAGGLER_GRACE


def cluster_network(members: list[Member]) -> str | None:
    """The network the nodes talk over, for the advice that names it (a firewall rule): the inventory's
    cluster_cidr, else the network of each node's cluster address on its cluster interface. None unless every
    node gives the same one."""
    networks = set()
    for m in members:
        if m.node.cluster_cidr:
            try:
                networks.add(str(ipaddress.ip_network(m.node.cluster_cidr, strict=False)))
            except ValueError:
                return None
            continue
        found = [
            str(a.address.network)
            for a in m.facts.addresses or []
            if a.iface == m.interface and str(a.address.ip) == m.address
        ]
        if not found:
            return None
        networks.add(found[0])
    return networks.pop() if len(networks) == 1 else None


def run(members: list[Member], ctx: Context) -> list[CheckResult]:
    config = ctx.config
    port = pick_ephemeral_port()
    perf_port = pick_ephemeral_port()
    while perf_port in (port, config.master_port):
        perf_port = pick_ephemeral_port()
    peers = [network.Peer(m.name, m.address, m.hostname) for m in members]
    records: dict[str, dict] = {}
    errors: dict[str, str] = {}
    lock = threading.Lock()
    finished: dict[str, float] = {}  # node -> when its probe's answer came back
    abandoned: set[str] = set()  # nodes whose probe the stage stopped waiting for (STRAGGLER_GRACE)
    measure = network.plan(config.selection.check_selected)  # a deselected check costs no perf round
    wait = ready_timeout(len(members))
    window = connect_window(config.network_duration, len(members))
    rounds = round_count(peers, config.network_rounds)
    listed = peer_list(peers)  # the same for every node, on each probe's standard input

    def files(m: Member) -> tuple[str, str]:
        workdir = m.transport.workdir.rstrip("/")
        return f"{workdir}/netprobe.ready", f"{workdir}/netprobe.go"

    def probe(m: Member) -> None:
        ready, go = files(m)
        args = mesh_args(
            m.name,
            [config.master_port, port],
            window,
            (ready, go, wait + GO_SLACK),
            (perf_port, measure),
            config.network_rounds,
        )
        command = bundle.command(m.facts.python, m.transport.workdir, "netprobe", *args)
        try:
            answer = m.transport.run(
                command,
                timeout=wait + GO_SLACK + window + (perf_time(rounds) if measure else 0) + 30,
                stdin=listed,
            )
        except Exception as exc:  # one node's trouble is that node's network.probe ERROR
            answer, error = None, f"{type(exc).__name__}: {exc}"
        with lock:
            if m.name in abandoned:  # the stage went on without it
                return
            finished[m.name] = time.monotonic()
            if answer is None:
                errors[m.name] = error
                return
            (config.host_dir(m.name) / "network.json").write_text(answer.stdout)
            (config.host_dir(m.name) / "network.stderr").write_text(answer.stderr)
            try:
                records[m.name] = json.loads(answer.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                errors[m.name] = answer.cause()

    reach = ctx.reach
    reach.each(lambda m: bundle.install(m.transport), members, name=lambda m: m.name)
    # Phase one: every node's probe binds its listeners; phase two starts once every node reported ready (or
    # the wait ran out), so no connection is tried towards a node that is not listening yet.
    started = time.monotonic()
    ready_after: dict[str, float] = {}
    probes = threading.Thread(
        target=lambda: reach.each(probe, members, name=lambda m: m.name), daemon=True, name="netprobe"
    )
    probes.start()

    def await_ready(m: Member) -> None:
        ready, go = files(m)
        command = bundle.command(m.facts.python, m.transport.workdir, "netprobe", "wait-ready", ready, "--or", go)
        if m.transport.run([*command, "--timeout", f"{wait:g}"], timeout=wait + 15).ok:
            ready_after[m.name] = round(time.monotonic() - started, 3)

    waits = threading.Thread(
        target=lambda: reach.each(await_ready, members, name=lambda m: m.name), daemon=True, name="netprobe ready"
    )
    waits.start()
    # Go once every node listens, or its probe already ended (it failed: nothing to wait for), or the wait ran out.
    while waits.is_alive() and time.monotonic() < started + wait + 15:
        if all(m.name in ready_after or m.name in records or m.name in errors for m in members):
            break
        time.sleep(0.1)
    reach.each(
        lambda m: m.transport.run(
            bundle.command(m.facts.python, m.transport.workdir, "netprobe", "go", files(m)[1], f"{window:g}"),
            timeout=30,
        ),
        members,
        name=lambda m: m.name,
    )
    # Every probe has its go file now: its connect window and its rounds end by this moment.
    paced_end = time.monotonic() + window + (perf_time(rounds) if measure else 0)
    waits.join(30)  # the go file ends every wait still under way
    while probes.is_alive():
        with lock:
            if past_waiting(finished, len(members), paced_end, time.monotonic()):
                for m in members:
                    if m.name not in finished:
                        abandoned.add(m.name)
                        errors[m.name] = (
                            f"no answer {STRAGGLER_GRACE:.0f} s after every probe's rounds were to end and the other "
                            "nodes' probes ended (the node froze, or fell far behind); its pairs were not measured"
                        )
                break
        probes.join(0.2)
    not_ready = {m.name: wait for m in members if m.name not in ready_after}
    results = network.evaluate(
        records,
        peers,
        master=members[0].name,
        master_port=config.master_port,
        errors=errors,
        cidr=cluster_network(members),
        not_ready=not_ready,
        ready_after=ready_after,
        measure=measure,
    )
    if len(members) == 1:  # one node: the ranks meet on 127.0.0.1 whatever the hostname resolves to
        name = members[0].name
        results = [r for r in results if r.name != "network.resolve"]
        results.append(
            registry.emit(
                "network.resolve",
                Status.SKIP,
                "one node: its ranks meet on 127.0.0.1 (hostname.resolve covers its own name)",
                host=name,
            )
        )
    return results
