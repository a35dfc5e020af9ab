"""Network probe, run on every node at the same time before any torch job (standard library only).

    python3 netprobe.py mesh --self NAME --peers FILE --port 29500 --port 49731 [--duration 10]

--peers names every node, one per line: NAME ADDRESS [HOSTNAME] (the hostname to resolve, default NAME); `-` reads
the list from standard input, as the controller sends it: the command line stays the same size however many nodes
there are (one shell argument is limited to 128 KiB on Linux, a few thousand peers).

Each node listens on the given TCP ports on its own cluster address, connects to every peer on every
port, resolves every node's name, reads the MTU of the interface carrying its address, and, when a port
cannot be bound, names the process that holds it (pid and command). The listener answers each
connection with a token naming the node, so a connection that reaches some other service is not taken
for success. The probe exits by itself: when every connection in and out is done, or at --duration.
It prints one JSON record on stdout: what was expected is counted, what was not is listed (summarise()).

With --go-file the probe runs in two phases, so that a node whose probe starts late is never taken for a
firewall: it binds its listeners (and answers connections from then on), writes --ready-file, and starts
connecting only when the controller has written --go-file on every node, i.e. once every node is listening.
The go file holds the number of seconds connection attempts may run from then on (the shared deadline);
without it within --ready-timeout the probe reports that no go signal came.

With --perf-port the probe then measures round trip time and throughput with one partner per round, in rounds of
disjoint pairs (schedule()): --rounds of them (default 8, or 'all': every pair), drawn from the node list shuffled
by --seed, paced from the shared deadline so that no missing or slow node holds the others up (perf_rounds()).

    python3 netprobe.py wait-ready FILE [--or GO] --timeout S
                                                    exit 0 once FILE exists, 1 at the timeout or once GO does
    python3 netprobe.py go FILE SECONDS                  write the go file atomically
    python3 netprobe.py free-port                        a port free on 127.0.0.1, for a node-local job
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import json
import os
import random
import selectors
import socket
import struct
import subprocess
import sys
import time

TOKEN = b"clustercheck-netprobe "
SIOCGIFADDR = 0x8915
CONNECT_TIMEOUT = 2.0
# Connections a probe has in flight at once: every node opening all its 2 (N-1) connections at the same instant is
# a burst of SYNs and ARP requests (64 nodes: 8064 at once) that a switch's flood protection may drop; a few at a
# time stays far below that and still tries every pair within the connect window.
IN_FLIGHT = 8


# --------------------------------------------------------------------------- who holds a port (pure parsing)


def listening_inodes(proc_net_tcp: str, port: int) -> set[str]:
    """Socket inodes listening on PORT, from the text of /proc/net/tcp or /proc/net/tcp6."""
    inodes = set()
    for line in proc_net_tcp.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        local, state, inode = fields[1], fields[3], fields[9]
        if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: TCP_LISTEN
            inodes.add(inode)
    return inodes


def port_holders(port: int, proc: str = "/proc") -> list[dict]:
    """The processes with a socket listening on PORT: [{pid, command}]; empty when none can be seen."""
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            with open(f"{proc}/net/{table}") as fh:
                inodes |= listening_inodes(fh.read(), port)
        except OSError:
            continue
    if not inodes:
        return []
    targets = {f"socket:[{inode}]" for inode in inodes}
    holders = []
    for pid in sorted((p for p in os.listdir(proc) if p.isdigit()), key=int):
        try:
            fds = os.listdir(f"{proc}/{pid}/fd")
        except OSError:
            continue  # gone, or another user's process without root
        for fd in fds:
            try:
                if os.readlink(f"{proc}/{pid}/fd/{fd}") in targets:
                    with open(f"{proc}/{pid}/cmdline", "rb") as fh:
                        command = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
                    holders.append({"pid": int(pid), "command": command})
                    break
            except OSError:
                continue
    if not holders:
        holders.append({"pid": None, "command": "a process this user cannot see (run as root to name it)"})
    return holders


# --------------------------------------------------------------------------- interface and names


def interface_of(address: str) -> str | None:
    """The interface that carries ADDRESS (IPv4), or None."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            if socket.inet_ntoa(packed[20:24]) == address:
                return name
    finally:
        probe.close()
    # SIOCGIFADDR sees an interface's primary address only; `ip` also lists secondary ones.
    try:
        listing = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        listing = ""
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[3].split("/")[0] == address:
            return fields[1]
    return "lo" if address.startswith("127.") else None


