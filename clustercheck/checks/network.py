"""Turn the network probe's per-node records into checks (pure logic, no I/O).

Every node ran `clustercheck_remote.netprobe mesh` at the same time. A failure names the pair (A -> B), the likely
cause (firewall, routing, name resolution, port conflict) and the fix.
"""

from __future__ import annotations

import functools
import ipaddress
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from clustercheck.checks import replies
from clustercheck.checks.consistency import compare
from clustercheck.checks.netperf import MEASURED_BY, perf_checks
from clustercheck.checks.registry import declare, emit
from clustercheck.model import CheckResult, Metric, Status

STAGE = "network"
declare(
    "network.probe",
    stage=STAGE,
    scope="node",
    proves="the network probe (python3 only, no torch) ran on the node and reported",
    fix="Check that the node is reachable over SSH and has python3.",
)
declare(
    "network.master_port",
    stage=STAGE,
    scope="master",
    proves="the rendezvous port (--master-port) is free on the first node",
    fix="Stop the stale process that holds it, or choose another port with --master-port.",
)
declare(
    "network.listen",
    stage=STAGE,
    scope="node",
    proves="the node can listen on the probe's ports, so connections to it are tested",
    fix="Free the port on this node, or rerun with another --master-port.",
)
declare(
    "network.tcp",
    stage=STAGE,
    scope="cluster",
    proves="every node reaches every other node over TCP on the master port and an ephemeral port (A -> B for "
    "every pair), from and to the address its training traffic uses (the interface NCCL_SOCKET_IFNAME or "
    "GLOO_SOCKET_IFNAME name in its environment files, else the cluster interface; the report says which). A "
    "connection that fails because the connecting node's own rule drops the replies to its source port (a port "
    "range filtered with no connection state) is named as that node's, with the rule",
    fix="Allow all TCP from the cluster network on every node (the setup playbook's firewall role); let established "
    "connections' replies in; check routes.",
)
declare(
    "network.resolve",
    stage=STAGE,
    scope="node",
    proves="on every node, every node's hostname resolves first (getaddrinfo's first answer: what gloo binds and "
    "torch's rendezvous connects to) to the same non-loopback cluster address; addresses listed after it are noted",
    fix="Give every node the same /etc/hosts entries mapping each hostname to its cluster address.",
)
declare(
    "network.mtu",
    stage=STAGE,
    scope="cluster",
    proves="the cluster interface has the same MTU on every node",
    fix="Set the same MTU on every cluster interface (and on the switch ports).",
)

declare(
    "network.rtt",
    stage=STAGE,
    scope="cluster",
    proves="no node has a TCP round trip time far above the cluster's median with most of its partners, and no node "
    "pair far above it (each node measured with --network-rounds partners, 8 by default, in rounds of disjoint "
    "pairs)",
    fix="Look at the slow node's link: `ethtool IFACE` (speed, duplex), `tc qdisc show`, errors in `ip -s link`, "
    "its load, and the switch port.",
)
declare(
    "network.throughput",
    stage=STAGE,
    scope="cluster",
    proves="no node sends or receives far slower than the cluster's median TCP throughput with most of its partners, "
    "and no node pair is far slower than the others (a short transfer each way, each node with --network-rounds "
    "partners, in rounds of disjoint pairs)",
    fix="Look at the slow node's link: `ethtool IFACE` (a link that negotiated a lower speed), a traffic shaper "
    "(`tc qdisc show dev IFACE`), errors and drops in `ip -s link`, and the switch port.",
)


def plan(selected: Callable[[str], bool]) -> tuple[str, ...]:
    """The measurements the probe is told to make: those the SELECTED checks need."""
    return tuple(measurement for name, measurement in MEASURED_BY.items() if selected(name))


MTU = Metric("network_mtu_bytes", "bytes", "MTU of the node's cluster interface.")

