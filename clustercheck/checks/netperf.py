"""network.rtt and network.throughput from the network probe's perf rounds (pure logic, no I/O): the round trip and
the throughput both ways of every pair measured, and the nodes and pairs far slower than the cluster's median named
with the numbers. The checks are declared with the other network.* checks (checks/network.py).
"""

from __future__ import annotations

from collections.abc import Callable

from clustercheck.checks.registry import emit
from clustercheck.model import CheckResult, Metric, Status

# The probe's perf rounds make only the measurements of the selected checks (netprobe --measure), so a skipped
# check costs no round.
MEASURED_BY = {"network.rtt": "rtt", "network.throughput": "throughput"}

RTT = Metric("network_rtt_seconds", "seconds", "TCP round trip time between two nodes (host and peer).")
THROUGHPUT = Metric(
    "network_throughput_bytes_per_second", "bytes_per_second", "TCP throughput measured from host to peer."
)

NODE_SLOWER = 4.0  # a node with most of its pairs this many times slower than the median pair is a straggler
PAIR_SLOWER = 10.0  # a pair this many times slower than the median (neither node explaining it) is named
RTT_MARGIN_MS = 1.0  # and a round trip must be at least this much longer: sub-millisecond times vary by nature


def _ms(value: float) -> str:
    return f"{value * 1000:.0f} µs" if value < 1 else f"{value:.2f} ms"


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def perf_pairs(records: dict[str, dict]) -> tuple[list[dict], list[dict]]:
    """(measured pairs, pairs that could not be measured) from the probes' perf rounds. A measured pair:
    {a, b, rtt_ms, a_to_b, b_to_a} (Mbit/s), A the node that connected."""
    measured, failed = [], []
    for name, record in sorted(records.items()):
        for entry in record.get("perf") or []:
            if entry.get("served"):
                continue
            if "error" in entry:
                failed.append({"a": name, "b": entry["peer"], "error": entry["error"]})
            elif any(entry.get(key) is not None for key in ("rtt_ms", "out_mbps", "in_mbps")):
                measured.append(
                    {
                        "a": name,
                        "b": entry["peer"],
                        "rtt_ms": entry.get("rtt_ms"),
                        "a_to_b": entry.get("out_mbps"),
                        "b_to_a": entry.get("in_mbps"),
                    }
                )
    return measured, failed


def perf_checks(records: dict[str, dict], measure: tuple[str, ...] = tuple(MEASURED_BY.values())) -> list[CheckResult]:
    """network.rtt and network.throughput: nodes (every pair of theirs slow) and pairs far slower than the
    median, named with the numbers. A check whose measurement was not in MEASURE is SKIP (not measured)."""
    return [
        r if MEASURED_BY[r.name] in measure else emit(r.name, Status.SKIP, "not measured (not selected)")
        for r in _perf_checks(records)
    ]


def _perf_checks(records: dict[str, dict]) -> list[CheckResult]:
    if not any("perf" in r for r in records.values()):
        why = "one node: no pair to measure" if len(records) == 1 else "the probes did not measure the pairs"
        return [emit("network.rtt", Status.SKIP, why), emit("network.throughput", Status.SKIP, why)]
    measured, failed = perf_pairs(records)
    unmeasured = "; ".join(f"{f['a']} <-> {f['b']} ({f['error']})" for f in failed[:5]) + (
        f" and {len(failed) - 5} more" if len(failed) > 5 else ""
    )
    if not measured:
        text = f"no pair could be measured: {unmeasured}" if failed else "no pair to measure"
        status = Status.WARN if failed else Status.SKIP
        return [emit("network.rtt", status, text), emit("network.throughput", status, text)]
    rounds = max(r.get("rounds") or 0 for r in records.values())
    others = len(records) - 1
    return [
        rtt_check(measured, failed, unmeasured, rounds, others),
        throughput_check(measured, failed, unmeasured, rounds, others),
    ]


def slow_with_most(values: dict[str, list[float]], slow: Callable[[float], bool]) -> dict[str, tuple[int, int]]:
    """The nodes slow with most of the partners they were measured with (more than half of VALUES, the node's
    figures with each partner): node -> (slow partners, partners). A node slow with one partner only is not one
    of them: that is the link's doing, named as a pair."""
    counts = {node: (sum(1 for v in figures if slow(v)), len(figures)) for node, figures in values.items()}
    return {node: (k, m) for node, (k, m) in sorted(counts.items()) if k * 2 > m}


def _partners(node_slow: tuple[int, int], others: int) -> str:
    """'every node', or how many of the nodes measured with: how widely a node was found slow."""
    k, m = node_slow
    if k == m:
        return "every node" if m >= others else f"every node it was measured with ({m})"
    return f"{k} of the {m} nodes it was measured with"


def _in_rounds(rounds: int) -> str:
    return f" in {rounds} round{'s' if rounds != 1 else ''}" if rounds else ""