def mtu_of(interface: str) -> int | None:
    try:
        with open(f"/sys/class/net/{interface}/mtu") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def resolve(name: str) -> dict:
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return {"hostname": name, "addresses": [], "error": str(exc)}
    addresses = []
    for info in infos:
        if info[4][0] not in addresses:
            addresses.append(info[4][0])
    return {"hostname": name, "addresses": addresses}


# --------------------------------------------------------------------------- the mesh


def open_listener(address: str, port: int) -> tuple[socket.socket | None, dict]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
        sock.listen(64)
    except OSError as exc:
        sock.close()
        state = {"port": port, "ok": False, "error": exc.strerror or str(exc), "errno": exc.errno}
        if exc.errno == errno.EADDRINUSE:
            state["holders"] = port_holders(port)
        return None, state
    sock.setblocking(False)
    return sock, {"port": port, "ok": True}


RETRY_AFTER = 0.3
PERF_SECONDS = 0.2  # seconds of bulk transfer each way per pair
PINGS = 10
MEASUREMENTS = ("rtt", "throughput")  # what the perf rounds can measure; --measure names those to make
CHUNK = 65536
# The perf rounds are paced from the shared deadline (the end of the connect window): round r ends at most
# ROUND_SECONDS * (r + 1) after it on every node. A node starts its next round as soon as its pair is done, so a
# healthy cluster never waits for the clock; a partner that does not come costs that round only, and a node that
# fell behind skips the rounds whose end has passed. A pair takes about half a second; the rest is for nodes
# that reach the deadline (the go signal) a little apart.
ROUND_SECONDS = 6.0
DEFAULT_ROUNDS = 8  # partners each node is measured with, whatever the cluster's size (every pair: --rounds all)


CONNECT_ERRORS = {
    errno.ECONNREFUSED: "refused",
    errno.EHOSTUNREACH: "host-unreachable",
    errno.ENETUNREACH: "network-unreachable",
    errno.EINVAL: "network-unreachable",  # a blackhole route
    errno.ETIMEDOUT: "timeout",
    errno.ECONNRESET: "reset",
}


class Attempt:
    """One outgoing connection to a peer's port, driven by the selector (never blocks the listener)."""

    def __init__(self, name: str, address: str, port: int, source: str) -> None:
        self.name, self.address, self.port, self.source = name, address, port, source
        self.result = {"to": name, "port": port, "result": "not-tried", "detail": "deadline", "attempts": 0}
        self.sock: socket.socket | None = None
        self.started = 0.0
        self.next_try = 0.0
        self.data = b""
        self.done = False

    def start(self, selector: selectors.BaseSelector, now: float) -> None:
        self.result["attempts"] += 1
        self.started, self.data = now, b""
        self.result.pop("connected", None)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setblocking(False)
        try:
            self.sock.bind((self.source, 0))  # leave through the cluster address, as torch's ranks do
        except OSError as exc:
            self.fail(selector, exc.errno or errno.EINVAL, now)
            return
        code = self.sock.connect_ex((self.address, self.port))
        if code not in (0, errno.EINPROGRESS):
            self.fail(selector, code, now)
            return
        selector.register(self.sock, selectors.EVENT_WRITE, self)

    def close(self, selector: selectors.BaseSelector) -> None:
        if self.sock is not None:
            with contextlib.suppress(KeyError, ValueError):
                selector.unregister(self.sock)
            self.sock.close()
            self.sock = None

    def fail(self, selector: selectors.BaseSelector, code: int, now: float) -> None:
        self.close(selector)
        self.result.update(result=CONNECT_ERRORS.get(code, "error"), detail=os.strerror(code))
        # The peer may not be listening yet, or the network may heal: try again until the deadline.
        self.next_try = now + RETRY_AFTER

    def timed_out(self, selector: selectors.BaseSelector, now: float) -> None:
        self.close(selector)
        connected = bool(self.result.get("connected"))
        detail = f"no answer within {CONNECT_TIMEOUT:.0f} s"
        self.result.update(result="timeout", detail=detail + (" after connecting" if connected else ""))
        self.next_try = now

    def on_event(self, selector: selectors.BaseSelector, now: float) -> None:
        assert self.sock is not None
        if not self.result.get("connected"):
            code = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code:
                self.fail(selector, code, now)
                return
            self.result["connected"] = True
            selector.modify(self.sock, selectors.EVENT_READ, self)
            return
        try:
            chunk = self.sock.recv(256)
        except OSError as exc:
            self.fail(selector, exc.errno or 0, now)
            return
        self.data += chunk
        if chunk and not self.data.endswith(b"\n") and len(self.data) < 256:
            return
        # We close first, so TIME_WAIT stays on this side and the port is free for torchrun at once.
        self.close(selector)
        self.done = True
        if self.data.startswith(TOKEN):
            self.result.update(result="ok", detail=self.data[len(TOKEN) :].decode(errors="replace").strip())
        else:
            self.result.update(result="wrong-service", detail=f"answered {self.data[:40]!r}, not clustercheck's probe")


