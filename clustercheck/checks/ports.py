"""The ports torch's collectives listen on, sampled by the network probe (pure logic, no I/O).

gloo and NCCL listen on ports the kernel picks from the node's ip_local_port_range (a bind to port 0), not on the
rendezvous port. A firewall rule that drops or rejects part of that range lets the rendezvous and the probe's own
ports through and hangs every collective at its first connection. So every probe listens on a port drawn from each
eighth of its own range (remote/portsample.py) and every peer connects to them: a port no peer reached is in a
part of the range the node does not accept, and the node's rule covering it is quoted where its rules were read
(facts/firewall.py).
"""

from __future__ import annotations

from clustercheck.checks import replies
from clustercheck.checks.network import STAGE
from clustercheck.checks.registry import declare, emit
from clustercheck.facts.firewall import covering, dport_ranges
from clustercheck.model import CheckResult, Status

declare(
    "network.ports",
    stage=STAGE,
    scope="cluster",
    proves="every node reaches every other node on a sample of that node's own ephemeral port range "
    "(ip_local_port_range, where gloo and NCCL listen: a port drawn from each eighth, anew each run), on the address "
    "training traffic uses (the interface NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME name, else the cluster interface)",
    fix="Allow TCP from the cluster network to the whole ephemeral port range (ip_local_port_range) on every node "
    "(the setup playbook's firewall role opens the cluster network).",
)

# What a failed connection to a listening port says the far side did with it.
DID = {"timeout": "drops", "refused": "rejects", "reset": "rejects"}
QUOTED = 2  # rules quoted in the message (all of them are in its data)


def sample_check(
    records: dict[str, dict], rules: dict[str, tuple[str, ...]], cidr: str | None = None
) -> list[CheckResult]:
    """network.ports from the probes' RECORDS (node -> record with its "sample"), RULES: node -> the firewall
    rules that match a destination port (facts' port_rules). One FAIL per node some peer could not reach on a
    sampled port, else one PASS."""
    sampled = {name: r["sample"] for name, r in records.items() if r.get("sample")}
    if not any(s.get("ports") for s in sampled.values()):
        return [emit("network.ports", Status.SKIP, "no node's probe sampled its ephemeral port range")]
    failed: dict[str, dict[int, dict[str, dict]]] = {}  # target -> port -> source -> its failed connection
    for source, sample in sorted(sampled.items()):
        for out in sample["outgoing"]["failed"]:
            failed.setdefault(out["to"], {}).setdefault(out["port"], {})[source] = out
    blocked, lost = _attributed(failed, sampled)
    results = [
        _unreached(node, sampled[node], blocked[node], sampled, rules.get(node, ()), cidr)
        for node in sorted(blocked)
        if node in sampled
    ]
    results += [_replies_lost(node, lost[node], cidr) for node in sorted(lost) if node not in blocked]
    if results:
        return results
    connections = sum(s["outgoing"]["ok"] for s in sampled.values())
    ranges = {n: s["range"] for n, s in sampled.items()}
    shown = sorted({f"{r[0]}-{r[1]}" for r in ranges.values() if r})
    return [
        emit(
            "network.ports",
            Status.PASS,
            f"every node reaches every other node's sampled ephemeral ports ({connections} connections; "
            f"range(s) {', '.join(shown) or 'unknown'})",
            data={"ranges": ranges, "ports": {n: s["ports"] for n, s in sampled.items()}, "seed": _seed(sampled)},
        )
    ]


def _attributed(
    failed: dict[str, dict[int, dict[str, dict]]], sampled: dict[str, dict]
) -> tuple[dict[str, dict[int, dict[str, dict]]], dict[str, list[dict]]]:
    """Which side each failed connection tells of. A connection carries the target's sampled port one way and the
    source's own ephemeral port the other (its replies): a port of the target that another peer reached is open on
    the target, so that source's failure there is its own (the replies to its ephemeral port dropped, a stateless
    rule on the source); a port every peer that tried failed on (or the only peer) is the target's. Returns the
    target -> port -> source -> failure of the ports the targets do not accept, and the source -> failures whose
    replies did not come back."""
    blocked: dict[str, dict[int, dict[str, dict]]] = {}
    lost: dict[str, list[dict]] = {}
    for target, by_port in failed.items():
        tried = {n for n, s in sampled.items() if n != target and target in s.get("peers", [])}
        for port, by_source in by_port.items():
            if len(tried) < 2 or set(by_source) >= tried:
                blocked.setdefault(target, {})[port] = by_source
            else:
                for source, out in by_source.items():
                    lost.setdefault(source, []).append(out)
    return blocked, lost


