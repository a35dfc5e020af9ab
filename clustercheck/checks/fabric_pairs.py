"""Judge the fabric pair rounds of the torch job (pure logic; the rounds: remote/fabricpairs.py, the schedule and
what the figures suspect: remote/pairs.py, the same functions the ranks used).

A figure is one direction of one rail between two nodes (an edge: src -> dst on rail k, GB/s), measured where it
arrived. An edge is slow under a share of its rail's reference (the median over the nodes of each node's best
figure on the rail: 0.7 over NCCL, 0.05 for gloo on CPU ranks, remote/pairs.py's SLOW_RATIO), or under the floor
(--min-pair-busbw); and the edges of a node's side (what it sends, or receives, on a rail) when every one is under
the rail's fence, far under the other nodes' medians (pairs.rail_fences: on a rail of 8 nodes or more, a Tukey
fence on the log of the figures, never above half the reference). Then, per rail:
- a node's rail slow with two or more different partners, and again in the confirm round against a node no slow
  figure touched: FAIL naming the node, the local rank (GPU), the interface, its figure against the median and the
  floor; every rail of a node so: the node itself; not again in the confirm round: WARN (transient);
- a pair slow with each other only, and again in the confirm round: FAIL naming the path (A <-> B, rail k); not
  again: WARN;
- a slow edge a named rail explains (its partner's) is not a finding of its own.
When the pairs are clean but the all-node all_reduce was under its floor, the bisection's levels name the boundary:
the smallest groups that failed while both their halves passed (the switch or spine between the halves).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from clustercheck.checks.registry import declare, emit
from clustercheck.model import CheckResult, Metric, Status
from clustercheck.remote import pairs

GB = 1e9
RAIL = Metric(
    "fabric_rail_bytes_per_second",
    "bytes_per_second",
    "A node's rail (local rank i's interface or HCA): the median of what it received from its pair-round partners.",
)
NODE = "fabric.pairs"
PATHS = "fabric.paths"
declare(
    NODE,
    stage="collectives",
    scope="node",
    proves="each of the node's rails (local rank i, its GPU and interface or HCA) moves data to and from its "
    "partners in rounds of node pairs (send/recv, rail-aligned) at no less than a share of its rail's figure over "
    "the cluster (0.7 with NCCL; 0.05 with gloo on CPU, where only a collapse stands out of the noise), not with "
    "every figure it sends or receives far under the other nodes' (a Tukey fence, on 8 nodes or more), and at no "
    "less than the floor (--min-pair-busbw, else over NCCL 0.7 of what the slowest RDMA port's line rate gives, "
    "NCCL's 24 GB/s per 200 Gb/s); slow with two or more partners and again in a confirm round against a healthy "
    "node: FAIL",
    fix="Check that rail's link: `ethtool IFACE` / `ibstat` (speed, errors), `tc qdisc show dev IFACE` (a shaper), "
    "the cable, transceiver and switch port; every rail of a node slow points at the node (its PCIe, NUMA "
    "placement, firmware).",
)
declare(
    PATHS,
    stage="collectives",
    scope="cluster",
    proves="no path between two nodes on one rail is slow in the pair rounds and again in the confirm round while "
    "both nodes are fine with other partners, and where the all-node all_reduce is under its floor with clean "
    "pairs, halves of the nodes (bisection) name the boundary: the switch or spine between them",
    fix="A slow path between two nodes that are fine elsewhere: the switch ports or cables between them (the "
    "switch's counters, `ibdiagnet`); a boundary found by bisection: the uplinks of the switch or spine that joins "
    "the halves.",
)


@dataclass
class Rails:
    """The pair rounds of one job, from its records: node names by index, each (node, rail)'s interface, the
    edges of the rounds and of the confirm round."""

    names: list[str]
    interfaces: dict[tuple[int, int], str | None]
    edges: dict[tuple[int, int, int], float]
    confirm: dict[tuple[int, int, int], float]
    seed: int
    size: int
    rounds: int
    bisection: list = field(default_factory=list)
    backend: str = "gloo"
    seconds: float | None = None  # the rounds, the confirm round and any bisection, on the slowest rank


def read(records: list[dict]) -> Rails | None:
    """The pair rounds in the collectives part's RECORDS (None: not run, as on one node)."""
    fabric = [r for r in records if isinstance(r.get("fabric"), dict)]
    first = next((r for r in fabric if r["fabric"].get("schedule") is not None), None)
    if first is None:
        return None
    head = first["fabric"]
    names: dict[int, str] = {}
    interfaces, received, confirmed = {}, {}, {}
    for r in fabric:
        f = r["fabric"]
        key = (f["node"], f["rail"])
        names[f["node"]] = r.get("node") or r.get("host") or str(f["node"])
        interfaces[key] = f.get("interface")
        received[key] = f.get("recv") or []
        confirmed[key] = f.get("confirm") or []
    size = head["bytes"]
    schedule = [[tuple(p) for p in rnd] for rnd in head["schedule"]]
    confirm = [[tuple(p) for p in rnd] for rnd in head.get("confirm_schedule") or []]
    return Rails(
        names=[names.get(i, str(i)) for i in range(max(names) + 1)],
        interfaces=interfaces,
        edges=pairs.edges_from(schedule, received, size),
        confirm=pairs.edges_from(confirm, confirmed, size),
        seed=head.get("seed", 0),
        size=size,
        rounds=len(schedule),
        bisection=head.get("bisection") or [],
        backend=first.get("backend") or "gloo",
        seconds=max((r["fabric"].get("seconds") or 0.0 for r in fabric), default=None),
    )


