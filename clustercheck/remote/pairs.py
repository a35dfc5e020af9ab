"""Fabric pair rounds: which nodes pair in which round, and what the figures suspect (standard library only, Python
3.8+). The ranks of the torch job compute the schedule and the confirm round with these functions
(remote/collectives.py), and the controller judges the figures with the same ones (checks/fabric_pairs.py), so
both sides agree on every pair without sending the schedule.

A round pairs disjoint nodes; in a pair, local rank i of one node exchanges with local rank i of the other
(rail-aligned: GPU i of every node talks to GPU i of the others through HCA i), both directions at once. A figure
is one direction of one rail between two nodes, measured where it arrives: an edge (src, dst, rail) in GB/s.

The schedule is a round-robin (the circle method) over the nodes shuffled with a seed the report records: n-1
rounds (n even) or n (n odd) give every pair once; past MAX_ROUNDS the first MAX_ROUNDS rounds of a shuffled round
order are run, so the rounds do not grow with the cluster and each node meets MAX_ROUNDS different partners.
"""

import math
import random

DEFAULT_ROUNDS = 6  # every node meets up to this many partners: enough to tell "slow with two or more" from one
# An edge under this share of its rail's reference is slow: NCCL's large send/recv over RDMA is steady run to run
# (SuperBench calls a pair 5 % under its baseline defective). gloo on CPU ranks that share the node's cores with
# everything else is not: ten healthy runs on the 3-node test cluster (2 cores for 6 ranks and more) gave figures
# from 0.12 to 1 times the reference even as the best of their exchanges, so there only a collapse (a twentieth)
# counts: a rail shaped to 100 Mbit/s among ~1.5 GB/s ones is a hundredth.
SLOW_RATIO = {"nccl": 0.7, "gloo": 0.05}
# A node's rail can also stand out of its own cluster's spread: every figure it sent (or received) under the rail's
# fence, FENCE_IQRS interquartile ranges under the lower quartile of the nodes' medians (Tukey's outlier fence, on the
# log of the figures: bandwidth spreads by factors). That names a throttled rail among crowded CPU ranks whose healthy
# figures are a tenth of the reference: in four runs at 64 test nodes (tests/unit/data/fabric/), a rail shaped to
# 100 Mbit/s sent its best figure 3.34 and 2.0 interquartile ranges under the lower quartile, the lowest healthy
# node's best was 0.14 under it at most. Quartiles need FENCE_NODES nodes on the rail; and the fence never lifts
# past FENCE_SHARE of the reference, so a tight cluster (RDMA, where the share above holds) does not fail a node a
# few percent under the others.
FENCE_NODES = 8
FENCE_IQRS = 1.5
FENCE_SHARE = 0.5