CAUSES = {
    # probe result -> (likely cause, explanation)
    "timeout": (
        "firewall",
        "the connection timed out: packets are dropped on the way, most often by a firewall",
    ),
    "refused": (
        "firewall",
        "the connection was refused although the probe was listening: a firewall rejects it",
    ),
    "host-unreachable": (
        "routing",
        "no route to host: the address is not reachable (no ARP answer or a wrong route), or a firewall rejects "
        "with icmp-host-prohibited",
    ),
    "network-unreachable": ("routing", "network unreachable: no route to the peer's address"),
    "reset": ("firewall", "the connection was reset: a firewall or proxy interferes"),
    "wrong-service": (
        "port conflict",
        "another service answered on the port instead of clustercheck's probe",
    ),
    "error": ("unknown", "the connection failed"),
    "not-tried": ("unknown", "the probe ran out of time before trying"),
}


@dataclass(frozen=True)
class Peer:
    name: str  # the node's name in reports (the inventory name)
    address: str  # the node's address on the cluster network
    hostname: str | None = None  # the name torch and NCCL see (`hostname` on the node); default: NAME
    # where its name must resolve, where ADDRESS is another one (the training interface's: facts/trainnet.py)
    cluster_address: str | None = None

    @property
    def resolves_to(self) -> str:
        return self.cluster_address or self.address


def evaluate(
    records: dict[str, dict],
    peers: list[Peer],
    master: str,
    master_port: int,
    errors: dict[str, str] | None = None,
    cidr: str | None = None,
    not_ready: dict[str, float] | None = None,
    ready_after: dict[str, float] | None = None,
    measure: tuple[str, ...] = tuple(MEASURED_BY.values()),
    rules: dict[str, tuple[str, ...]] | None = None,
) -> list[CheckResult]:
    """All network.* checks from the probe records (node name -> record). ERRORS: node -> why no record.
    MEASURE: the measurements the probe was told to make (plan()).
    NOT_READY: node -> the seconds the controller waited for its probe to listen, in vain; READY_AFTER: node ->
    seconds until it listened. The connections of a node that was not ready are not the network's fault.
    RULES: node -> its firewall rules that match a destination port (facts' port_rules)."""
    not_ready = not_ready or {}
    results = probe_checks(records, peers, errors or {}, not_ready, ready_after or {})
    results.append(master_port_check(records.get(master), master, master_port))
    results += busy_ports(records, master, master_port)
    results += tcp_checks({n: r for n, r in records.items() if n not in not_ready}, peers, cidr, rules)
    results += resolve_checks(records, peers)
    results.append(mtu_check(records))
    results += perf_checks(records, measure)
    return results


def _holders_text(state: dict) -> str:
    holders = state.get("holders") or []
    return ", ".join(
        f"another clustercheck run ({own_job(h['clustercheck'])})"
        if isinstance(h.get("clustercheck"), dict)
        else f"pid {h['pid']} ({h['command']})"
        if h.get("pid")
        else h["command"]
        for h in holders
    )


def master_port_check(record: dict | None, master: str, port: int) -> CheckResult:
    if record is None:
        return emit(
            "network.master_port",
            Status.SKIP,
            "no probe result",
            host=master,
            data={"port": port},
        )
    state = next((s for s in record["listen"] if s["port"] == port), None)
    if state and state["ok"]:
        return emit(
            "network.master_port",
            Status.PASS,
            f"{master}: port {port} is free for the rendezvous",
            host=master,
            data={"port": port},
        )
    state = state or {"error": "not probed"}
    holders = state.get("holders") or []
    data = {"port": port, "error": state.get("error"), "holders": holders}
    job = next((h["clustercheck"] for h in holders if isinstance(h.get("clustercheck"), dict)), None)
    if job is not None:  # a live clustercheck job, not a stale process: the startup sweep stops ended runs' own
        return emit(
            "network.master_port",
            Status.FAIL,
            f"{master}: another clustercheck run ({own_job(job)}) holds port {port}",
            host=master,
            remediation=f"Wait for that run to end, or use --master-port with another port (not {port}).",
            data={**data, "clustercheck": job},
        )
    held = _holders_text(state)
    pids = " ".join(str(h["pid"]) for h in holders if h.get("pid"))
    return emit(
        "network.master_port",
        Status.FAIL,
        f"{master}: master port {port} cannot be used: {state.get('error')}" + (f"; held by {held}" if held else ""),
        host=master,
        remediation=(f"Stop the stale process (kill {pids}) or " if pids else "Free the port or ")
        + "choose another port with --master-port.",
        data=data,
    )