# What one rail's send/recv should reach: NCCL's maintainers count on 24 GB/s per 200 Gb/s NIC and 12 GB/s per
# 100 Gb/s one (NVIDIA/nccl-tests#119), 0.96 of the line rate in bytes.
LINE_RATE_SHARE = 0.96


def line_rate_floor(port_rates_gbps: list[float]) -> float | None:
    """The floor a rail over NCCL is held to without --min-pair-busbw: NCCL's share of what its NIC should reach
    (LINE_RATE_SHARE of the line rate), the slowest active RDMA port of the cluster (PORT_RATES_GBPS, Gb/s) taken
    for every rail; None without RDMA ports."""
    rates = [r for r in port_rates_gbps if r and r > 0]
    if not rates:
        return None
    return round(pairs.SLOW_RATIO["nccl"] * LINE_RATE_SHARE * min(rates) / 8, 3)


def evaluate(
    records: list[dict], hosts: list[str], floor: float | None = None, port_rates_gbps: list[float] | None = None
) -> list[CheckResult]:
    """fabric.pairs for every node of HOSTS and fabric.paths for the cluster, from the collectives part's
    RECORDS; FLOOR: --min-pair-busbw in GB/s, else over NCCL the line rate's (line_rate_floor of the nodes' active
    RDMA ports, PORT_RATES_GBPS)."""
    rails = read(records)
    if rails is None:
        why = "the pair rounds did not run (one node, or the job ended before them)"
        return [emit(NODE, Status.SKIP, why, host=h) for h in hosts] + [emit(PATHS, Status.SKIP, why)]
    if not floor and rails.backend == "nccl":
        floor = line_rate_floor(port_rates_gbps or [])
    medians = pairs.rail_reference(rails.edges)
    fences = pairs.rail_fences(rails.edges, medians)
    ratio = pairs.SLOW_RATIO.get(rails.backend, pairs.SLOW_RATIO["gloo"])
    slow = pairs.slow_edges(rails.edges, floor, ratio, medians, fences)
    suspect_rails, suspect_pairs = pairs.suspects(slow, pairs.met(rails.edges))
    again = pairs.slow_edges(rails.confirm, floor, ratio, medians, fences)
    index = _Index(rails)
    judged = _Judged(medians, fences, suspect_rails, again, floor)
    results = [_node_result(i, name, rails, index, judged) for i, name in enumerate(rails.names)]
    done = set(rails.names)
    results += [emit(NODE, Status.SKIP, "no pair-round figures of this node", host=h) for h in hosts if h not in done]
    results.append(_paths_result(rails, suspect_pairs, again, medians))
    return results


