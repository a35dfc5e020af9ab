"""A sample of this node's own ephemeral port range, listened on by the network probe (standard library only).

gloo and NCCL listen on ports the kernel picks (a bind to port 0) from /proc/sys/net/ipv4/ip_local_port_range, not
on the rendezvous port: a firewall that drops part of that range lets the rendezvous through and hangs every
collective. So the probe also listens on a few ports spread over the node's own range, one drawn (by the run's
seed) from each of COUNT equal slices, and every peer connects to them: a rule that covers a slice is found before
any torch job runs.
"""

from __future__ import annotations

import errno
import random

RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
COUNT = 8  # ports sampled: one per eighth of the range (28232 ports by default: a slice of 3529)
TRIES = 5  # ports tried within a slice when one is in use


def local_range(path: str = RANGE_FILE) -> tuple[int, int] | None:
    """The node's ip_local_port_range ("32768\t60999"), or None where it cannot be read."""
    try:
        with open(path) as fh:
            low, high = (int(word) for word in fh.read().split()[:2])
    except (OSError, ValueError):
        return None
    return (low, high) if 0 < low <= high <= 65535 else None


def slices(low: int, high: int, count: int = COUNT) -> list[tuple[int, int]]:
    """LOW..HIGH cut into COUNT equal slices (fewer when the range is smaller), each (first, last)."""
    count = max(1, min(count, high - low + 1))
    width = (high - low + 1) / count
    return [(low + int(i * width), low + int((i + 1) * width) - 1) for i in range(count)]


def candidates(low: int, high: int, seed: int, avoid: set[int], count: int = COUNT) -> list[list[int]]:
    """For each slice of LOW..HIGH, the ports to try in turn (the seed's draw first), none of AVOID."""
    rng = random.Random(seed)
    tries = []
    for first, last in slices(low, high, count):
        ports = [p for p in (rng.randint(first, last) for _ in range(TRIES)) if p not in avoid]
        tries.append(list(dict.fromkeys(ports)))
    return tries


def open_sample(address: str, seed: int, avoid: set[int], opener, path: str = RANGE_FILE) -> dict:
    """Listeners on one port of each slice of the node's range (OPENER: mesh.open_listener); a port in use is
    replaced by another of its slice. Returns {"range", "seed", "listeners": [(socket, port)], "failed": [state]}."""
    found = local_range(path)
    sample: dict = {"range": list(found) if found else None, "seed": seed, "listeners": [], "failed": []}
    if found is None:
        return sample
    for tries in candidates(found[0], found[1], seed, avoid):
        sock, state = _first_free(address, tries, opener)
        if sock is not None:
            sample["listeners"].append((sock, state["port"]))
        elif state:
            sample["failed"].append(state)
    return sample


def _first_free(address: str, ports: list[int], opener) -> tuple:
    """The first of PORTS that can be listened on: (socket, state), or (None, the last failure's state)."""
    sock, state = None, {}
    for port in ports:
        sock, state = opener(address, port)
        if sock is not None or state.get("errno") != errno.EADDRINUSE:
            break
    return sock, state
