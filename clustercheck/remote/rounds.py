"""Round trip time and TCP throughput between the nodes (standard library only), measured by the network probe
after its mesh: one partner per round, in rounds of disjoint pairs (`schedule`), so that no node is in two
measurements at once; the first node of a pair connects and measures, the second serves. The rounds are paced from
the shared deadline (`perf_rounds`), so that no missing or slow node holds the others up.
"""

from __future__ import annotations

import os
import random
import socket
import time

from .mesh import CONNECT_TIMEOUT, RETRY_AFTER

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
                    except socket.timeout:  # noqa: UP041 (Python 3.8 on the node: not TimeoutError before 3.10)
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