class _Index:
    """The edges and interfaces of RAILS by node, made once: each node's judgement reads its own (every edge looked
    at for every node was 163 of 168 s at 1,000 simulated nodes)."""

    def __init__(self, rails: Rails) -> None:
        self.got: dict[tuple[int, int], dict[int, float]] = {}
        self.sent: dict[tuple[int, int], dict[int, float]] = {}
        self.confirmed: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
        self.rails: dict[int, list[int]] = {}
        for (src, dst, rail), gbps in rails.edges.items():
            self.got.setdefault((dst, rail), {})[src] = gbps
            self.sent.setdefault((src, rail), {})[dst] = gbps
        for edge in rails.confirm:
            for node in edge[:2]:
                self.confirmed.setdefault((node, edge[2]), []).append(edge)
        for node, rail in rails.interfaces:
            self.rails.setdefault(node, []).append(rail)


@dataclass
class _Judged:
    """What the judgement found over the whole cluster, which each node's result reads."""

    medians: dict[int, float]  # each rail's reference
    fences: dict[int, float]  # each rail's far-out fence (pairs.rail_fences), where it has enough nodes
    suspect_rails: dict
    again: set
    floor: float | None


def _node_result(node: int, name: str, rails: Rails, index, judged: _Judged) -> CheckResult:
    medians, suspect_rails, again, floor = judged.medians, judged.suspect_rails, judged.again, judged.floor
    mine = sorted(index.rails.get(node, []))
    rows, problems, transient = [], [], []
    measures = []
    for rail in mine:
        iface = rails.interfaces.get((node, rail))
        got = index.got.get((node, rail), {})
        sent = index.sent.get((node, rail), {})
        median_in = pairs.median(list(got.values()))
        rows.append(
            {
                "rail": rail,
                "interface": iface,
                "recv_gbps": {rails.names[p]: round(v, 4) for p, v in sorted(got.items())},
                "send_gbps": {rails.names[p]: round(v, 4) for p, v in sorted(sent.items())},
                "median_gbps": median_in,
                "rail_reference_gbps": medians.get(rail),
                "rail_fence_gbps": judged.fences.get(rail),
            }
        )
        if median_in is not None:
            measures += RAIL.of(median_in * GB, host=name, rail=str(rail), interface=iface or "")
        sides = {d: suspect_rails.get((node, rail, d)) for d in ("out", "in")}
        if any(sides.values()):
            # slow again in the confirm round, or no confirm for it (no node left that no slow figure touched)
            confirmed = index.confirmed.get((node, rail), [])
            repeated = not confirmed or any(e in again for e in confirmed)
            text = _rail_text(rails, node, rail, sides, sent, got, judged)
            (problems if repeated else transient).append((rail, text))
    data = {
        "rails": rows,
        "backend": rails.backend,
        "seed": rails.seed,
        "bytes": rails.size,
        "rounds": rails.rounds,
        "floor_gbps": floor,
    }
    failed_rails = sorted({rail for rail, _ in problems})
    if failed_rails and failed_rails == mine and len(mine) > 1:
        message = f"every rail of {name} is slow: " + "; ".join(t for _, t in problems)
        fix = (
            f"Every rail of {name} is slow with every partner: the node rather than one link (its PCIe or NUMA "
            "placement of the NICs, a firmware or driver setting, a CPU or memory problem); compare `ibstat`/"
            "`ethtool` and `tc qdisc show` across its interfaces."
        )
        return emit(NODE, Status.FAIL, message, host=name, remediation=fix, data=data, measures=tuple(measures))
    if problems:
        message = "; ".join(t for _, t in problems)
        return emit(NODE, Status.FAIL, message, host=name, data=data, measures=tuple(measures))
    if transient:
        message = "; ".join(t for _, t in transient) + " (not again in the confirm round: transient)"
        return emit(NODE, Status.WARN, message, host=name, data=data, measures=tuple(measures))
    shown = ", ".join(
        f"rail {r['rail']}{_iface(r['interface'])} {r['median_gbps']:.3g} GB/s"
        for r in rows
        if r["median_gbps"] is not None
    )
    partners = len({p for r in rows for p in r["recv_gbps"]})
    return emit(
        NODE,
        Status.PASS,
        f"{shown or 'no figure'} (median received from {partners} partner(s))",
        host=name,
        data=data,
        measures=tuple(measures),
    )