def own_job(job: dict) -> str:
    """A clustercheck run's process, as its markers tell (remote/probing.run_of): "started 2026-11-28 16:20:05 UTC
    by alice, run 3f2a9c"."""
    started = job.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)) if isinstance(started, int) else None
    said = [f"started {when}" if when else "", f"by {job['user']}" if job.get("user") else ""]
    return " ".join(filter(None, said)) + f"{', ' if any(said) else ''}run {job.get('run')}"


def probe_checks(
    records: dict[str, dict],
    peers: list[Peer],
    errors: dict[str, str],
    not_ready: dict[str, float] | None = None,
    ready_after: dict[str, float] | None = None,
) -> list[CheckResult]:
    """network.probe for every node: ERROR where the probe gave no record or never listened in time, WARN where
    it listened only after the others had started connecting, PASS where it ran."""
    not_ready, ready_after = not_ready or {}, ready_after or {}
    results = []
    names = [p.name for p in peers] + sorted(n for n in errors if n not in {p.name for p in peers})
    others = sorted(ready_after.values())
    typical = f"; the other nodes were ready within {others[-1]:.1f} s" if others else ""
    slow_fix = (
        "{name} is slow to start python or overloaded (check its load, `uptime`, and its SSH logins); rerun. "
        "Its connections to and from the others were not judged."
    )
    for name in names:
        waited = not_ready.get(name)
        if waited is not None and name in records:
            results.append(
                emit(
                    "network.probe",
                    Status.WARN,
                    f"{name}'s probe started late: it was not listening after {waited:.0f} s{typical}; "
                    "its connections were not judged",
                    host=name,
                    remediation=slow_fix.format(name=name),
                    data={"late": True, "waited": waited},
                )
            )
        elif name in records:
            seconds = records[name].get("seconds")
            ready = f", listening after {ready_after[name]:.1f} s" if name in ready_after else ""
            results.append(
                emit(
                    "network.probe",
                    Status.PASS,
                    f"{name}: the probe ran ({seconds} s{ready})",
                    host=name,
                    data={"ready_after": ready_after.get(name)},
                )
            )
        elif waited is not None:
            why = errors.get(name, "no record came back")
            results.append(
                emit(
                    "network.probe",
                    Status.ERROR,
                    f"{name}'s probe never reported ready (not listening after {waited:.0f} s{typical}): {why}",
                    host=name,
                    remediation=f"Check that {name} is reachable over SSH and has python3; "
                    + slow_fix.format(name=name),
                    data={"late": True, "waited": waited},
                )
            )
        else:
            why = errors.get(name, "no record came back")
            results.append(
                emit(
                    "network.probe",
                    Status.ERROR,
                    f"{name}: the network probe did not complete: {why}",
                    host=name,
                    remediation=f"Check that {name} is reachable over SSH and has python3.",
                )
            )
    return results