def _replies_lost(node: str, outs: list[dict], cidr: str | None) -> CheckResult:
    """The FAIL naming NODE, whose connections failed to ports its peers' other peers reached: the replies to its
    own ephemeral ports did not come back."""
    shown = ", ".join(f"{o['to']}:{o['port']} ({_said(o['result'])})" for o in outs[:4])
    more = f" and {len(outs) - 4} more" if len(outs) > 4 else ""
    source = cidr or "the cluster network"
    return emit(
        "network.ports",
        Status.FAIL,
        f"{node}'s connections to other nodes' sampled ephemeral ports failed where other nodes connected to the same "
        f"ports ({shown}{more}): the replies to {node}'s own ephemeral ports are dropped or rejected, most often by "
        f"a rule on {node} that filters its ephemeral range and lets no established connection through: every "
        "torch job with this node hangs or fails at its first connection",
        host=node,
        remediation=replies.remedy(node) + f" and allow TCP from {source} to its ephemeral range "
        "(ip_local_port_range); inspect with `iptables -S`, `nft list ruleset`.",
        data={"node": node, "replies_lost": outs},
    )


def _seed(sampled: dict[str, dict]) -> int | None:
    return next((s.get("seed") for s in sampled.values() if s.get("seed") is not None), None)


def _unreached(
    node: str,
    own: dict,
    failures: dict[int, dict[str, dict]],
    sampled: dict[str, dict],
    rules: tuple[str, ...],
    cidr: str | None,
) -> CheckResult:
    """The FAIL naming NODE, the part of its range its peers could not reach, and the rule that covers it."""
    tried = sorted(n for n, s in sampled.items() if n != node and node in s.get("peers", []))
    sources = sorted({source for by in failures.values() for source in by})
    blocked = sorted(failures)
    connected = sorted(int(p) for p, count in own.get("incoming", {}).items() if count and int(p) not in failures)
    kinds = sorted({DID.get(out["result"], "does not accept") for by in failures.values() for out in by.values()})
    did = kinds[0] if len(kinds) == 1 else "does not accept"
    low, high = own.get("range") or (min(blocked), max(blocked))
    quoted = list(dict.fromkeys(rule for port in blocked for rule in covering(rules, port)))
    spans = sorted({span for rule in quoted for span in dport_ranges(rule) if span[0] <= high and span[1] >= low})
    ports = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in spans)
    part = f"ports {ports}" if spans else "part"
    by_result = {}
    for port in blocked:
        results = {out["result"] for out in failures[port].values()}
        by_result.setdefault("/".join(sorted(results)), []).append(str(port))
    outcome = "; ".join(f"{', '.join(ps)} {_said(kind)}" for kind, ps in by_result.items())
    if connected:
        outcome += f"; {', '.join(map(str, connected))} connected"
    sender = "" if sources == tried or not tried else f" from {', '.join(sources)}"
    message = (
        f"{node} {did} new connections{sender} to {part} of its ephemeral range {low}-{high} (sampled {outcome}): "
        "gloo and NCCL listen there: a torch job with this node hangs or fails at its first connection"
    )
    if quoted:
        more = f" (and {len(quoted) - QUOTED} more)" if len(quoted) > QUOTED else ""
        message += f"; {node}'s rule: " + "; ".join(f"`{rule}`" for rule in quoted[:QUOTED]) + more
    source = cidr or "the cluster network"
    remedy = (
        f"On {node}, allow TCP from {source} to its ephemeral range {low}-{high} ahead of "
        f"{'that rule' if quoted else 'the rule that covers it'}: `iptables -I INPUT -s {source} -p tcp --dport "
        f"{low}:{high} -j ACCEPT` or `ufw allow from {source} to any port {low}:{high} proto tcp` (inspect with "
        "`iptables -S`, `nft list ruleset`); the setup playbook's firewall role opens the cluster network."
    )
    return emit(
        "network.ports",
        Status.FAIL,
        message,
        host=node,
        remediation=remedy,
        data={
            "node": node,
            "range": [low, high],
            "blocked": blocked,
            "connected": connected,
            "from": sources,
            "rules": quoted,
            "spans": [list(s) for s in spans],
            "seed": own.get("seed"),
            "results": {str(p): by for p, by in failures.items()},
        },
    )


def _said(result: str) -> str:
    return {"timeout": "timed out", "refused": "refused", "reset": "reset"}.get(result, result)