def schedule(n, seed, max_rounds=DEFAULT_ROUNDS):
    """Rounds of disjoint pairs of node indices (0..N-1): every pair once when the round-robin's rounds fit in
    MAX_ROUNDS (0: no limit), else MAX_ROUNDS of its rounds, chosen and ordered by SEED."""
    if n < 2:
        return []
    rng = random.Random(seed)
    order = list(range(n))
    rng.shuffle(order)
    if n % 2:
        order.append(None)  # the bye: a node paired with it sits the round out
    ring = order[1:]
    rounds = list(range(len(ring)))
    rng.shuffle(rounds)
    if max_rounds and max_rounds < len(rounds):
        rounds = rounds[:max_rounds]
    out = []
    half = len(order) // 2
    for r in rounds:
        lineup = [order[0], *ring[r:], *ring[:r]]
        pairs = [(lineup[i], lineup[-1 - i]) for i in range(half)]
        out.append([(min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None])
    return out


def partners(round_pairs):
    """{node: its partner} of a round: one look-up per node instead of a scan of the round's pairs."""
    out = {}
    for a, b in round_pairs:
        out[a] = b
        out[b] = a
    return out


def median(values):
    ordered = sorted(values)
    if not ordered:
        return None
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def rail_reference(edges):
    """Each rail's reference figure over EDGES ({(src, dst, rail): GB/s}): the median over the nodes of each node's
    best figure on the rail (sent or received). One bad node touches most edges of a small cluster, which would
    drag a plain median down with it; it is only one of the nodes whose best is taken."""
    best = {}
    for (src, dst, rail), gbps in edges.items():
        for node in (src, dst):
            key = (node, rail)
            best[key] = max(gbps, best.get(key, gbps))
    by_rail = {}
    for (_, rail), gbps in best.items():
        by_rail.setdefault(rail, []).append(gbps)
    return {rail: median(values) for rail, values in by_rail.items()}


def quantile(ordered, share):
    """The SHARE quantile of the sorted list ORDERED, interpolated between its neighbours (numpy's default)."""
    at = (len(ordered) - 1) * share
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def sides(edges):
    """{(node, rail, "out" or "in"): what the node's rail sent to, or received from, its partners (GB/s)}."""
    figures = {}
    for (src, dst, rail), gbps in edges.items():
        figures.setdefault((src, rail, "out"), []).append(gbps)
        figures.setdefault((dst, rail, "in"), []).append(gbps)
    return figures


def rail_fences(edges, reference=None):
    """{rail: GB/s}: the rails of EDGES with FENCE_NODES nodes or more, each with its lower fence over the medians
    of the nodes' sides (sides()), capped at FENCE_SHARE of the rail's reference (REFERENCE, else EDGES')."""
    return _fences(sides(edges), reference or rail_reference(edges))


def _fences(figures, reference):
    """rail_fences over FIGURES (sides()) and each rail's REFERENCE."""
    logs, nodes = {}, {}
    for (node, rail, _), side in figures.items():
        gbps = median(side)
        if gbps > 0:
            logs.setdefault(rail, []).append(math.log(gbps))
            nodes.setdefault(rail, set()).add(node)
    fences = {}
    for rail, values in logs.items():
        if len(nodes[rail]) < FENCE_NODES:
            continue
        values.sort()
        q1, q3 = quantile(values, 0.25), quantile(values, 0.75)
        fences[rail] = min(math.exp(q1 - FENCE_IQRS * (q3 - q1)), FENCE_SHARE * reference[rail])
    return fences


def slow_edges(edges, floor=None, ratio=SLOW_RATIO["gloo"], reference=None, fences=None):
    """The edges of EDGES below RATIO of their rail's reference (REFERENCE, else EDGES' own), or below FLOOR (GB/s)
    when given, and the edges of a node's side (what it sends, or receives, on a rail) when every one of them is under
    the rail's fence (FENCES, else EDGES' own rail_fences): slow with every partner by the cluster's own spread."""
    reference = reference or rail_reference(edges)
    figures = sides(edges)  # one pass for the fences and each side's best
    fences = _fences(figures, reference) if fences is None else fences
    best = {key: max(side) for key, side in figures.items()} if fences else {}
    slow = set()
    for edge, gbps in edges.items():
        src, dst, rail = edge
        limit = reference[rail] * ratio
        if floor:
            limit = max(limit, floor)
        fence = fences.get(rail)
        if gbps < limit or (fence and min(best[(src, rail, "out")], best[(dst, rail, "in")]) < fence):
            slow.add(edge)
    return slow


def slow_partners(slow):
    """{(node, rail, "out" or "in"): set of partners} from the slow edges: a node's rail that sends slowly to, or
    receives slowly from, each of those partners."""
    out = {}
    for src, dst, rail in slow:
        out.setdefault((src, rail, "out"), set()).add(dst)
        out.setdefault((dst, rail, "in"), set()).add(src)
    return out


def met(edges):
    """{(node, rail): the number of different partners it has a figure with} in EDGES."""
    out = {}
    for src, dst, rail in edges:
        out.setdefault((src, rail), set()).add(dst)
        out.setdefault((dst, rail), set()).add(src)
    return {key: len(partners) for key, partners in out.items()}


def suspects(slow, partners_met=None):
    """What the slow edges point at: {(node, rail, direction): partners} for a node's rail slow with two or more
    different partners, and the pairs (a, b, rail) slow with each other only, that no such rail explains. A slow
    rail explains every slow edge of its node on that rail, both ways (a NIC that sends slowly also delays the
    acknowledgements of what it receives). The rail slow with the most partners is named first and explains its
    edges away, then the next among what is left: a healthy node whose only slow partners were two bad ones is not
    named beside them. A rail slow with every one of two or more partners it met (PARTNERS_MET: met()) is named
    whatever else is: under a floor every rail of the cluster may be."""
    left = set(slow)
    every = slow_partners(slow)  # a named rail's partners, all of them, for what the finding says
    rails = {}
    for (node, rail), count in (partners_met or {}).items():
        slow_with = [every.get((node, rail, d), set()) for d in ("out", "in")]
        if count >= 2 and len(slow_with[0] | slow_with[1]) >= count:
            for direction, found in zip(("out", "in"), slow_with):  # noqa: B905 (Python 3.8 on the node)
                if found:
                    rails[(node, rail, direction)] = found
    named_first = {(node, rail) for node, rail, _ in rails}
    left = {e for e in left if not (named_first & {(e[0], e[2]), (e[1], e[2])})}
    while True:
        counts = slow_partners(left)
        named = {
            (n, k): max(len(counts.get((n, k, "out"), ())), len(counts.get((n, k, "in"), ()))) for n, k, _ in counts
        }
        worst = max(named, key=lambda key: (named[key], -key[0], -key[1]), default=None)
        if worst is None or named[worst] < 2:
            break
        node, rail = worst
        for direction in ("out", "in"):
            if every.get((node, rail, direction)):
                rails[(node, rail, direction)] = every[(node, rail, direction)]
        left = {e for e in left if not (e[2] == rail and node in e[:2])}
    pairs = {(min(src, dst), max(src, dst), rail) for src, dst, rail in left}
    return rails, pairs


def confirm_rounds(n, slow, seed, partners_met=None):
    """The confirm round: each suspect node (a slow rail's, an unexplained slow pair's) paired with a node that is
    no suspect, and every unexplained slow pair run again; packed into as few rounds of disjoint
    pairs as they fit (usually one or two)."""
    rails, pairs = suspects(slow, partners_met)
    touched = sorted({node for node, _, _ in rails} | {a for a, _, _ in pairs} | {b for _, b, _ in pairs})
    if not touched:
        return []
    fine = [node for node in range(n) if node not in touched]  # a partner a suspect explains is fine
    random.Random(seed).shuffle(fine)
    wanted = sorted({(a, b) for a, b, _ in pairs})
    for i, node in enumerate(touched):
        if fine:
            wanted.append((min(node, fine[i % len(fine)]), max(node, fine[i % len(fine)])))
    rounds = []
    for pair in wanted:
        for r in rounds:
            if not {x for p in r for x in p} & set(pair):
                r.append(pair)
                break
        else:
            rounds.append([pair])
    return rounds


def halves(group):
    """GROUP (node indices) split in two halves, in its order (inventory order: racks are usually contiguous)."""
    mid = len(group) // 2
    return [group[:mid], group[mid:]]


def edges_from(rounds, received, size):
    """The edges {(src, dst, rail): GB/s} of ROUNDS (lists of node pairs) from RECEIVED: {(node, rail): seconds
    per round, None where that rank received nothing}, each the time SIZE bytes took to arrive from the partner."""
    edges = {}
    maps = [partners(r) for r in rounds]
    for (node, rail), times in received.items():
        for partner_map, seconds in zip(maps, times):  # noqa: B905 (Python 3.8 on the node: no strict=)
            partner = partner_map.get(node)
            if partner is None or seconds is None or seconds <= 0:
                continue
            gbps = size / seconds / 1e9
            key = (partner, node, rail)
            edges[key] = min(gbps, edges.get(key, gbps))  # met twice (a confirm round again): the slower counts
    return edges