def write_atomic(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as fh:
        fh.write(text)
    os.replace(path + ".tmp", path)


def read_go(path: str) -> float | None:
    """The connect window the go file grants, or None while there is no go file."""
    try:
        with open(path) as fh:
            return float(fh.read().strip() or "0")
    except (OSError, ValueError):
        return None


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
) -> dict:
    address = peers[me]
    started = time.monotonic()
    selector = selectors.DefaultSelector()
    listen_states = []
    for port in ports:
        sock, state = open_listener(address, port)
        listen_states.append(state)
        if sock:
            selector.register(sock, selectors.EVENT_READ, "listener")
    perf_listener = None
    if perf_port and measure:  # listening before the barrier, like the others; served only once the mesh is done
        perf_listener, state = open_listener(address, perf_port)
        listen_states.append({**state, "perf": True})
    barrier: dict = {}
    if go_file:
        # Phase one: listening (and answering) until every node is; the controller then writes the go file.
        if ready_file:
            write_atomic(ready_file, json.dumps({"listening": [s["port"] for s in listen_states if s["ok"]]}))
        barrier = {"ready_after": round(time.monotonic() - started, 3), "go_after": None}
        give_up = time.monotonic() + ready_timeout
        window = read_go(go_file)
        while window is None and time.monotonic() < give_up:
            for key, _ in selector.select(timeout=0.05):
                if key.data == "listener":
                    accept(selector, key.fileobj, hostname)
                else:
                    drain(selector, key, peers, me, barrier.setdefault("early_incoming", []))
            window = read_go(go_file)
        if window is None:
            window = 0.0  # no go: the connections out are reported as not tried
            barrier["no_go"] = True
        else:
            barrier["go_after"] = round(time.monotonic() - started, 3)
        duration = window
    deadline = time.monotonic() + duration
    # A connection in is counted when the connector closes, after reading the token.
    expected_in = (len(peers) - 1) * sum(1 for s in listen_states if s["ok"] and not s.get("perf"))
    incoming: list[dict] = barrier.pop("early_incoming", [])
    # Each node starts with the peers after it in the list, so the nodes do not all connect to the same one first.
    names = list(peers)
    order = names[names.index(me) + 1 :] + names[: names.index(me)]
    attempts = [Attempt(name, peers[name], port, address) for name in order for port in ports]
    if barrier.get("no_go"):
        for attempt in attempts:
            attempt.result["detail"] = "no go signal from the controller"

    while True:
        now = time.monotonic()
        if now >= deadline:
            break
        in_flight = 0
        for attempt in attempts:
            if attempt.sock is not None and now - attempt.started > CONNECT_TIMEOUT:
                attempt.timed_out(selector, now)
            in_flight += attempt.sock is not None
        # Attempts never tried come first, so every pair is tried at least once before any is retried.
        waiting = [a for a in attempts if not a.done and a.sock is None and now >= a.next_try]
        waiting.sort(key=lambda a: a.result["attempts"])
        for attempt in waiting[: max(0, IN_FLIGHT - in_flight)]:
            attempt.start(selector, now)
        # Only connections from peers count: a stray scanner must not end the probe early.
        if all(a.done for a in attempts) and sum(1 for c in incoming if c["peer"]) >= expected_in:
            break
        for key, _ in selector.select(timeout=0.05):
            if isinstance(key.data, Attempt):
                key.data.on_event(selector, time.monotonic())
            elif key.data == "listener":
                accept(selector, key.fileobj, hostname)
            else:
                drain(selector, key, peers, me, incoming)
    for attempt in attempts:
        attempt.close(selector)
        attempt.result.pop("connected", None)
    for key in list(selector.get_map().values()):
        key.fileobj.close()
    selector.close()
    perf, plan = None, []
    if perf_listener is not None:
        # The rounds are paced from the connect deadline: the same moment on every node (the go signal's window).
        plan = schedule(list(peers), rounds, seed)
        perf = perf_rounds(me, peers, perf_port, perf_listener, PERF_SECONDS, measure, plan, deadline)
        perf_listener.close()

    interface = interface_of(address)
    return {
        "node": me,
        "hostname": hostname,
        "address": address,
        "interface": interface,
        "mtu": mtu_of(interface) if interface else None,
        "listen": listen_states,
        "outgoing": [a.result for a in sorted(attempts, key=lambda a: (a.name, a.port))],
        "incoming": incoming,
        "resolve": {name: resolve(hostnames.get(name, name)) for name in peers},
        "seconds": round(time.monotonic() - started, 3),
        **({"barrier": barrier} if go_file else {}),
        **({"perf": perf, "rounds": len(plan)} if perf is not None else {}),
    }


