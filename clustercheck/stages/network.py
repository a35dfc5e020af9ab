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
from dataclasses import dataclass, field, replace

from clustercheck.checks import network, ports, registry
from clustercheck.facts import trainnet
from clustercheck.model import CheckResult, Status
from clustercheck.remote import rounds as perf
from clustercheck.stages import Context, Member, bundle, nodeprogram

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


def ports_checked(selected) -> bool:
    """Whether the ephemeral range is sampled: network.ports is selected (SELECTED: the selection's check_selected)."""
    return selected("network.ports")


def pick_ephemeral_port(rng: random.Random | None = None) -> int:
    """A port from the dynamic range for the second probe; the same on every node of one run."""
    return (rng or random.SystemRandom()).randint(*EPHEMERAL_RANGE)


def mesh_args(
    me: str,
    ports: list[int],
    duration: float,
    barrier: tuple[str, str, float] | None = None,
    perf: tuple[int, tuple[str, ...]] | None = None,
    rounds: int | None = perf.DEFAULT_ROUNDS,
    sample_seed: int | None = None,
    rendezvous: str | None = None,
) -> list[str]:
    """The probe's arguments on node ME, which reads the nodes from its standard input (peer_list()).
    BARRIER: (ready file, go file, seconds to wait for the go file). PERF: (port, measurements) for the perf rounds
    (network.plan()); none when no measurement is wanted. ROUNDS: how many perf rounds (None: every pair).
    SAMPLE_SEED: the draw of the ports sampled across each node's ephemeral range (remote/portsample.py).
    RENDEZVOUS: the master, where the probe runs over its training address but torchrun meets at its cluster
    address: the master port is also tried there (netprobe.Meeting)."""
    args = ["mesh", "--self", me, "--duration", f"{duration:g}", "--peers", "-"]
    if rendezvous:
        args += ["--rendezvous", rendezvous]
    if sample_seed is not None:
        args += ["--sample-seed", str(sample_seed)]
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
    """The probe's --peers list: a line per node, NAME ADDRESS, the hostname to resolve where it is not NAME, and
    the address it must resolve to where the probe runs over another one (netprobe.parse_peer_list)."""
    lines = []
    for peer in peers:
        other = peer.hostname if peer.hostname and peer.hostname != peer.name else ""
        resolves = f"resolves={peer.cluster_address}" if peer.resolves_to != peer.address else ""
        lines.append(" ".join(word for word in (peer.name, peer.address, other, resolves) if word))
    return "\n".join(lines) + "\n"


def ready_timeout(nodes: int) -> float:
    """How long every node's probe gets to start listening: python's start on a loaded node, over SSH."""
    return READY_BASE + READY_PER_NODE * nodes


def connect_window(duration: float, nodes: int) -> float:
    """The seconds connection attempts may run once every node listens (each node makes 2 (N-1) of them)."""
    return duration * max(1.0, nodes / 16)


def round_count(peers: list[network.Peer], rounds: int | None) -> int:
    """How many perf rounds the probes run for ROUNDS (--network-rounds; None: every pair)."""
    return len(perf.schedule([p.name for p in peers], rounds, SCHEDULE_SEED))


def perf_time(rounds: int) -> float:
    """The longest the RTT and throughput rounds may take: each ends at a fixed time after the shared deadline,
    however late a node is."""
    return rounds * perf.ROUND_SECONDS


def past_waiting(finished: dict[str, float], nodes: int, paced_end: float, now: float) -> bool:
    """Whether the probes still running at NOW are stragglers (STRAGGLER_GRACE): more than half of the NODES' probes
    ended (FINISHED: node -> when), and the grace has passed since both PACED_END, when every probe's connect window
    and rounds were to end, and the last of them."""
    if 2 * len(finished) <= nodes:
        return False
    return now - max(max(finished.values()), paced_end) > STRAGGLER_GRACE


