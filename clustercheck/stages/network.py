"""The network stage: a TCP probe on every node at once (python3 only, no torch), before any torch job.

Every node listens on the master port and an ephemeral port, connects to every other node on both, resolves
every node's hostname and reads its cluster interface's MTU; checks/network.py judges the records.
"""

from __future__ import annotations

import json
import random

from clustercheck.checks import network
from clustercheck.model import CheckResult, Status
from clustercheck.run.fanout import fanout
from clustercheck.stages import Context, Member, remote

NAME = "network"
NEEDS_TORCH = False
EPHEMERAL_RANGE = (49152, 60999)  # IANA dynamic ports, below Linux's default ip_local_port_range top


def pick_ephemeral_port(rng: random.Random | None = None) -> int:
    """A port from the dynamic range for the second probe; the same on every node of one run."""
    return (rng or random.SystemRandom()).randint(*EPHEMERAL_RANGE)


def mesh_args(me: str, peers: list[network.Peer], ports: list[int], duration: float) -> list[str]:
    """The probe's arguments on node ME."""
    args = ["mesh", "--self", me, "--duration", f"{duration:g}"]
    for peer in peers:
        args += ["--peer", f"{peer.name}={peer.address}"]
        if peer.hostname and peer.hostname != peer.name:
            args += ["--hostname-of", f"{peer.name}={peer.hostname}"]
    for port in ports:
        args += ["--port", str(port)]
    return args


def run(members: list[Member], ctx: Context) -> list[CheckResult]:
    config = ctx.config
    port = pick_ephemeral_port()
    peers = [network.Peer(m.name, m.address, m.hostname) for m in members]
    records: dict[str, dict] = {}
    errors: dict[str, str] = {}

    def probe(m: Member) -> None:
        remote.install(m.transport)
        args = mesh_args(m.name, peers, [config.master_port, port], config.network_duration)
        command = remote.command(m.facts.python, m.transport.workdir, "netprobe", *args)
        answer = m.transport.run(command, timeout=config.network_duration + 30)
        (config.host_dir(m.name) / "network.json").write_text(answer.stdout)
        (config.host_dir(m.name) / "network.stderr").write_text(answer.stderr)
        try:
            records[m.name] = json.loads(answer.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            errors[m.name] = answer.cause()

    outcomes = fanout(probe, members, name=lambda m: m.name)
    for i, m in enumerate(members):
        if isinstance(outcomes.get(i), BaseException):  # one node's trouble is that node's network.probe ERROR
            exc = outcomes[i]
            errors[m.name] = f"{type(exc).__name__}: {exc}"
    results = network.evaluate(
        records, peers, master=members[0].name, master_port=config.master_port, errors=errors, cidr=None
    )
    if len(members) == 1:  # one node: the ranks meet on 127.0.0.1 whatever the hostname resolves to
        name = members[0].name
        results = [r for r in results if r.name != "network.resolve"]
        results.append(
            CheckResult(
                "network.resolve",
                Status.SKIP,
                f"{name}: one node: its ranks meet on 127.0.0.1 (hostname.resolve covers its own name)",
                host=name,
            )
        )
    return results