def busy_ports(records: dict[str, dict], master: str, master_port: int) -> list[CheckResult]:
    """network.listen for every node that reported: WARN when a port could not be bound (other than the master
    port on the master, which network.master_port reports): connections to it were not tested."""
    results = []
    for name, record in sorted(records.items()):
        busy = [s for s in record["listen"] if not s["ok"] and not (name == master and s["port"] == master_port)]
        if not busy:
            ports = ", ".join(
                f"{s['port']} (the rendezvous, at {s['address']})" if s.get("rendezvous") else str(s["port"])
                for s in record["listen"]
                if s["ok"]
            )
            results.append(
                emit(
                    "network.listen",
                    Status.PASS,
                    f"{name}: listening on port(s) {ports}",
                    host=name,
                )
            )
            continue
        texts = []
        for state in busy:
            held = _holders_text(state)
            texts.append(f"port {state['port']} ({state.get('error')}" + (f", held by {held}" if held else "") + ")")
        results.append(
            emit(
                "network.listen",
                Status.WARN,
                f"{name}: could not listen on {'; '.join(texts)}; connections to it were not tested",
                host=name,
                data={"ports": busy},
            )
        )
    return results


def tcp_checks(
    records: dict[str, dict],
    peers: list[Peer],
    cidr: str | None = None,
    rules: dict[str, tuple[str, ...]] | None = None,
) -> list[CheckResult]:
    """network.tcp from the probes' RECORDS; RULES: node -> its firewall rules that match a destination port
    (facts' port_rules), quoted where one covers the ports a node's own failed connections left from."""
    address = {p.name: p.address for p in peers}
    failures: dict[tuple[str, str], list[dict]] = {}
    tested = 0
    # (node, port) for every port a node listened on: looked up once per connection, of which there are 2 N (N-1).
    listening = {(name, s["port"]) for name, r in records.items() for s in r["listen"] if s["ok"]}
    for name, record in sorted(records.items()):
        tested += record["outgoing"]["ok"]  # an answered connection: the far side listened (its token came back)
        for out in record["outgoing"]["failed"]:
            target = out["to"]
            if (target, out["port"]) not in listening:
                continue  # the far side did not run or could not listen: reported by other checks
            tested += 1
            failures.setdefault((name, target), []).append(out)
    ports = sorted({s["port"] for r in records.values() for s in r["listen"] if not s.get("perf")})
    if not failures:
        pairs = len(records) * (len(records) - 1)
        port_text = ", ".join(map(str, ports))
        message = (
            f"all {pairs} node pairs connect over TCP on port(s) {port_text}"
            if pairs
            else f"one node, so no node pair to connect; it listens on port(s) {port_text}"
        )
        return [
            emit(
                "network.tcp",
                Status.PASS,
                message,
                data={"pairs": pairs, "ports": ports, "connections": tested},
            )
        ]
    # A node that every other node fails to reach (or that reaches none) is the likely culprit.
    others = {n: [m for m in records if m != n] for n in records}
    unreachable = [n for n in records if others[n] and all((m, n) in failures for m in others[n])]
    isolated = [n for n in records if others[n] and all((n, m) in failures for m in others[n])]
    # Every node tries every other node on each port it listens on: the nodes that reached DST on the ports SRC
    # failed on say DST accepts them.
    failed_from: dict[tuple[str, int], set[str]] = {}
    for (src, dst), outs in failures.items():
        for out in outs:
            failed_from.setdefault((dst, out["port"]), set()).add(src)
    results = []
    for (src, dst), outs in sorted(failures.items()):
        own = replies.own_rules(outs, (rules or {}).get(src, ()))
        if own:
            reached = sorted(set(others[dst]) - set().union(*(failed_from[(dst, o["port"])] for o in outs)))
            results.append(replies.lost(src, dst, outs, reached, address, own))
            continue
        kinds = Counter(o["result"] for o in outs)
        kind = kinds.most_common(1)[0][0]
        cause, explanation = CAUSES.get(kind, CAUSES["error"])
        port_list = ", ".join(f"{o['port']} ({o['result']}: {o['detail']})" for o in outs)
        where = ""
        if dst in unreachable and len(records) > 2:
            where = f"; no node reaches {dst}, so {dst}'s own firewall or link is the likely place"
        elif src in isolated and len(records) > 2:
            where = f"; {src} reaches no node, so {src}'s outbound firewall or routing is the likely place"
        results.append(
            emit(
                "network.tcp",
                Status.FAIL,
                f"{src} -> {dst} ({address.get(dst, '?')}): {explanation}; port(s) {port_list}{where}",
                host=src,
                remediation=_tcp_remedy(cause, src, dst, address, cidr, [o["port"] for o in outs]),
                data={"from": src, "to": dst, "cause": cause, "results": outs},
            )
        )
    return results