def _iface(iface: str | None) -> str:
    return f" ({iface})" if iface else ""


def _rail_text(rails: Rails, node, rail, sides, sent, got, judged: _Judged) -> str:
    """What a slow rail does: the node, local rank (GPU) and interface, its slow figures with the partners named,
    against the rail's reference, its fence and the floor."""
    reference, fence, floor = judged.medians.get(rail), judged.fences.get(rail), judged.floor
    iface = rails.interfaces.get((node, rail))
    partners = set().union(*(p for p in sides.values() if p))
    shown = []
    for direction, figures, verb in (("out", sent, "sends"), ("in", got, "receives")):
        if sides.get(direction):
            listed = ", ".join(f"{rails.names[p]} {figures[p]:.3g}" for p in sorted(sides[direction]) if p in figures)
            shown.append(f"{verb} {listed}")
    against = f"the rail's {reference:.3g} GB/s (the median of each node's best)" if reference else "its rail's"
    if fence:
        against += f", the other nodes' spread {fence:.3g} GB/s (far under their lower quartile)"
    if floor:
        against += f", floor {floor:g} GB/s"
    gpu = f", GPU {rail}" if rails.backend == "nccl" else ""  # on GPUs local rank i drives GPU i
    where = f"rail {rail} (local rank {rail}{gpu}{', ' + iface if iface else ''})"
    return f"{rails.names[node]} {where} slow with {len(partners)} partners: {'; '.join(shown)} GB/s against {against}"


def _paths_result(rails: Rails, suspect_pairs, again, medians) -> CheckResult:
    failed, transient = [], []
    for a, b, rail in sorted(suspect_pairs):
        text = f"{rails.names[a]} <-> {rails.names[b]}, rail {rail}"
        edges = [(a, b, rail), (b, a, rail)]
        figures = [rails.edges[e] for e in edges if e in rails.edges]
        text += f" ({min(figures):.3g} GB/s against the rail's {medians.get(rail, 0):.3g})" if figures else ""
        (failed if any(e in again for e in edges) else transient).append(text)
    boundary = _boundary(rails)
    data = {
        "paths": failed,
        "transient": transient,
        "bisection": rails.bisection,
        "seconds": rails.seconds,
        "edges": [[rails.names[s], rails.names[d], k, round(v, 4)] for (s, d, k), v in sorted(rails.edges.items())],
    }
    if failed:
        message = "slow path(s), slow again in the confirm round: " + "; ".join(failed)
        return emit(PATHS, Status.FAIL, message, data=data)
    if boundary:
        return emit(PATHS, Status.FAIL, boundary, data=data)
    if transient:
        return emit(
            PATHS, Status.WARN, "slow once, not in the confirm round (transient): " + "; ".join(transient), data=data
        )
    pairs_met = len({(min(s, d), max(s, d)) for s, d, _ in rails.edges})
    return emit(
        PATHS,
        Status.PASS,
        f"{pairs_met} node pair(s) in {rails.rounds} round(s), every rail: no slow path (seed {rails.seed})",
        data=data,
    )


def _boundary(rails: Rails) -> str:
    """The bisection's finding: the groups that failed while each of their halves passed (the boundary), or the
    smallest groups still failing."""
    if not rails.bisection:
        return ""
    last = rails.bisection[-1]
    slowest = min(last, key=lambda g: g["busbw_gbps"])
    groups = " | ".join(f"{', '.join(rails.names[n] for n in g['nodes'])}: {g['busbw_gbps']:.3g} GB/s" for g in last)
    named = ", ".join(rails.names[n] for n in slowest["nodes"])
    return (
        "the pairs are clean but the all-node all_reduce is under its floor; bisection down to "
        f"{groups}: a switch or spine suspect between these groups (slowest {named})"
    )
