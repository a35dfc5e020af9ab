"""A node's own connections that fail because its firewall drops their replies: a rule that filters a port range
with no connection state matches the answers to the node's own connections whose source port the kernel drew from
that range (network.tcp names the rule; network.ports, for the sampled ports, the node). Pure judgement."""

from __future__ import annotations

from clustercheck.checks.registry import emit
from clustercheck.facts import firewall
from clustercheck.model import CheckResult, Status


def remedy(node: str) -> str:
    """The first words of the fix for NODE's own connections whose replies its firewall drops (network.tcp, and
    network.ports for the sampled ports)."""
    return (
        f"On {node}, let established connections' replies in ahead of its other rules (`iptables -I INPUT -m "
        "conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT`),"
    )


def own_rules(outs: list[dict], rules: tuple[str, ...]) -> list[str]:
    """The rules of the connecting node (RULES) that drop or reject, with no connection state, the ports every
    failed attempt of OUTS left from: the replies to them never get in. [] when one attempt's port is not covered
    so, or the attempts' ports are not known."""
    stateless = [r for r in rules if firewall.drops(r) and not firewall.stateful(r)]
    left_from = [p for o in outs for p in o.get("source_ports", [])]
    if not stateless or not left_from or any(o["result"] not in ("timeout", "refused", "reset") for o in outs):
        return []
    covering = [firewall.covering(stateless, port) for port in left_from]
    if not all(covering):
        return []
    return list(dict.fromkeys(rule for found in covering for rule in found))


def lost(
    src: str, dst: str, outs: list[dict], reached: list[str], address: dict[str, str], quoted: list[str]
) -> CheckResult:
    """The FAIL of SRC's connections to DST whose source ports SRC's own rules (QUOTED) drop or reject with no
    connection state: the replies never got in. REACHED: the nodes DST accepted the same ports from."""
    left_from = sorted({p for o in outs for p in o.get("source_ports", [])})
    shown = ", ".join(f"{o['port']} ({o['result']}: {o['detail']})" for o in outs)
    accepted = f"{dst} accepted the same port(s) from {', '.join(reached)}; " if reached else ""
    message = (
        f"{src} -> {dst} ({address.get(dst, '?')}): port(s) {shown}; {accepted}the replies to {src}'s own "
        f"ephemeral port(s) {', '.join(map(str, left_from))} never got in: {src}'s own rule drops that port range "
        "with no connection state, so its connections out fail whenever the kernel picks a source port there; "
        f"{src}'s rule: " + "; ".join(f"`{rule}`" for rule in quoted[:2])
    )
    message += f" (and {len(quoted) - 2} more)" if len(quoted) > 2 else ""
    return emit(
        "network.tcp",
        Status.FAIL,
        message,
        host=src,
        remediation=remedy(src)
        + " or make the rule that covers its ephemeral range match new connections only (`-m conntrack --ctstate "
        "NEW`); inspect with `iptables -S`, `nft list ruleset`.",
        data={"from": src, "to": dst, "cause": "replies lost", "side": "source", "results": outs, "rules": quoted},
    )
