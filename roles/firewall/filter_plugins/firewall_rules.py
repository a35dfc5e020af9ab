"""Which ufw rules the firewall role added and the settings no longer ask for. Pure logic, used by the role.

ufw only ever adds: after admin_cidr is narrowed (or the cluster network moves), the rule for the old network
stays and still lets it in. The role's own rules carry its comments ("clustercheck ..."); `ufw show added`
lists every added rule as a ufw command, normalised by ufw (`allow proto tcp from any to any port 22` becomes
`allow 22/tcp`, 10.1.0.5/16 becomes 10.1.0.0/16). Both sides are parsed into the same form and compared without
their comments (ufw itself treats a rule that differs only in its comment as the same rule).
"""

from __future__ import annotations

import ipaddress
import shlex

OWN_COMMENT = "clustercheck "
ACTIONS = ("allow", "deny", "reject", "limit")
ANY = "any"


def _address(text: str) -> str:
    if text.lower() in (ANY, "0.0.0.0/0", "::/0"):
        return ANY
    try:
        return str(ipaddress.ip_network(text, strict=False))
    except ValueError:
        return text


def parse_rule(spec: str) -> dict | None:
    """A ufw rule command (with or without the leading `ufw`) as a dict; None for what is not a plain rule
    (route rules, app profiles, anything this parser does not know): such rules are never touched."""
    try:
        words = shlex.split(spec)
    except ValueError:
        return None
    if words[:1] == ["ufw"]:
        words = words[1:]
    if not words or words[0] not in ACTIONS:
        return None
    rule = {
        "action": words[0],
        "direction": "in",
        "on": "",
        "log": "",
        "proto": ANY,
        "from": ANY,
        "from_port": "",
        "to": ANY,
        "to_port": "",
        "comment": "",
    }
    rest = words[1:]
    if rest[:1] in (["in"], ["out"]):
        rule["direction"], rest = rest[0], rest[1:]
    if rest[:1] in (["log"], ["log-all"]):
        rule["log"], rest = rest[0], rest[1:]
    if rest and rest[0] not in ("on", "proto", "from", "to", "comment"):  # simple form: PORT[/PROTO]
        port, _, proto = rest[0].partition("/")
        rule["to_port"], rule["proto"], rest = port, proto or ANY, rest[1:]
    last = ""
    while rest:
        if len(rest) < 2:
            return None
        key, value, rest = rest[0], rest[1], rest[2:]
        if key in ("from", "to"):
            rule[key], last = _address(value), key
        elif key == "port" and last:
            rule[f"{last}_port"] = value
        elif key in ("on", "proto", "comment"):
            rule[key] = value
        else:  # app profiles and what else ufw knows: not ours to judge
            return None
    return rule


def _same(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if k != "comment"} == {k: v for k, v in b.items() if k != "comment"}


def lets_in(rule: dict, address: str, port: str) -> bool:
    """True when RULE allows a TCP connection from ADDRESS to PORT."""
    if rule["action"] not in ("allow", "limit") or rule["direction"] != "in" or not address:
        return False
    if rule["proto"] not in (ANY, "tcp") or rule["from_port"]:
        return False
    if rule["to_port"] and str(port) not in _ports(rule["to_port"]):
        return False
    if rule["from"] == ANY:
        return True
    try:
        return ipaddress.ip_address(address) in ipaddress.ip_network(rule["from"], strict=False)
    except ValueError:
        return False


def _ports(text: str) -> set[str]:
    ports: set[str] = set()
    for part in text.split(","):
        low, _, high = part.partition(":")
        if low.isdigit() and high.isdigit():
            ports.update(str(p) for p in range(int(low), int(high) + 1))
        else:
            ports.add(low)
    return ports


def stale_rules(show_added: str, wanted: list[str], controller: str = "", controller_port: str = "22") -> list[str]:
    """The rules to delete, as `ufw delete` arguments: those in `ufw show added` (SHOW_ADDED) that carry the
    role's comment and that no rule in WANTED asks for. A rule that lets the control machine (CONTROLLER,
    connected to CONTROLLER_PORT) in is kept unless a wanted rule lets it in too: the role never cuts the
    connection it runs over."""
    wanted_rules = [r for r in (parse_rule(s) for s in wanted) if r is not None]
    keeps_controller = any(lets_in(r, controller, controller_port) for r in wanted_rules)
    stale = []
    for line in show_added.splitlines():
        if not line.startswith("ufw "):
            continue
        rule = parse_rule(line)
        if rule is None or not rule["comment"].startswith(OWN_COMMENT):
            continue
        if any(_same(rule, w) for w in wanted_rules):
            continue
        if controller and lets_in(rule, controller, controller_port) and not keeps_controller:
            continue
        stale.append(line[len("ufw ") :])
    return stale


def rail_networks(facts: dict, interfaces: list) -> list[str]:
    """The network (CIDR) of each interface in INTERFACES (cluster_rail_interfaces), from the node's Ansible facts
    (FACTS: ansible_facts): the rails' addresses are the user's network's, the role only lets them in."""
    networks = []
    for name in interfaces or []:
        ipv4 = (facts.get(str(name).replace("-", "_")) or {}).get("ipv4") or {}
        if not ipv4.get("address") or not ipv4.get("netmask"):
            raise ValueError(
                f"cluster_rail_interfaces names {name}, which has no IPv4 address on this node: give each rail its "
                "address (netplan, DHCP) before the firewall role, or leave it out of cluster_rail_interfaces"
            )
        network = str(ipaddress.ip_network(f"{ipv4['address']}/{ipv4['netmask']}", strict=False))
        if network not in networks:
            networks.append(network)
    return networks


def rail_rules(networks: list[str]) -> list[str]:
    """The rule letting each rail network in, as the cluster network's."""
    return [f"allow from {network} comment 'clustercheck rail network'" for network in networks]


class FilterModule:
    def filters(self):
        return {
            "firewall_stale_rules": stale_rules,
            "firewall_rail_networks": rail_networks,
            "firewall_rail_rules": rail_rules,
        }