def _tcp_remedy(cause: str, src: str, dst: str, address: dict[str, str], cidr: str | None, ports: list[int]) -> str:
    source = cidr or address.get(src, src)
    if cause == "firewall":
        return (
            f"On {dst}, allow TCP from the cluster network: `ufw allow from {source}` or "
            f"`iptables -I INPUT -s {source} -j ACCEPT` (inspect with `iptables -S`, `nft list ruleset`); "
            f"check {src}'s OUTPUT rules too. The setup playbook opens the cluster network."
        )
    if cause == "routing":
        return (
            f"On {src}, `ip route get {address.get(dst, dst)}` must leave through the cluster interface; "
            f"check addresses, netmasks and routes on both nodes (`ip addr`, `ip route`)."
        )
    if cause == "port conflict":
        return f"Stop the service on {dst} that uses port(s) {', '.join(map(str, ports))}, or pick another port."
    return f"Run the probe again; check {dst}'s firewall and {src}'s routes."


@functools.cache  # every node resolves every name: N² answers, N distinct addresses to parse
def _is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def resolve_checks(records: dict[str, dict], peers: list[Peer]) -> list[CheckResult]:
    """Every node resolves every node's hostname first to the same non-loopback address, the cluster address.
    Judged by the first address (netprobe.resolve_summary): the one the ranks use. A multi-homed node's own name
    also resolving to its other networks' addresses after it (Docker writes a hosts line per network) is fine."""
    address = {p.name: p.resolves_to for p in peers}
    # What most nodes resolve each name to, to name the odd ones out. A record lists only the names that did not
    # resolve to exactly the cluster address (netprobe.summarise): the nodes that do not list a name got that.
    listed: dict[str, Counter] = {}
    for record in records.values():
        for name, answer in record["resolve"]["unexpected"].items():
            listed.setdefault(name, Counter())[tuple(answer.get("addresses") or ())[:1]] += 1
    seen: dict[str, Counter] = {}  # name -> how many nodes got each answer (no answer is no vote)
    for name, answers in listed.items():
        counts = Counter({(address[name],): len(records) - sum(answers.values())} if name in address else {})
        counts.update(answers)
        counts.pop((), None)
        seen[name] = +counts  # an expected answer no node gave is no vote either
    majorities = {name: counts.most_common(1)[0][0] for name, counts in seen.items() if counts}
    # Where most nodes agree on another address, the nodes that got the cluster address are the odd ones out.
    outvoted = {
        p.name: {"hostname": p.hostname or p.name, "addresses": [p.resolves_to]}
        for p in peers
        if p.name in majorities and majorities[p.name] != (p.resolves_to,)
    }
    results = []
    for resolver, record in sorted(records.items()):
        problems, warnings, loopback = [], [], []
        odd: dict[str, dict] = {}  # the answers behind a problem or warning (all of them: the run directory)
        for name, answer in sorted({**outvoted, **record["resolve"]["unexpected"]}.items()):
            addrs = (answer.get("addresses") or [])[:1]  # the first: what the ranks use
            host = answer.get("hostname", name)
            label = host if host == name else f"{host} ({name})"
            if not addrs:
                problems.append(f"{label} does not resolve ({answer.get('error', 'no address')})")
                odd[name] = answer
                continue
            if any(_is_loopback(a) for a in addrs):
                problems.append(f"{label} resolves to loopback {', '.join(addrs)}")
                loopback += [f"'{a} {host}'" for a in addrs if _is_loopback(a)]
                odd[name] = answer
                continue
            majority = majorities[name]
            if len(seen[name]) > 1 and tuple(addrs) != majority:
                problems.append(f"{label} resolves to {', '.join(addrs)}, other nodes get {', '.join(majority)}")
                odd[name] = answer
            elif name in address and address[name] not in addrs:
                warnings.append(f"{label} resolves first to {addrs[0]}, not its cluster address {address[name]}")
                odd[name] = answer
        if problems:
            status, text = Status.FAIL, "name resolution: " + "; ".join(problems)
            remedy = (
                "Give every node the same /etc/hosts entries mapping each hostname to its cluster "
                "address (the setup playbook writes them)"
                + (f", and remove the {', '.join(dict.fromkeys(loopback))} line(s)." if loopback else ".")
            )
        elif warnings:
            status, text = Status.WARN, "; ".join(warnings)
            remedy = (
                "Map each hostname to its cluster address in /etc/hosts, so torch and NCCL use the cluster network."
            )
        else:
            status, remedy = Status.PASS, ""
            text = f"all {record['resolve']['names']} node names resolve first to their cluster addresses"
            also = record["resolve"].get("also") or {}
            if also:  # what the ranks do not use, said so that a reader of the hosts file is not surprised
                text += " (" + "; ".join(f"{n} also to {', '.join(a)}" for n, a in sorted(also.items())) + ")"
        results.append(
            emit(
                "network.resolve",
                status,
                f"{resolver}: {text}",
                host=resolver,
                remediation=remedy,
                # Not every answer: N nodes resolving N names is N² of them, most of a 1,000-node report's size.
                data={
                    "names": record["resolve"]["names"],
                    "unexpected": odd,
                    **({"also": record["resolve"]["also"]} if record["resolve"].get("also") else {}),
                },
            )
        )
    return results


