"""The network probe's mesh (standard library only): this node listens on the probe's ports, answering every
connection with a token naming the node (so a connection that reaches some other service is not taken for
success), connects to every peer on every port a few at a time, and counts the connections its peers made to it.
One selector drives it all, listeners and connections alike.

With a go file the mesh runs in two phases (`Mesh.barrier`): it listens (and answers) until the controller writes
the go file, once every node listens; the file holds the seconds connection attempts may run from then on.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import selectors
import socket
import time

from .netinfo import port_holders

TOKEN = b"clustercheck-netprobe "
CONNECT_TIMEOUT = 2.0
RETRY_AFTER = 0.3
SOURCE_PORTS_KEPT = 4  # the source ports of a connection's first attempts, kept in its result
# Connections a probe has in flight at once: every node opening all its 2 (N-1) connections at the same instant is
# a burst of SYNs and ARP requests (64 nodes: 8064 at once) that a switch's flood protection may drop; a few at a
# time stays far below that and still tries every pair within the connect window.
IN_FLIGHT = 8


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
        # The ephemeral port this attempt leaves from (its replies come back to it): a failure that is this node's
        # own (a rule here dropping the replies to that port) is told by it (checks/network.py).
        ports = self.result.setdefault("source_ports", [])
        if len(ports) < SOURCE_PORTS_KEPT:
            ports.append(self.sock.getsockname()[1])
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
    """The connect window the go file grants, or None while there is no go file. The file holds the seconds, or
    {"window": SECONDS, "samples": {node: [port, ...]}} where the probes sample their ephemeral ranges."""
    try:
        with open(path) as fh:
            text = fh.read().strip()
        if text.startswith("{"):
            return float(json.loads(text)["window"])
        return float(text or "0")
    except (OSError, ValueError, KeyError, TypeError):
        return None


def go_samples(path: str) -> dict[str, list[int]]:
    """The sampled ports of every node that listened on some, as the go file gives them ({} where it gives none)."""
    try:
        with open(path) as fh:
            samples = json.loads(fh.read()).get("samples") or {}
    except (OSError, ValueError, AttributeError):
        return {}
    return {str(node): [int(p) for p in ports] for node, ports in samples.items() if isinstance(ports, list)}


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


class Mesh:
    """This node's side of the mesh: ME among PEERS (name -> address), listening on PORTS on its own address, with
    the connections in (`incoming`) from the moment it listens."""

    def __init__(
        self, me: str, peers: dict[str, str], ports: list[int], hostname: str, sampled: list | None = None
    ) -> None:
        """SAMPLED: (listener, port) for each port of this node's ephemeral range sampled (portsample.py)."""
        self.me, self.peers, self.ports, self.hostname = me, peers, ports, hostname
        self.address = peers[me]
        self.selector = selectors.DefaultSelector()
        self.listen_states: list[dict] = []
        self.incoming: list[dict] = []
        self.sample_ports = [port for _, port in sampled or []]
        self.peer_samples: dict[str, list[int]] = {}  # every other node's sampled ports, from the go file
        self.samples_known = False  # the go file gave the peers this node's sampled ports
        self.sample_outgoing: list[dict] = []  # the connections out to the peers' sampled ports
        for port in ports:
            sock, state = open_listener(self.address, port)
            self.listen_states.append(state)
            if sock:
                self.selector.register(sock, selectors.EVENT_READ, "listener")
        for sock, _ in sampled or []:
            self.selector.register(sock, selectors.EVENT_READ, "listener")

    def serve(self, timeout: float) -> None:
        """One turn of the selector: connections out moved on, connections in accepted and read."""
        for key, _ in self.selector.select(timeout=timeout):
            if isinstance(key.data, Attempt):
                key.data.on_event(self.selector, time.monotonic())
            elif key.data == "listener":
                accept(self.selector, key.fileobj, self.hostname)
            else:
                drain(self.selector, key, self.peers, self.me, self.incoming)

    def barrier(self, go_file: str, ready_file: str | None, ready_timeout: float, started: float) -> tuple[dict, float]:
        """Phase one: READY_FILE written, then listening (and answering) until the controller writes GO_FILE, for
        READY_TIMEOUT seconds at most. Returns what the barrier saw (seconds from STARTED until ready and until the
        go signal; no_go without one) and the connect window the go file grants (0 without one)."""
        if ready_file:
            listening = [s["port"] for s in self.listen_states if s["ok"]]
            write_atomic(ready_file, json.dumps({"listening": listening, "sample": self.sample_ports}))
        barrier: dict = {"ready_after": round(time.monotonic() - started, 3), "go_after": None}
        give_up = time.monotonic() + ready_timeout
        window = read_go(go_file)
        while window is None and time.monotonic() < give_up:
            self.serve(0.05)
            window = read_go(go_file)
        if window is None:
            barrier["no_go"] = True  # the connections out are reported as not tried
            return barrier, 0.0
        barrier["go_after"] = round(time.monotonic() - started, 3)
        samples = go_samples(go_file)
        self.samples_known = self.me in samples
        self.peer_samples = {n: p for n, p in samples.items() if n in self.peers and n != self.me}
        return barrier, window

    def connect(self, deadline: float, no_go: bool = False) -> list[dict]:
        """Phase two: every peer on every port until DEADLINE (monotonic), or until every connection out is done
        and every peer connected in; returns each connection out's outcome, by peer and port. NO_GO: the barrier
        gave no go signal (DEADLINE has passed already)."""
        # A connection in is counted when the connector closes, after reading the token.
        known = len(self.sample_ports) if self.samples_known else 0  # the peers connect to them only if told
        listening = sum(1 for s in self.listen_states if s["ok"] and not s.get("perf")) + known
        expected_in = (len(self.peers) - 1) * listening
        # Each node starts with the peers after it in the list, so the nodes do not all connect to the same one first.
        names = list(self.peers)
        order = names[names.index(self.me) + 1 :] + names[: names.index(self.me)]
        attempts = [Attempt(name, self.peers[name], port, self.address) for name in order for port in self.ports]
        sampled = [
            Attempt(name, self.peers[name], port, self.address)
            for name in order
            for port in self.peer_samples.get(name, [])
        ]
        attempts += sampled
        if no_go:
            for attempt in attempts:
                attempt.result["detail"] = "no go signal from the controller"
        while time.monotonic() < deadline:
            self._attempt(attempts, time.monotonic())
            # Only connections from peers count: a stray scanner must not end the probe early.
            if all(a.done for a in attempts) and sum(1 for c in self.incoming if c["peer"]) >= expected_in:
                break
            self.serve(0.05)
        for attempt in attempts:
            attempt.close(self.selector)
            attempt.result.pop("connected", None)
        self.sample_outgoing = [a.result for a in sorted(sampled, key=lambda a: (a.name, a.port))]
        return [a.result for a in sorted(attempts[: len(attempts) - len(sampled)], key=lambda a: (a.name, a.port))]

    def _attempt(self, attempts: list[Attempt], now: float) -> None:
        """The attempts past CONNECT_TIMEOUT given up, and the waiting ones started, IN_FLIGHT at a time at most."""
        in_flight = 0
        for attempt in attempts:
            if attempt.sock is not None and now - attempt.started > CONNECT_TIMEOUT:
                attempt.timed_out(self.selector, now)
            in_flight += attempt.sock is not None
        # Attempts never tried come first, so every pair is tried at least once before any is retried.
        waiting = [a for a in attempts if not a.done and a.sock is None and now >= a.next_try]
        waiting.sort(key=lambda a: a.result["attempts"])
        for attempt in waiting[: max(0, IN_FLIGHT - in_flight)]:
            attempt.start(self.selector, now)

    def close(self) -> None:
        """Every listener and connection in closed."""
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()
        self.selector.close()