def summarise(record: dict, peers: dict[str, str]) -> dict:
    """What the probe prints: RECORD (mesh()'s) with only what differs from what was expected. A connection out that
    succeeded, a connection in from a peer and a name that resolves to exactly the address the controller gave
    (PEERS) are counted, not listed: listing them is 2 (N-1) connections and N names per node, N² over the
    cluster (a thousand nodes: 3 million entries for the controller to receive, parse and keep)."""
    outgoing, incoming, names = record["outgoing"], record["incoming"], record["resolve"]
    from_peers = {address for name, address in peers.items() if name != record["node"]}
    return {
        **record,
        "outgoing": {
            "ok": sum(1 for o in outgoing if o["result"] == "ok"),
            "failed": [o for o in outgoing if o["result"] != "ok"],
        },
        "incoming": {
            "peers": sum(1 for c in incoming if c["from"] in from_peers),
            "others": [c for c in incoming if c["from"] not in from_peers],
        },
        "resolve": {
            "names": len(names),
            "unexpected": {n: a for n, a in names.items() if a.get("addresses") != [peers.get(n)]},
        },
    }


# --------------------------------------------------------------------------- round trip and throughput


def schedule(names: list[str], rounds: int | None = None, seed: int | None = None) -> list[list[tuple[str, str]]]:
    """Rounds of disjoint pairs (the circle method), so no node is in two measurements at once: with every round,
    each node meets a partner it has not met before. ROUNDS: how many (None, or at least N-1: every pair, in N-1
    rounds for N nodes, N with a node sitting out each round when N is odd). SEED shuffles the node order first,
    so the partners of the first rounds are spread over the cluster, not neighbours in the inventory. The same
    on every node, from the same list and seed."""
    order: list[str | None] = list(names)
    if seed is not None:
        random.Random(seed).shuffle(order)
    if len(order) % 2:
        order.append(None)
    n = len(order)
    # Only the rounds asked for are drawn (N/2 pairs each), not every round of the N-1 to keep a few.
    wanted = n - 1 if rounds is None or rounds >= len(names) - 1 else rounds
    every = []
    for _ in range(wanted):
        pairs = [(order[i], order[n - 1 - i]) for i in range(n // 2)]
        every.append([(a, b) for a, b in pairs if a is not None and b is not None])
        order = [order[0], order[-1], *order[1:-1]]
    return every


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        data += chunk
    return bytes(data)


def _readline(sock: socket.socket) -> str:
    data = bytearray()
    while not data.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        data += chunk
        if len(data) > 256:
            raise ConnectionError("not clustercheck's probe")
    return data.decode(errors="replace").strip()


def _send_for(sock: socket.socket, seconds: float) -> int:
    """Stream CHUNKs (each after a 1 byte flag) for SECONDS, then the end flag; returns the bytes sent."""
    payload = b"\x01" + os.urandom(CHUNK)
    sent, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        sock.sendall(payload)
        sent += CHUNK
    sock.sendall(b"\x00")
    return sent


def _receive_stream(sock: socket.socket) -> tuple[int, float]:
    """Read what _send_for sends: (bytes, seconds from the first chunk's flag to the end flag)."""
    received, first = 0, None
    while True:
        flag = _recv_exactly(sock, 1)
        if first is None:
            first = time.monotonic()
        if flag == b"\x00":
            return received, time.monotonic() - first
        _recv_exactly(sock, CHUNK)
        received += CHUNK


def _measure(sock: socket.socket, seconds: float, measure: tuple[str, ...]) -> dict:
    """The client's side of one pair: round trips, then bulk data out and back (the server answers each), each
    only where MEASURE asks for it."""
    entry: dict = {}
    if "rtt" in measure:
        rtts = []
        for _ in range(PINGS + 1):
            t0 = time.monotonic()
            sock.sendall(b"p")
            _recv_exactly(sock, 1)
            rtts.append(time.monotonic() - t0)
        # The first one warms the path up. The fastest of the others is the path's round trip: a busy host (a node's
        # process waiting for a CPU) only adds to a round trip, never takes from it. The median of ten showed 64
        # healthy containers on two cores a node "slow with 5 of its 8 partners" (1.83 ms against 0.38 ms).
        entry["rtt_ms"] = round(min(rtts[1:]) * 1000, 4)
    if "throughput" in measure:
        _send_for(sock, seconds)
        got, took = _readline(sock).split()[:2]
        received, down_seconds = _receive_stream(sock)
        entry.update(out_mbps=_mbps(int(got), float(took)), in_mbps=_mbps(received, down_seconds))
    return entry


def _mbps(size: int, seconds: float) -> float | None:
    return round(size * 8 / seconds / 1e6, 1) if seconds > 0 else None


def _serve(sock: socket.socket, seconds: float, measure: tuple[str, ...]) -> None:
    """The server's side of one pair (every node is given the same MEASURE)."""
    if "rtt" in measure:
        for _ in range(PINGS + 1):
            sock.sendall(_recv_exactly(sock, 1))
    if "throughput" in measure:
        received, took = _receive_stream(sock)
        sock.sendall(f"{received} {took:.6f}\n".encode())
        _send_for(sock, seconds)
    sock.recv(1)  # the client closes first


def _connect(address: str, port: int, source: str, until: float) -> socket.socket:
    while True:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.bind((source, 0))
            sock.settimeout(max(0.5, min(CONNECT_TIMEOUT, until - time.monotonic())))
            sock.connect((address, port))
            return sock
        except OSError:
            sock.close()
            if time.monotonic() + RETRY_AFTER >= until:
                raise
            time.sleep(RETRY_AFTER)


def perf_rounds(
    me: str,
    peers: dict[str, str],
    port: int,
    listener: socket.socket,
    seconds: float,
    measure: tuple[str, ...],
    rounds: list[list[tuple[str, str]]],
    start: float,
) -> list[dict]:
    """Round trip time and throughput with this node's partner of each of ROUNDS (schedule()), one at a time: the
    first node of a pair connects, the second serves. Round r ends at START + ROUND_SECONDS * (r + 1) (monotonic
    time, the same moment on every node: the shared deadline). A node that is ahead goes on at once (its
    connection queues at the partner's listener, which serves it when it gets there), so no node is ever in two
    measurements at once; a partner that did not come by the round's end is given up, and a round that ended
    before this node got to it is skipped, so one missing or slow node costs only the pairs it is in."""
    results: list[dict] = []
    early: dict[tuple[str, int], socket.socket] = {}  # connections of later rounds that came in first
    for number, pairs in enumerate(rounds):
        pair = next((p for p in pairs if me in p), None)
        if pair is None:
            continue
        partner = pair[1] if pair[0] == me else pair[0]
        entry: dict = {"peer": partner, "round": number}
        ends = start + ROUND_SECONDS * (number + 1)
        sock = None
        if time.monotonic() >= ends:
            if (partner, number) in early:
                early.pop((partner, number)).close()
            entry["error"] = f"skipped: {me} was behind the schedule (round {number} had ended)"
            results.append(entry)
            continue
        try:
            if pair[0] == me:
                sock = _connect(peers[partner], port, peers[me], ends)
                sock.settimeout(max(0.5, ends - time.monotonic()))  # the partner may still be in an earlier round
                sock.sendall(f"PERF {me} {number}\n".encode())
                entry.update(_measure(sock, seconds, measure))
            else:
                sock = early.pop((partner, number), None)
                while sock is None and time.monotonic() < ends:
                    listener.settimeout(max(0.05, ends - time.monotonic()))
                    try:
                        conn, _ = listener.accept()
                    except TimeoutError:
                        break
                    conn.settimeout(max(0.5, ends - time.monotonic()))
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    try:
                        words = _readline(conn).split()
                    except (OSError, ValueError):
                        conn.close()
                        continue
                    if len(words) == 3 and words[0] == "PERF" and (words[1], words[2]) == (partner, str(number)):
                        sock = conn
                    elif len(words) == 3 and words[0] == "PERF" and words[2].isdigit() and int(words[2]) > number:
                        stale = early.pop((words[1], int(words[2])), None)
                        if stale is not None:  # the partner tried again: the newer connection is the one it waits on
                            stale.close()
                        early[(words[1], int(words[2]))] = conn
                    else:  # a round this node has left behind, or not the probe
                        conn.close()
                if sock is None:
                    raise TimeoutError(f"{partner} did not connect in round {number}")
                sock.settimeout(max(0.5, ends - time.monotonic()))
                _serve(sock, seconds, measure)
                entry["served"] = True
        except (OSError, ValueError) as exc:
            entry["error"] = str(exc) or type(exc).__name__
        finally:
            if sock is not None:
                sock.close()
        results.append(entry)
    for conn in early.values():
        conn.close()
    return results


def drain(selector: selectors.BaseSelector, key, peers: dict[str, str], me: str, incoming: list[dict]) -> None:
    """Read from an accepted connection; at its end, count it among INCOMING (marked when it came from a peer)."""
    try:
        data = key.fileobj.recv(64)
    except OSError:
        data = b""
    if not data:
        selector.unregister(key.fileobj)
        key.fileobj.close()
        key.data["peer"] = key.data["from"] in {addr for name, addr in peers.items() if name != me}
        incoming.append(key.data)


def accept(selector: selectors.BaseSelector, listener, hostname: str) -> None:
    try:
        conn, (peer_addr, _) = listener.accept()
    except OSError:
        return
    try:
        conn.setblocking(True)
        conn.settimeout(1.0)
        conn.sendall(TOKEN + hostname.encode() + b"\n")
    except OSError:
        conn.close()
        return
    conn.setblocking(False)
    selector.register(conn, selectors.EVENT_READ, {"from": peer_addr, "port": listener.getsockname()[1]})


def parse_peers(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """--peers' list: one node per line, NAME ADDRESS [HOSTNAME]; (name -> address, name -> hostname where given).
    ValueError names a line that is not one."""
    peers: dict[str, str] = {}
    hostnames: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) > 3 or len(fields) < 2:
            raise ValueError(f"line {number}: expected NAME ADDRESS [HOSTNAME], not {line.strip()!r}")
        peers[fields[0]] = fields[1]
        if len(fields) == 3:
            hostnames[fields[0]] = fields[2]
    if not peers:
        raise ValueError("no node listed")
    return peers, hostnames


def parse_rounds(text: str) -> int | None:
    """--rounds: a positive number, or 'all' (None: every pair)."""
    if text == "all":
        return None
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a number of rounds (1 or more) or 'all', not {text!r}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
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
    args = parser.parse_args(argv)
    if args.command == "free-port":
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            print(sock.getsockname()[1])
        return 0
    if args.command == "wait-ready":
        give_up = time.monotonic() + args.timeout
        while not os.path.exists(args.file):
            if time.monotonic() >= give_up or (args.other and os.path.exists(args.other)):
                print(json.dumps({"ready": False}))
                return 1
            time.sleep(0.05)
        print(json.dumps({"ready": True}))
        return 0
    if args.command == "go":
        write_atomic(args.file, f"{args.seconds:g}\n")
        return 0
    try:
        if args.peers == "-":
            text = sys.stdin.read()
        else:
            with open(args.peers) as fh:
                text = fh.read()
        peers, hostnames = parse_peers(text)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        parser.error(f"--peers {args.peers}: {exc}")
    if args.me not in peers:
        parser.error(f"--self {args.me} is not among the nodes --peers lists")
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
    )
    print(json.dumps(summarise(record, peers)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
