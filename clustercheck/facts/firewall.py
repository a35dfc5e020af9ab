"""Whether anything filters the traffic that comes into a node, read from `ufw status`, `nft list ruleset` and
`iptables -S` (or `iptables-save`). Pure parsing; the collector gathers the three outputs (remote/facts.py).

"Filtered" means what a firewall is for: a packet no rule lets in is dropped. So the question asked of each input
hook is what happens to a packet that matches no condition: the rules are walked in order, conditional rules
(an address, a port, an interface, a connection state) are passed over, unconditional jumps are followed, and the
first unconditional verdict decides (accept, drop, reject); at the end of the hook's chain its policy does. A
drop that matches only some packets (Docker's isolation of its bridges, Kubernetes' KUBE-FIREWALL against
localnet spoofing, a fail2ban ban) filters nothing else: a node whose only rules are Docker's or Kubernetes' NAT
and FORWARD chains is open. nftables runs every base chain on the input hook and a packet must pass all of them
(nft(8), "CHAINS": a drop verdict is final, accept only ends the chain it is in), so one that drops by default is
enough. iptables' INPUT chain of the filter table is the input hook of that table.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

DROPPING = {"drop", "reject"}
NFT_VERDICT_WORDS = {"accept", "drop", "reject", "return", "jump", "goto", "queue", "continue"}
NON_TERMINATING = {"LOG", "NFLOG", "MARK", "CONNMARK", "CT", "AUDIT"}
NFT_STATEMENTS = re.compile(
    r'\bcounter(?: packets \d+ bytes \d+)?|\bcomment "[^"]*"|\blog(?: prefix "[^"]*")?(?: level \w+)?'
)
NFT_VERDICT = re.compile(r"^(accept|drop|reject(?: with .*)?|return|(?:jump|goto) (\S+))$")
OWNERS = (("DOCKER", "Docker"), ("KUBE-", "Kubernetes"), ("cali-", "Calico"), ("CNI-", "CNI"), ("ufw-", "ufw"))


@dataclass
class Chain:
    name: str
    table: str
    rules: list[str]  # each rule's text, as the tool prints it
    hook_input: bool = False  # a filter chain on the input hook
    policy: str = "accept"


def parse_nft(text: str) -> dict[str, Chain]:
    """`nft list ruleset` -> chains by "TABLE CHAIN" (a chain quoted without its table has table "")."""
    chains: dict[str, Chain] = {}
    table, chain = "", None
    for raw in text.splitlines():
        line = raw.strip()
        if match := re.match(r"table (\S+ \S+) \{$", line):
            table, chain = match[1], None
        elif match := re.match(r"chain (\S+) \{$", line):
            chain = chains.setdefault(f"{table} {match[1]}", Chain(match[1], table, []))
        elif chain is None or not line or line.startswith("#"):
            continue
        elif line == "}":
            chain = None
        elif line.startswith("type "):
            chain.hook_input = bool(re.match(r"type filter hook input\b", line))
            if policy := re.search(r"\bpolicy (\w+)", line):
                chain.policy = policy[1]
        else:
            chain.rules.append(line)
    return chains


def nft_verdict(rule: str) -> tuple[str, str | None] | None:
    """(verdict, jump target) of an nft rule that applies to every packet; None for a conditional rule."""
    rest = " ".join(NFT_STATEMENTS.sub(" ", rule).split())
    match = NFT_VERDICT.match(rest)
    if not match:
        return None
    word = match[1].split()[0]
    return word, match[2]


def parse_iptables(text: str) -> dict[str, Chain]:
    """`iptables -S` (or the filter table of `iptables-save`) -> the filter table's chains by name."""
    chains: dict[str, Chain] = {}
    table = "filter"
    for line in (ln.strip() for ln in text.splitlines()):
        if line.startswith("*"):
            table = line[1:]
        if table != "filter":
            continue
        if match := re.match(r"(?:-P |:)(\S+) (\S+)", line):
            chain = chains.setdefault(match[1], Chain(match[1], "filter", []))
            chain.policy = match[2].lower()
        elif match := re.match(r"-N (\S+)", line):
            chains.setdefault(match[1], Chain(match[1], "filter", []))
        elif match := re.match(r"-A (\S+) ", line):
            chains.setdefault(match[1], Chain(match[1], "filter", [])).rules.append(line)
    if "INPUT" in chains:
        chains["INPUT"].hook_input = True
    return chains


