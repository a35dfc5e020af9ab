"""A stalled torch job explained by its ranks' connections (pure logic; stages/runner.py reads each rank's TCP rows
on its node, before the job is stopped).

A hang that every node shares ("every node waits at step 0") has a cause the heartbeats cannot show: the ranks wait
for each other. Their sockets can: a rank's connection stuck in SYN_SENT to an address and port (RFC 9293, 3.3.2:
a SYN sent, no answer) waits for the node that owns that address. Where that node's rank LISTENs on that port, the
port is right and the SYN never reached it, or its answer never came back: that node's firewall drops it (a REJECT
would have ended the attempt at once, gloo then retries). Its rules that cover the port are quoted where the facts
read them (facts/firewall.py).
"""

from __future__ import annotations

from collections import defaultdict

from clustercheck.facts.firewall import covering
from clustercheck.facts.sockets import Socket, parse_rows

SHOWN = 3  # waits named in the message (every one is in the data)


def _names(nodes: list[str]) -> str:
    return nodes[0] if len(nodes) == 1 else ", ".join(nodes[:-1]) + " and " + nodes[-1]


def explain(
    rows: dict[str, list[list[str]]],
    addresses: dict[str, set[str]],
    rules: dict[str, tuple[str, ...]] | None = None,
) -> tuple[tuple[str, ...], str, dict] | None:
    """ROWS: node -> each of its ranks' raw TCP rows (remote/heartbeats.py --sockets); ADDRESSES: node -> its
    addresses; RULES: node -> its rules that match a destination port. Returns (the nodes waited for, what the
    connections say, the data), or None when no rank waits to connect."""
    rules = rules or {}
    owner = {address: node for node, owned in addresses.items() for address in owned}
    sockets = {node: [s for ranks in per_rank for s in parse_rows(ranks)] for node, per_rank in rows.items()}
    listening = {node: {s.local_port for s in found if s.state == "LISTEN"} for node, found in sockets.items()}
    waits: dict[tuple[str, int], set[str]] = defaultdict(set)
    for node, found in sockets.items():
        for s in found:
            if s.state == "SYN_SENT":
                waits[(owner.get(s.remote, s.remote), s.remote_port)].add(node)
    if not waits:
        return None
    texts, data = [], []
    for (target, port), sources in sorted(waits.items(), key=lambda w: (-len(w[1]), w[0])):
        text, said = _wait(target, port, sorted(sources), target in rows, port in listening.get(target, set()))
        quoted = covering(rules.get(target, ()), port)
        if quoted:
            text += f"; {target}'s rule covering it: `{quoted[0]}`"
        texts.append(text)
        data.append({"to": target, "port": port, "from": sorted(sources), "listening": said, "rules": quoted})
    more = f"; and {len(texts) - SHOWN} more" if len(texts) > SHOWN else ""
    waited = tuple(sorted({w["to"] for w in data if w["to"] in rows}))
    found = {"waits": data, "sockets": _counted(sockets), "fix": _fix(data)}
    return waited, "; ".join(texts[:SHOWN]) + more, found


def _fix(waits: list[dict]) -> str:
    """What to do about the first wait: the node that drops, or the port nobody listens on."""
    first = waits[0]
    if first["listening"]:
        rule = f"ahead of its rule `{first['rules'][0]}`" if first["rules"] else "ahead of the rule that drops them"
        return (
            f"On {first['to']}, allow TCP from the cluster network to the ports its ranks listen on (its "
            f"ip_local_port_range: `cat /proc/sys/net/ipv4/ip_local_port_range`) {rule}; inspect with `iptables -S`, "
            "`nft list ruleset`. The network stage's network.ports samples that range on every node."
        )
    return (
        f"Nothing listens on {first['to']}:{first['port']} where {', '.join(first['from'])} connect: check the "
        "addresses the ranks announce (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME) and that the node's ranks started."
    )


def _wait(target: str, port: int, sources: list[str], in_job: bool, listens: bool) -> tuple[str, bool | None]:
    verb = "waits" if len(sources) == 1 else "wait"
    head = f"{_names(sources)} {verb} to connect to {target}:{port}"
    if not in_job:
        return f"{head} (an address no node of the job has)", None
    if listens:
        return f"{head} (a port {target}'s rank listens on): {target} drops or rejects it", True
    return f"{head} (no rank of {target} listens on it)", False


def _counted(sockets: dict[str, list[Socket]]) -> dict[str, dict[str, int]]:
    """Per node, its ranks' sockets by state."""
    counted: dict[str, dict[str, int]] = {}
    for node, found in sockets.items():
        by = counted.setdefault(node, {})
        for s in found:
            by[s.state] = by.get(s.state, 0) + 1
    return counted