def cluster_network(members: list[Member], paths: dict[str, trainnet.TrainingPath] | None = None) -> str | None:
    """The network the nodes talk over, for the advice that names it (a firewall rule): the inventory's
    cluster_cidr, else the network of each node's cluster address on its cluster interface; where the probe ran
    over another address (PATHS: the training interface's), that address's network. None unless every node gives
    the same one."""
    networks = set()
    for m in members:
        path = (paths or {}).get(m.name)
        if path is not None and path.address != m.address:
            found = [str(a.address.network) for a in m.facts.addresses or [] if str(a.address.ip) == path.address]
            if not found:
                return None
            networks.add(found[0])
            continue
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


def training_path(m: Member, alone: bool = False) -> trainnet.TrainingPath:
    """The interface and address M's training traffic uses (facts/trainnet.py), which the probe runs over: the
    NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME its environment files give a user's torchrun, else its cluster interface.
    ALONE: a one-node run, whose ranks meet on loopback."""
    if alone:
        return trainnet.TrainingPath(m.interface, m.address, "one node: its ranks meet on loopback")
    settings = [(f"{s.file}:{s.line}", s.name, s.value) for s in m.facts.launch_env or []]
    addresses = [(a.iface, str(a.address.ip)) for a in m.facts.addresses or [] if a.address.version == 4]
    return trainnet.training_path(settings, addresses, (m.interface, m.address), m.node.address, m.gpus)


PATH_CHECKS = ("network.tcp", "network.rtt", "network.throughput", "network.ports")  # run over the training path


def with_paths(
    results: list[CheckResult], paths: dict[str, trainnet.TrainingPath], rendezvous: str = ""
) -> list[CheckResult]:
    """RESULTS with the path every node's probe ran over in network.tcp's data, and said in the message of the
    checks measured on it (PATH_CHECKS) where a node's training traffic leaves through another interface than its
    cluster address (the network training uses is the one proven); RENDEZVOUS: what network.tcp also says of the
    master port at the master's cluster address."""
    data = {name: {"interface": p.interface, "address": p.address, "why": p.why} for name, p in paths.items()}
    groups: dict[tuple, list[str]] = {}  # (interface, why) -> the nodes whose probe ran over it, for that reason
    for name, p in sorted(paths.items()):
        if p.elsewhere:
            groups.setdefault((p.interface, p.why), []).append(name)
    note = ""
    if groups:
        shown = "; ".join(
            f"{_names(nodes)} over {interface} ({why})" for (interface, why), nodes in sorted(groups.items())[:3]
        )
        more = f"; and {len(groups) - 3} more" if len(groups) > 3 else ""
        note = f" (on the network training uses, not the SSH addresses: {shown}{more})"
    return [
        replace(
            r,
            message=r.message + (f"; {rendezvous}" if rendezvous and r.name == "network.tcp" else "") + note,
            # once in the report (network.tcp's): N entries, a report of thousands of nodes carries them once
            data={**r.data, "paths": data} if r.name == "network.tcp" else r.data,
        )
        if r.name in PATH_CHECKS
        else r
        for r in results
    ]