def iptables_verdict(rule: str) -> tuple[str, str | None] | None:
    """(verdict, jump target) of an `-A CHAIN ... -j TARGET` rule that applies to every packet; None otherwise."""
    try:
        words = shlex.split(rule)[2:]
    except ValueError:
        return None
    if words[:2] == ["-m", "comment"] and len(words) > 3 and words[2] == "--comment":
        words = words[4:]
    if len(words) < 2 or words[0] not in ("-j", "-g"):
        return None  # a match before the target: conditional
    target = words[1]
    if target.upper() in ("ACCEPT", "DROP", "REJECT", "RETURN"):
        return target.lower(), None
    if target in NON_TERMINATING:
        return "continue", None  # on to the next rule
    return "jump", target


def default_verdict(chains: dict[str, Chain], start: Chain, verdict_of: Any) -> tuple[str, str]:
    """What START (an input-hook chain) does with a packet that matches no condition: (accept, drop or reject;
    "policy" or "rule", which decided)."""

    def walk(chain: Chain, seen: tuple[str, ...]) -> str | None:
        for rule in chain.rules:
            decided = verdict_of(rule)
            if decided is None or decided[0] == "continue":
                continue
            verdict, target = decided
            if verdict == "return":
                return None
            if verdict in ("jump", "goto"):
                key = target if target in chains else f"{chain.table} {target}"
                callee = chains.get(key)
                if callee is None or callee.name in seen:
                    continue  # a chain not in the listing (a quote, or another table): not known to decide
                found = walk(callee, (*seen, callee.name))
                if found is not None or verdict == "goto":
                    return found
                continue
            return verdict
        return None

    verdict = walk(start, (start.name,))
    return (verdict, "rule") if verdict else (start.policy, "policy")


def _owners(chains: dict[str, Chain]) -> str:
    """Who made the chains, as far as their names tell: "Docker and Kubernetes"."""
    names = sorted({owner for chain in chains.values() for prefix, owner in OWNERS if chain.name.startswith(prefix)})
    return " and ".join(filter(None, (", ".join(names[:-1]), names[-1]))) if names else ""


def _judge(tool: str, chains: dict[str, Chain], verdict_of: Any) -> dict[str, Any]:
    rules = sum(len(c.rules) for c in chains.values())
    for chain in chains.values():
        if not chain.hook_input:
            continue
        verdict, how = default_verdict(chains, chain, verdict_of)
        if verdict in DROPPING:
            where = f"chain {chain.name}" + (f" of table {chain.table}" if chain.table not in ("", "filter") else "")
            how = f"policy {verdict}" if how == "policy" else f"a final {verdict} rule"
            return {"active": True, "tool": tool, "rules": rules, "filter": f"{tool} {where}: {how}"}
    owners = _owners(chains)
    seen = f"{tool}: {rules} rule(s)" + (f" from {owners}" if owners else "") + ", none filtering incoming traffic"
    return {"active": False, "tool": None, "rules": rules, "seen": seen if rules else None}


# A destination port match: iptables' --dport 32768:45000 or multiport's --dports 80,32768:45000 (iptables-extensions
# (8), "tcp" and "multiport"); nft's `dport 32768-45000` or `dport { 80, 32768-45000 }` (nft(8), "PAYLOAD
# EXPRESSION", tcp dport).
IPTABLES_DPORT = re.compile(r"--dports? (\S+)")
NFT_DPORT = re.compile(r"\bdport (?:\{([^}]*)\}|(\S+))")