def mtu_check(records: dict[str, dict]) -> CheckResult:
    mtus = {name: r.get("mtu") for name, r in sorted(records.items())}
    interfaces = {name: r.get("interface") for name, r in sorted(records.items())}
    data = {"mtu": mtus, "interface": interfaces}
    measures = tuple(m for n, v in mtus.items() for m in MTU.of(v, host=n, interface=interfaces[n] or ""))
    unknown = sorted(n for n, m in mtus.items() if m is None)
    known = Counter(m for m in mtus.values() if m is not None)
    if not known:
        return emit(
            "network.mtu",
            Status.SKIP,
            "no node reported the MTU of its cluster interface",
            data=data,
            measures=measures,
        )
    if len(known) > 1:  # the same verdict as consistency.mtu: the odd nodes against the majority, or no majority
        finding = compare({n: m for n, m in mtus.items() if m is not None}, "cluster interface MTU")
        majority = finding.data["majority"]
        remediation = None  # a tie: the declared fix (no MTU to name)
        if majority is not None:
            where = ", ".join(f"{n} ({interfaces[n] or 'its cluster interface'})" for n in finding.data["differ"])
            remediation = (
                f"Set the MTU to {majority} on {where} (e.g. `ip link set dev IFACE mtu {majority}` and in the "
                "netplan/network configuration), and on the switch ports; mismatched MTUs hang large transfers."
            )
        return emit("network.mtu", Status.FAIL, finding.message, remediation=remediation, data=data, measures=measures)
    majority = next(iter(known))
    if unknown:
        return emit(
            "network.mtu",
            Status.WARN,
            f"MTU {majority} on the cluster interfaces; unknown on {', '.join(unknown)} (interface not found)",
            data=data,
            measures=measures,
        )
    return emit(
        "network.mtu", Status.PASS, f"cluster interface MTU {majority} on every node", data=data, measures=measures
    )