def _names(nodes: list[str]) -> str:
    return ", ".join(nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")


@dataclass(frozen=True)
class Plan:
    """What every node's probe of one run is told: the ports, the measurements, and its times."""

    port: int  # the ephemeral port probed beside the master port
    perf_port: int  # the port of the perf rounds
    measure: tuple[str, ...]  # the measurements the selected checks need (network.plan)
    wait: float  # seconds every probe gets to listen (ready_timeout)
    window: float  # seconds connection attempts may run once every node listens (connect_window)
    rounds: int  # perf rounds
    peers: list[network.Peer]
    listed: str  # the node list, the same on every probe's standard input (peer_list)
    sample_seed: int | None = None  # the draw of each node's sampled ephemeral ports (None: none sampled)
    paths: dict[str, trainnet.TrainingPath] = field(default_factory=dict)  # node -> what its probe runs over

    @property
    def rendezvous(self) -> str | None:
        """The master, where its probe runs over another address than torchrun's --master-addr (its cluster
        address, the first peer's resolves=): the master port is tried there too."""
        first = self.peers[0] if self.peers else None
        return first.name if first is not None and first.resolves_to != first.address else None

    @classmethod
    def of(cls, members: list[Member], config) -> Plan:
        port = pick_ephemeral_port()
        perf_port = pick_ephemeral_port()
        while perf_port in (port, config.master_port):
            perf_port = pick_ephemeral_port()
        paths = {m.name: training_path(m, alone=len(members) == 1) for m in members}
        # The probe runs over each node's training address; its name must still resolve to its cluster address.
        moved = {m.name: m.address for m in members if paths[m.name].address != m.address}
        peers = [network.Peer(m.name, paths[m.name].address, m.hostname, moved.get(m.name)) for m in members]
        return cls(
            port,
            perf_port,
            network.plan(config.selection.check_selected),  # a deselected check costs no perf round
            ready_timeout(len(members)),
            connect_window(config.network_duration, len(members)),
            round_count(peers, config.network_rounds),
            peers,
            peer_list(peers),
            # a new draw each run, recorded in every node's record: the runs together cover the whole range
            random.SystemRandom().randrange(2**31) if ports_checked(config.selection.check_selected) else None,
            paths,
        )

    @property
    def paced(self) -> float:
        """Seconds from the go signal until every probe's connect window and rounds have ended."""
        return self.window + (perf_time(self.rounds) if self.measure else 0)


class Probes:
    """Every node's probe of one run, in the background: started at once, let go together once every node listens
    (the barrier), and waited for until every probe answered or those still running are stragglers."""

    def __init__(self, members: list[Member], ctx: Context, plan: Plan) -> None:
        self.members, self.ctx, self.plan = members, ctx, plan
        self.records: dict[str, dict] = {}
        self.errors: dict[str, str] = {}
        self.ready_after: dict[str, float] = {}  # node -> seconds until its probe listened
        self.samples: dict[str, list[int]] = {}  # node -> the ports of its ephemeral range its probe listens on
        self.finished: dict[str, float] = {}  # node -> when its probe's answer came back
        self.abandoned: set[str] = set()  # nodes whose probe the stage stopped waiting for (STRAGGLER_GRACE)
        self.lock = threading.Lock()
        self.started = time.monotonic()
        self._probes: threading.Thread | None = None

    def files(self, m: Member) -> tuple[str, str]:
        """The probe's ready file and go file on M."""
        workdir = m.transport.workdir.rstrip("/")
        return f"{workdir}/netprobe.ready", f"{workdir}/netprobe.go"

    def start(self) -> None:
        """Phase one: every node's probe binds its listeners and reports ready, then waits for the go file."""
        self.started = time.monotonic()
        self._probes = self._each_in_background(self.probe, "netprobe")

    def probe(self, m: Member) -> None:
        """M's probe, its answer (or why there is none) recorded, unless the stage went on without it."""
        plan, config = self.plan, self.ctx.config
        ready, go = self.files(m)
        args = mesh_args(
            m.name,
            [config.master_port, plan.port],
            plan.window,
            (ready, go, plan.wait + GO_SLACK),
            (plan.perf_port, plan.measure),
            config.network_rounds,
            plan.sample_seed,
            plan.rendezvous,
        )
        try:
            answer = nodeprogram.bundled(
                m.transport,
                m.facts.python,
                "netprobe",
                *args,
                timeout=plan.wait + GO_SLACK + plan.paced + 30,
                stdin=plan.listed,
                name="netprobe mesh",
            )
        except Exception as exc:  # one node's trouble is that node's network.probe ERROR
            answer = None
            error = f"{type(exc).__name__}: {exc}"
        with self.lock:
            if m.name in self.abandoned:  # the stage went on without it
                return
            self.finished[m.name] = time.monotonic()
            if answer is None:
                self.errors[m.name] = error
                return
            nodeprogram.keep(answer.result, config.host_dir(m.name) / "network.json")
            if answer.failure is not None:
                self.errors[m.name] = answer.failure.cause
            else:
                self.records[m.name] = answer.value

    def barrier(self) -> float:
        """Phase two: the go signal on every node once every probe listens, or its probe already ended (it failed:
        nothing to wait for), or the wait ran out; returns when every probe's connect window and rounds end."""
        wait = self.plan.wait
        waits = self._each_in_background(self.await_ready, "netprobe ready")
        while waits.is_alive() and time.monotonic() < self.started + wait + 15:
            with self.lock:
                if all(m.name in self.ready_after or m.name in self.finished for m in self.members):
                    break
            time.sleep(0.1)
        with self.lock:  # one map for every node: each probe tries the others' sampled ports
            samples = json.dumps(self.samples)
        self.ctx.reach.each(lambda m: self.go(m, samples), self.members, name=lambda m: m.name)
        paced_end = time.monotonic() + self.plan.paced  # every probe has its go file now
        waits.join(30)  # the go file ends every wait still under way
        return paced_end

    def await_ready(self, m: Member) -> None:
        ready, go = self.files(m)
        wait = self.plan.wait
        args = ("wait-ready", ready, "--or", go, "--timeout", f"{wait:g}")
        answer = nodeprogram.bundled(m.transport, m.facts.python, "netprobe", *args, timeout=wait + 15)
        if answer.failure is None:
            with self.lock:
                self.ready_after[m.name] = round(time.monotonic() - self.started, 3)
                sampled = answer.value.get("sample") if isinstance(answer.value, dict) else None
                if sampled:
                    self.samples[m.name] = [int(port) for port in sampled]

    def go(self, m: Member, samples: str) -> None:
        """M's go file written, SAMPLES (every node's sampled ports, as JSON) given to its probe."""
        go = self.files(m)[1]
        args = ("go", go, f"{self.plan.window:g}", "--samples", "-")
        nodeprogram.bundled(m.transport, m.facts.python, "netprobe", *args, timeout=30, stdin=samples)

    def await_answers(self, paced_end: float) -> None:
        """Until every probe answered, or those still running are stragglers (past_waiting): their nodes' errors say
        so, and the stage goes on without them."""
        assert self._probes is not None
        while self._probes.is_alive():
            with self.lock:
                if past_waiting(self.finished, len(self.members), paced_end, time.monotonic()):
                    for m in self.members:
                        if m.name not in self.finished:
                            self.abandoned.add(m.name)
                            self.errors[m.name] = (
                                f"no answer {STRAGGLER_GRACE:.0f} s after every probe's rounds were to end and the "
                                "other nodes' probes ended (the node froze, or fell far behind); its pairs were not "
                                "measured"
                            )
                    return
            self._probes.join(0.2)

    def _each_in_background(self, work, name: str) -> threading.Thread:
        reach, members = self.ctx.reach, self.members
        thread = threading.Thread(
            target=lambda: reach.each(work, members, name=lambda m: m.name), daemon=True, name=name
        )
        thread.start()
        return thread


def run(members: list[Member], ctx: Context) -> list[CheckResult]:
    plan = Plan.of(members, ctx.config)
    ctx.reach.each(lambda m: bundle.install(m.transport), members, name=lambda m: m.name)
    probes = Probes(members, ctx, plan)
    probes.start()
    probes.await_answers(probes.barrier())
    with probes.lock:
        return judge(members, ctx, plan, probes)


def judge(members: list[Member], ctx: Context, plan: Plan, probes: Probes) -> list[CheckResult]:
    """The network.* checks from what the probes answered; on one node, network.resolve is not the network's."""
    config = ctx.config
    rules = {m.name: m.facts.firewall.port_rules if m.facts.firewall else () for m in members}
    cidr = cluster_network(members, plan.paths)
    results = network.evaluate(
        dict(probes.records),
        plan.peers,
        master=members[0].name,
        master_port=config.master_port,
        errors=dict(probes.errors),
        cidr=cidr,
        not_ready={m.name: plan.wait for m in members if m.name not in probes.ready_after},
        ready_after=dict(probes.ready_after),
        measure=plan.measure,
        rules=rules,
    )
    if plan.sample_seed is not None:
        results += ports.sample_check(dict(probes.records), rules, cidr=cidr)
    meeting = ""
    if plan.rendezvous:
        master = plan.peers[0]
        meeting = (
            f"the rendezvous also tried at {master.name}'s cluster address {master.resolves_to}:{config.master_port}"
        )
    results = with_paths(results, plan.paths, meeting)
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