def port_rules(nft: dict[str, Any], iptables: dict[str, Any]) -> tuple[str, ...]:
    """The filtering rules that match a destination port (a rule covering a port is quoted from these), from
    `iptables -S` where it answers, else from `nft list ruleset` (under iptables-nft both list the same rules; nft's
    nat tables, Docker's DNS redirection, filter nothing)."""
    for answer, parse in ((iptables, parse_iptables), (nft, parse_nft)):
        if "out" in answer and answer.get("rc") == 0:
            chains = [c for c in parse(answer["out"]).values() if not c.table.endswith(" nat")]
            rules = [r for c in chains for r in c.rules if IPTABLES_DPORT.search(r) or NFT_DPORT.search(r)]
            if rules:
                return tuple(rules)
    return ()


def dport_ranges(rule: str) -> list[tuple[int, int]]:
    """The destination port ranges RULE matches (an iptables or nft rule), each (first, last); [] for none. A
    negated match (`! --dport`, `dport != ...`) matches the ports outside: not given."""
    found = IPTABLES_DPORT.search(rule)
    if found and not re.search(r"!\s*--dports? ", rule):
        spec, separator = found[1], ":"
    elif (found := NFT_DPORT.search(rule)) and "dport !=" not in rule:
        spec, separator = (found[1] or found[2]), "-"
    else:
        return []
    ranges = []
    for part in spec.replace(" ", "").split(","):
        low, _, high = part.partition(separator)
        if low.isdigit() and (high.isdigit() or not high):
            ranges.append((int(low), int(high or low)))
    return ranges


def covering(rules: tuple[str, ...] | list[str], port: int) -> list[str]:
    """The RULES whose destination ports include PORT."""
    return [rule for rule in rules if any(low <= port <= high for low, high in dport_ranges(rule))]


def drops(rule: str) -> bool:
    """Whether RULE (iptables or nft, conditions or none) ends in a drop or a reject (DROPPING): iptables' -j/-g
    target, else nft's last verdict word (its comments and counters left out)."""
    target = re.search(r"(?:^|\s)-[jg] (\S+)", rule)
    if target:
        return target[1].lower() in DROPPING
    verdicts = [word for word in NFT_STATEMENTS.sub(" ", rule).split() if word in NFT_VERDICT_WORDS]
    return bool(verdicts) and verdicts[-1] in DROPPING


def stateful(rule: str) -> bool:
    """Whether RULE matches a connection state (iptables' conntrack --ctstate or state --state, nft's ct state): a
    rule that does not matches the replies to the node's own connections too."""
    return re.search(r"--ctstate |--state |\bct state\b", rule) is not None


def firewall_state(ufw: dict[str, Any], nft: dict[str, Any], iptables: dict[str, Any]) -> dict[str, Any]:
    """Whether incoming traffic is filtered, and by what, from the three answers (each may be missing):
    {"collected", "active" (filtered), "tool", "rules", "filter" (what filters it), "seen" (rules that do not),
    "port_rules" (the rules that match a destination port)}."""
    state: dict[str, Any] = {"collected": False, "active": False, "tool": None, "rules": 0}
    if rules := port_rules(nft, iptables):
        state["port_rules"] = rules
    if "out" in ufw and ufw.get("rc") == 0:
        state["collected"] = True
        if "Status: active" in ufw["out"]:
            rules = [ln for ln in ufw["out"].splitlines() if re.search(r"\b(ALLOW|DENY|REJECT|LIMIT)\b", ln)]
            return {**state, "active": True, "tool": "ufw", "rules": len(rules), "filter": "ufw (active)"}
    seen = []
    for answer, tool, parse, verdict_of in (
        (nft, "nftables", parse_nft, nft_verdict),
        (iptables, "iptables", parse_iptables, iptables_verdict),
    ):
        if "out" in answer and answer.get("rc") == 0:
            state["collected"] = True
            judged = _judge(tool, parse(answer["out"]), verdict_of)
            if judged["active"]:
                return {**state, **judged}
            if judged.get("seen"):
                seen.append(judged["seen"])
                state["rules"] = max(state["rules"], judged["rules"])
    if all("not found" in str(tool.get("error", "")) for tool in (ufw, nft, iptables)):
        state["collected"] = True  # no firewall tool installed: nothing filters
    if seen:
        state["seen"] = "; ".join(seen)
    return state