def rtt_check(
    measured: list[dict], failed: list[dict], unmeasured: str, rounds: int = 0, others: int = 0
) -> CheckResult:
    measured = [p for p in measured if p["rtt_ms"] is not None]
    if not measured:
        return emit("network.rtt", Status.SKIP, "no round trip was measured")
    median = _median([p["rtt_ms"] for p in measured])
    per_node: dict[str, list[float]] = {}
    for p in measured:
        for node in (p["a"], p["b"]):
            per_node.setdefault(node, []).append(p["rtt_ms"])
    best = {node: min(values) for node, values in per_node.items()}

    def slow(value: float, factor: float) -> bool:
        return value > factor * median and value > median + RTT_MARGIN_MS

    slow_nodes = slow_with_most(per_node, lambda v: slow(v, NODE_SLOWER))
    nodes = sorted(slow_nodes)
    pairs = [p for p in measured if slow(p["rtt_ms"], PAIR_SLOWER) and p["a"] not in nodes and p["b"] not in nodes]
    data = {
        "median_ms": median,
        "best_ms": best,
        "slow_nodes": nodes,
        "slow_with": {n: list(v) for n, v in slow_nodes.items()},
        "pairs": measured,
        "unmeasured": failed,
        "rounds": rounds,
    }
    measures = tuple(m for p in measured for m in RTT.of(p["rtt_ms"] / 1000, host=p["a"], peer=p["b"]))
    texts = []
    for n in nodes:
        if slow_nodes[n][0] == slow_nodes[n][1]:
            texts.append(
                f"{n}'s round trips are all slow: {best[n]:.2f} ms at best, the median pair takes {median:.2f} ms"
            )
        else:
            texts.append(
                f"{n}'s round trips are slow with {_partners(slow_nodes[n], others)}: {_median(per_node[n]):.2f} ms "
                f"typically, the median pair takes {median:.2f} ms"
            )
    texts += [f"{p['a']} <-> {p['b']} takes {p['rtt_ms']:.2f} ms, the median pair {median:.2f} ms" for p in pairs[:5]]
    if failed:
        texts.append(f"not measured: {unmeasured}")
    if texts:
        return emit("network.rtt", Status.WARN, "; ".join(texts), data=data, measures=measures)
    return emit(
        "network.rtt",
        Status.PASS,
        f"TCP round trip {_ms(median)} (median of {len(measured)} pairs{_in_rounds(rounds)}); no node or pair far "
        "above it",
        data=data,
        measures=measures,
    )


def throughput_check(
    measured: list[dict], failed: list[dict], unmeasured: str, rounds: int = 0, others: int = 0
) -> CheckResult:
    flows = []  # (sender, receiver, Mbit/s)
    for p in measured:
        if p["a_to_b"] is not None:
            flows.append((p["a"], p["b"], p["a_to_b"]))
        if p["b_to_a"] is not None:
            flows.append((p["b"], p["a"], p["b_to_a"]))
    if not flows:
        return emit("network.throughput", Status.SKIP, "no transfer was measured")
    median = _median([rate for _, _, rate in flows])
    out: dict[str, list[float]] = {}
    into: dict[str, list[float]] = {}
    for sender, receiver, rate in flows:
        out.setdefault(sender, []).append(rate)
        into.setdefault(receiver, []).append(rate)
    best_out = {n: max(rates) for n, rates in out.items()}
    best_in = {n: max(rates) for n, rates in into.items()}
    senders = slow_with_most(out, lambda rate: rate * NODE_SLOWER < median)
    receivers = slow_with_most(into, lambda rate: rate * NODE_SLOWER < median)
    slow_out, slow_in = sorted(senders), sorted(receivers)

    def node_text(node: str, does: str, found: dict[str, tuple[int, int]], rates: list[float], best: float) -> str:
        where = _partners(found[node], others)
        if found[node][0] == found[node][1]:
            return f"{node} {does} {where}: {best:.0f} Mbit/s at best, the median is {median:.0f} Mbit/s"
        return f"{node} {does} {where}: {_median(rates):.0f} Mbit/s typically, the median is {median:.0f} Mbit/s"

    texts = [node_text(n, "sends slowly to", senders, out[n], best_out[n]) for n in slow_out]
    texts += [node_text(n, "receives slowly from", receivers, into[n], best_in[n]) for n in slow_in]
    slow_pairs = [
        (s, r, rate) for s, r, rate in flows if rate * PAIR_SLOWER < median and s not in slow_out and r not in slow_in
    ]
    texts += [f"{s} -> {r} moves {rate:.0f} Mbit/s, the median is {median:.0f} Mbit/s" for s, r, rate in slow_pairs[:5]]
    if failed:
        texts.append(f"not measured: {unmeasured}")
    data = {
        "median_mbps": median,
        "best_out_mbps": best_out,
        "best_in_mbps": best_in,
        "slow_senders": slow_out,
        "slow_receivers": slow_in,
        "slow_with": {
            "senders": {n: list(v) for n, v in senders.items()},
            "receivers": {n: list(v) for n, v in receivers.items()},
        },
        "slow_pairs": [{"from": s, "to": r, "mbps": rate} for s, r, rate in slow_pairs],
        "flows": [{"from": s, "to": r, "mbps": rate} for s, r, rate in flows],
        "unmeasured": failed,
        "rounds": rounds,
    }
    measures = tuple(m for s, r, rate in flows for m in THROUGHPUT.of(rate * 1e6 / 8, host=s, peer=r))
    if texts:
        return emit("network.throughput", Status.WARN, "; ".join(texts), data=data, measures=measures)
    return emit(
        "network.throughput",
        Status.PASS,
        f"TCP throughput {median:.0f} Mbit/s (median of {len(flows)} transfers, {len(measured)} pairs"
        f"{_in_rounds(rounds)}); no node or pair far below it",
        data=data,
        measures=measures,
    )
