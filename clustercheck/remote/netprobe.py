"""The network probe, the bundle's `netprobe` program, run on every node at the same time before any torch job
(standard library only).

    clustercheck-remote.pyz netprobe mesh --self NAME --peers FILE --port 29500 --port 49731 [--duration 10]

--peers names every node, one per line: NAME ADDRESS [HOSTNAME] [resolves=CLUSTER_ADDRESS] (the hostname to
resolve, default NAME; the address it must resolve to where the probe runs over another one, the training
interface's: stages/network.py); `-` reads
the list from standard input, as the controller sends it: the command line stays the same size however many nodes
there are (one shell argument is limited to 128 KiB on Linux, a few thousand peers).

Each node listens on the given TCP ports on its own cluster address, connects to every peer on every
port (mesh.py), resolves every node's name, reads the MTU of the interface carrying its address, and, when a port
cannot be bound, names the process that holds it (pid and command; netinfo.py). The probe exits by itself: when
every connection in and out is done, or at --duration. It prints one JSON record on stdout: what was expected is
counted, what was not is listed (summarise()).

With --go-file the probe runs in two phases, so that a node whose probe starts late is never taken for a
firewall: it binds its listeners (and answers connections from then on), writes --ready-file, and starts
connecting only when the controller has written --go-file on every node, i.e. once every node is listening.
The go file holds the number of seconds connection attempts may run from then on (the shared deadline);
without it within --ready-timeout the probe reports that no go signal came.

With --perf-port the probe then measures round trip time and throughput with one partner per round, in rounds of
disjoint pairs (rounds.py): --rounds of them (default 8, or 'all': every pair), drawn from the node list shuffled
by --seed, paced from the shared deadline so that no missing or slow node holds the others up.

With --sample-seed the probe also listens on a port drawn from each eighth of its own ip_local_port_range
(portsample.py: where gloo and NCCL listen), reports them in its ready file, and connects to the ports of every
peer that the go file lists (the controller gathers them from the ready files): its record's `sample`.

    clustercheck-remote.pyz netprobe wait-ready FILE [--or GO] --timeout S
                                    {"ready": true, ...FILE's JSON} once FILE exists; {"ready": false}, exit 1,
                                    at the timeout or once GO does
    clustercheck-remote.pyz netprobe go FILE SECONDS [--samples -]
                                    write the go file atomically (with every node's sampled ports, JSON on stdin)
    clustercheck-remote.pyz netprobe free-port                a port free on 127.0.0.1, for a node-local job
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import select
import socket
import sys
import threading
import time

from .mesh import CONNECT_ERRORS, CONNECT_TIMEOUT, RETRY_AFTER, TOKEN, Mesh, open_listener, write_atomic
from .netinfo import interface_of, mtu_of, resolve
from .portsample import open_sample
from .rounds import DEFAULT_ROUNDS, MEASUREMENTS, PERF_SECONDS, perf_rounds, schedule


def mesh(
    me: str,
    peers: dict[str, str],
    ports: list[int],
    duration: float,
    hostname: str,
    hostnames: dict[str, str],
    go_file: str | None = None,
    ready_file: str | None = None,
    ready_timeout: float = 60.0,
    perf_port: int | None = None,
    measure: tuple[str, ...] = MEASUREMENTS,
    rounds: int | None = DEFAULT_ROUNDS,
    seed: int | None = None,
    sample_seed: int | None = None,
    rendezvous: tuple[str, str] | None = None,
    resolves: dict[str, str] | None = None,
) -> dict:
    """The probe on node ME: its mesh (after the barrier, with GO_FILE), then the perf rounds (with PERF_PORT and
    something to MEASURE), then its names and interface; the record of it all. With SAMPLE_SEED it also listens on
    a sample of its ephemeral port range (portsample.py), and connects to the peers' samples the go file names.
    RENDEZVOUS: (master, address) where the probe runs over the training addresses but torchrun's rendezvous
    meets at the master's cluster address (RESOLVES: name -> cluster address): the master listens there on the
    master port (PORTS' first) too, and every other node connects to it from its own cluster address."""
    started = time.monotonic()
    sample = None
    if sample_seed is not None:
        sample = open_sample(peers[me], sample_seed, {*ports, perf_port or 0}, open_listener)
    node = Mesh(me, peers, ports, hostname, sample["listeners"] if sample else None)
    perf_listener = None
    if perf_port and measure:  # listening before the barrier, like the others; served only once the mesh is done
        perf_listener, state = open_listener(node.address, perf_port)
        node.listen_states.append({**state, "perf": True})
    meeting = Meeting(me, rendezvous, ports[0], resolves or {}, peers) if rendezvous else None
    if meeting is not None:
        meeting.listen(node.listen_states)
    barrier: dict = {}
    if go_file:
        barrier, duration = node.barrier(go_file, ready_file, ready_timeout, started)
    deadline = time.monotonic() + duration
    if meeting is not None and not barrier.get("no_go"):
        meeting.start(deadline)
    outgoing = node.connect(deadline, no_go=bool(barrier.get("no_go")))
    if meeting is not None:
        outgoing += meeting.finish(deadline)
    node.close()
    perf, plan = None, []
    if perf_listener is not None:
        # The rounds are paced from the connect deadline: the same moment on every node (the go signal's window).
        plan = schedule(list(peers), rounds, seed)
        perf = perf_rounds(me, peers, perf_port, perf_listener, PERF_SECONDS, measure, plan, deadline)
        perf_listener.close()
    interface = interface_of(node.address)
    return {
        "node": me,
        "hostname": hostname,
        "address": node.address,
        "interface": interface,
        "mtu": mtu_of(interface) if interface else None,
        "listen": node.listen_states,
        "outgoing": outgoing,
        "incoming": node.incoming,
        "resolve": {name: resolve(hostnames.get(name, name)) for name in peers},
        "seconds": round(time.monotonic() - started, 3),
        **({"barrier": barrier} if go_file else {}),
        **({"perf": perf, "rounds": len(plan)} if perf is not None else {}),
        **({"sample": sample_record(node, sample)} if sample is not None else {}),
    }


class Meeting:
    """The rendezvous where it is not on the probed addresses: torchrun's --master-addr is the master's cluster
    address while the ranks' traffic goes over the training interface. The master answers on (its cluster address,
    the master port) with the mesh's token; every other node connects once from its own cluster address, retrying
    until the connect deadline, in a thread beside the mesh's own connections."""

    def __init__(self, me: str, rendezvous: tuple[str, str], port: int, resolves: dict, peers: dict) -> None:
        self.me, (self.master, self.address), self.port = me, rendezvous, port
        self.source = resolves.get(me, peers[me])
        self.listener: socket.socket | None = None
        self.stop = threading.Event()
        self.result: dict = {}
        self.thread: threading.Thread | None = None

    def listen(self, states: list[dict]) -> None:
        if self.me == self.master:
            self.listener, state = open_listener(self.address, self.port)
            states.append({**state, "address": self.address, "rendezvous": True})

    def start(self, deadline: float) -> None:
        work = self.serve if self.me == self.master else lambda: self.connect(deadline)
        if self.me != self.master or self.listener is not None:
            self.thread = threading.Thread(target=work, daemon=True)
            self.thread.start()

    def serve(self) -> None:
        assert self.listener is not None
        while not self.stop.is_set():
            if select.select([self.listener], [], [], 0.2)[0]:
                try:
                    conn, _ = self.listener.accept()
                    conn.sendall(TOKEN + self.me.encode() + b"\n")
                    conn.close()
                except OSError:
                    continue

    def connect(self, deadline: float) -> None:
        result = {"to": self.master, "port": self.port, "address": self.address, "rendezvous": True, "attempts": 0}
        result.update(result="not-tried", detail="deadline")
        while time.monotonic() < deadline and result["result"] != "ok":
            result["attempts"] += 1
            result.update(self.attempt(max(0.1, min(CONNECT_TIMEOUT, deadline - time.monotonic()))))
            if result["result"] != "ok":
                time.sleep(RETRY_AFTER)
        self.result = result

    def attempt(self, timeout: float) -> dict:
        where = f"the rendezvous at {self.address}:{self.port} from {self.source}"
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            try:
                sock.bind((self.source, 0))
                sock.connect((self.address, self.port))
                answer = sock.recv(256)
            except socket.timeout:  # noqa: UP041 (Python 3.8 on the node: not TimeoutError before 3.10)
                return {"result": "timeout", "detail": f"{where}: no answer within {timeout:.1f} s"}
            except OSError as exc:
                code = exc.errno or errno.EINVAL
                return {"result": CONNECT_ERRORS.get(code, "error"), "detail": f"{where}: {os.strerror(code)}"}
        if answer.startswith(TOKEN):
            return {"result": "ok", "detail": where}
        return {"result": "wrong-service", "detail": f"{where}: answered {answer[:40]!r}, not clustercheck's probe"}

    def finish(self, deadline: float) -> list[dict]:
        """This node's connection to the rendezvous; none on the master, whose listener answers until DEADLINE,
        when the others stop trying (the perf rounds start then: the wait costs no time)."""
        if self.thread is not None and self.me != self.master:
            self.thread.join(max(0.0, deadline - time.monotonic()) + CONNECT_TIMEOUT + 1)
        if self.me == self.master:
            time.sleep(max(0.0, deadline - time.monotonic()))
        self.stop.set()
        if self.thread is not None and self.me == self.master:
            self.thread.join(1)
        if self.listener is not None:
            self.listener.close()
        return [self.result] if self.result else []


def sample_record(node: Mesh, sample: dict) -> dict:
    """What the probe learnt of the sampled ports: its own range, seed and ports (those it could not listen on with
    why), the connections in to them by port, and its connections out to the peers' samples (as `outgoing`)."""
    incoming = {str(port): 0 for port in node.sample_ports}
    for connection in node.incoming:
        if str(connection.get("port")) in incoming and connection.get("peer"):
            incoming[str(connection["port"])] += 1
    return {
        "range": sample["range"],
        "seed": sample["seed"],
        "ports": node.sample_ports,
        "not_listening": sample["failed"],
        "incoming": incoming,
        "peers": sorted(node.peer_samples),
        "outgoing": node.sample_outgoing,
    }


def summarise(record: dict, peers: dict[str, str], resolves: dict[str, str] | None = None) -> dict:
    """What the probe prints: RECORD (mesh()'s) with only what differs from what was expected. A connection out that
    succeeded, a connection in from a peer and a name whose first address is the one the controller gave (PEERS;
    resolve_summary) are counted, not listed: listing them is 2 (N-1) connections and N names per node, N² over
    the cluster (a thousand nodes: 3 million entries for the controller to receive, parse and keep). RESOLVES: name
    -> the address its name must resolve to where it is not its PEERS address (parse_peer_list)."""
    outgoing, incoming, names = record["outgoing"], record["incoming"], record["resolve"]
    from_peers = {address for name, address in peers.items() if name != record["node"]}
    sampled = set((record.get("sample") or {}).get("ports") or ())
    incoming = [c for c in incoming if c.get("port") not in sampled]  # counted by port in the sample's record
    summary = {}
    if "sample" in record:  # failures listed, the rest counted, like the probe's own ports
        out = record["sample"]["outgoing"]
        failed = [o for o in out if o["result"] != "ok"]
        summary["sample"] = {**record["sample"], "outgoing": {"ok": len(out) - len(failed), "failed": failed}}
    return {
        **record,
        **summary,
        "outgoing": {
            "ok": sum(1 for o in outgoing if o["result"] == "ok"),
            "failed": [o for o in outgoing if o["result"] != "ok"],
        },
        "incoming": {
            "peers": sum(1 for c in incoming if c["from"] in from_peers),
            "others": [c for c in incoming if c["from"] not in from_peers],
        },
        "resolve": resolve_summary(names, {**peers, **(resolves or {})}),
    }


ALSO_LISTED = 8  # names whose extra addresses are listed (a node's own name, mostly); the rest are counted


def resolve_summary(names: dict[str, dict], peers: dict[str, str]) -> dict:
    """NAMES' answers (name -> resolve()) against the addresses the controller gave (PEERS), judged by the first
    address, the one the ranks use: getaddrinfo's first answer is what gloo binds and what torch's TCPStore and
    torchrun's rendezvous connect to first. A name whose first address is the expected one is counted; the
    addresses after it (a multi-homed host's /etc/hosts has a line per network for its own name, as Docker writes
    them) are kept under `also` for the first ALSO_LISTED names. Any other answer is listed in `unexpected`."""
    unexpected, also = {}, {}
    for name, answer in names.items():
        addresses = answer.get("addresses") or []
        if addresses[:1] != [peers.get(name)]:
            unexpected[name] = answer
        elif len(addresses) > 1:
            also[name] = addresses[1:]
    summary: dict = {"names": len(names), "unexpected": unexpected}
    if also:
        summary["also"] = dict(sorted(also.items())[:ALSO_LISTED])
        summary["also_names"] = len(also)
    return summary


RESOLVES = "resolves="  # a --peers field: the address the node's name must resolve to, where not ADDRESS


def parse_peer_list(text: str) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """--peers' list: one node per line, NAME ADDRESS [HOSTNAME] [resolves=CLUSTER_ADDRESS]; (name -> address,
    name -> hostname where given, name -> the address its name must resolve to where it is not ADDRESS: the probe
    runs over the training interface's address, the name resolves to the cluster address). ValueError names a line
    that is not one."""
    peers: dict[str, str] = {}
    hostnames: dict[str, str] = {}
    resolves: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        if fields[-1].startswith(RESOLVES) and len(fields) > 2:
            resolves[fields[0]] = fields.pop()[len(RESOLVES) :]
        if len(fields) > 3 or len(fields) < 2:
            expected = f"NAME ADDRESS [HOSTNAME] [{RESOLVES}ADDRESS]"
            raise ValueError(f"line {number}: expected {expected}, not {line.strip()!r}")
        peers[fields[0]] = fields[1]
        if len(fields) == 3:
            hostnames[fields[0]] = fields[2]
    if not peers:
        raise ValueError("no node listed")
    return peers, hostnames, resolves


def parse_peers(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """--peers' list (parse_peer_list): (name -> address, name -> hostname where given)."""
    peers, hostnames, _ = parse_peer_list(text)
    return peers, hostnames


def parse_rounds(text: str) -> int | None:
    """--rounds: a positive number, or 'all' (None: every pair)."""
    if text == "all":
        return None
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a number of rounds (1 or more) or 'all', not {text!r}")
    return int(text)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="clustercheck network probe")
    sub = parser.add_subparsers(dest="command", required=True)
    p_mesh = sub.add_parser("mesh", help="listen, connect to every peer, resolve names, report MTU")
    p_mesh.add_argument("--self", dest="me", required=True, help="this node's name among the peers")
    p_mesh.add_argument(
        "--peers", metavar="FILE", required=True, help="every node, a line each: NAME ADDRESS [HOSTNAME]; - for stdin"
    )
    p_mesh.add_argument("--port", action="append", type=int, required=True, help="a TCP port to probe (repeat)")
    p_mesh.add_argument("--duration", type=float, default=10.0, help="seconds before the probe gives up")
    p_mesh.add_argument("--perf-port", type=int, default=None, help="measure RTT and throughput on this port")
    p_mesh.add_argument(
        "--measure",
        action="append",
        choices=MEASUREMENTS,
        default=None,
        help="what the perf rounds measure (repeat; default: all)",
    )
    p_mesh.add_argument(
        "--rounds",
        type=parse_rounds,
        default=DEFAULT_ROUNDS,
        help=f"perf rounds: partners each node is measured with, or 'all' for every pair (default {DEFAULT_ROUNDS})",
    )
    p_mesh.add_argument("--seed", type=int, default=None, help="shuffles the nodes before the rounds are drawn")
    p_mesh.add_argument(
        "--sample-seed", type=int, default=None, help="also listen on ports drawn across ip_local_port_range"
    )
    p_mesh.add_argument(
        "--rendezvous",
        metavar="MASTER",
        default=None,
        help="also meet at MASTER's cluster address (its resolves= in --peers) on the first --port",
    )
    p_mesh.add_argument("--go-file", default=None, help="connect only once this file exists (it holds the seconds)")
    p_mesh.add_argument("--ready-file", default=None, help="written once the listeners are up")
    p_mesh.add_argument("--ready-timeout", type=float, default=60.0, help="seconds to wait for the go file")
    sub.add_parser("free-port", help="print a TCP port free on 127.0.0.1 (for a node-local torch job)")
    p_wait = sub.add_parser("wait-ready", help="wait until a probe's ready file exists")
    p_wait.add_argument("file")
    p_wait.add_argument("--or", dest="other", default=None, help="stop waiting (exit 1) once this file exists")
    p_wait.add_argument("--timeout", type=float, default=60.0)
    p_go = sub.add_parser("go", help="let a waiting probe connect for SECONDS")
    p_go.add_argument("file")
    p_go.add_argument("seconds", type=float)
    p_go.add_argument("--samples", default=None, help="- : every node's sampled ports (JSON) from standard input")
    return parser


def main(argv: list[str] | None = None) -> int:
    commands = parser()
    args = commands.parse_args(argv)
    if args.command == "free-port":
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            print(sock.getsockname()[1])
        return 0
    if args.command == "wait-ready":
        return wait_ready(args.file, args.other, args.timeout)
    if args.command == "go":
        samples = json.loads(sys.stdin.read()) if args.samples == "-" else None
        text = json.dumps({"window": args.seconds, "samples": samples}) if samples else f"{args.seconds:g}"
        write_atomic(args.file, text + "\n")
        return 0
    try:
        peers, hostnames, resolves = read_peers(args.peers)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        commands.error(f"--peers {args.peers}: {exc}")
    if args.me not in peers:
        commands.error(f"--self {args.me} is not among the nodes --peers lists")
    record = mesh(
        args.me,
        peers,
        args.port,
        args.duration,
        socket.gethostname(),
        hostnames,
        go_file=args.go_file,
        ready_file=args.ready_file,
        ready_timeout=args.ready_timeout,
        perf_port=args.perf_port,
        measure=tuple(args.measure or MEASUREMENTS),
        rounds=args.rounds,
        seed=args.seed,
        sample_seed=args.sample_seed,
        rendezvous=rendezvous_of(args.rendezvous, resolves),
        resolves=resolves,
    )
    print(json.dumps(summarise(record, peers, resolves)))
    return 0


def rendezvous_of(master: str | None, resolves: dict[str, str]) -> tuple[str, str] | None:
    """--rendezvous MASTER: (MASTER, its cluster address) where the probe runs over another address of it."""
    return (master, resolves[master]) if master and master in resolves else None


def wait_ready(path: str, other: str | None, timeout: float) -> int:
    """Until a probe's ready file PATH exists (exit 0), or TIMEOUT seconds passed or OTHER exists (exit 1)."""
    give_up = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() >= give_up or (other and os.path.exists(other)):
            print(json.dumps({"ready": False}))
            return 1
        time.sleep(0.05)
    try:  # what the probe listens on (mesh.py's barrier writes it atomically)
        with open(path) as fh:
            listening = json.load(fh)
    except (OSError, ValueError):
        listening = {}
    print(json.dumps({**(listening if isinstance(listening, dict) else {}), "ready": True}))
    return 0


def read_peers(source: str) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """--peers' list from the file SOURCE, or standard input for `-` (parse_peer_list)."""
    if source == "-":
        return parse_peer_list(sys.stdin.read())
    with open(source) as fh:
        return parse_peer_list(fh.read())


if __name__ == "__main__":
    sys.exit(main())
