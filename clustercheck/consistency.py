"""Cross-node consistency: the same versions, GPU count and MTU on every node, clocks in step. Pure logic.

A mismatch names the nodes that differ from the majority, and how.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from statistics import median
from typing import Any

from clustercheck import facts as parse
from clustercheck.checks import NodeFacts
from clustercheck.model import CheckResult, Status

DEFAULT_MAX_CLOCK_OFFSET = 0.5  # seconds between any two nodes

REMEDIATION = {
    "torch": "Install the same torch on every node (one pinned version; the setup playbook's python role).",
    "cuda": "Install the same torch build (the same CUDA variant) on every node.",
    "nccl": "Use the same torch build everywhere; an NCCL mismatch hangs or corrupts collectives.",
    "driver": "Install the same pinned NVIDIA driver on every node and reboot the ones that differ.",
    "python": "Create the environment with the same Python version on every node.",
    "gpu_count": "Find the node with missing GPUs (gpu.count) or fix gpus_per_node.",
    "mtu": "Set the same MTU on the cluster interface of every node (and on the switch ports).",
}


def compare(name: str, values: dict[str, Any], what: str) -> CheckResult:
    """One consistency check over host -> value; None means the value could not be collected there."""
    known = {host: v for host, v in values.items() if v is not None}
    missing = sorted(h for h, v in values.items() if v is None)
    check = f"consistency.{name}"
    data: dict[str, Any] = {"values": values}
    if len(values) < 2:
        return CheckResult(check, Status.SKIP, f"{what}: one node, nothing to compare", data=data)
    if len(known) < 2:
        return CheckResult(check, Status.SKIP, f"{what}: known on {len(known)} node(s) only", data=data)
    counts = Counter(known.values())
    if len(counts) == 1:
        value = next(iter(counts))
        note = f" (not known on {', '.join(missing)})" if missing else ""
        return CheckResult(check, Status.PASS, f"{what} {value} on {len(known)} node(s){note}", data=data)
    (majority, top), *rest = counts.most_common()
    tie = rest and rest[0][1] == top
    differ = sorted(h for h, v in known.items() if v != majority)
    if tie:
        groups = "; ".join(
            f"{', '.join(sorted(h for h, v in known.items() if v == value))}: {value}" for value, _ in counts.items()
        )
        message = f"{what} differs between nodes, no majority ({groups})"
    else:
        how = ", ".join(f"{h} has {known[h]}" for h in differ)
        message = f"{what} differs: {how}, where the other {top} node(s) have {majority}"
    data.update(majority=None if tie else majority, differ=differ)
    return CheckResult(check, Status.FAIL, message, remediation=REMEDIATION.get(name, ""), data=data)


def _torch(key: str) -> Callable[[NodeFacts], Any]:
    def get(ctx: NodeFacts) -> Any:
        torch = ctx.torch
        return None if "error" in torch else parse.version_key(torch.get(key))

    return get


def _driver(ctx: NodeFacts) -> Any:
    smi = ctx.smi
    return smi.driver if smi else None


def _gpu_count(ctx: NodeFacts) -> Any:
    return len(ctx.smi.gpus) if ctx.smi else (0 if not ctx.gpu_expected else None)


def _python(ctx: NodeFacts) -> Any:
    return None if ctx.python_missing else ctx.raw.get("python", {}).get("version")


def cluster_interface(ctx: NodeFacts) -> tuple[str | None, str]:
    addr = ctx.command("ip_addr")
    route = ctx.command("ip_route")
    entries = parse.parse_ip_addr(addr.get("out", "")) if addr.get("rc") == 0 else []
    return parse.pick_interface(
        entries, route.get("out", ""), ctx.node.cluster_interface, ctx.node.cluster_cidr, ctx.node.address
    )


def _mtu(ctx: NodeFacts) -> Any:
    iface, _ = cluster_interface(ctx)
    mtus = ctx.raw.get("mtu") if isinstance(ctx.raw.get("mtu"), dict) else {}
    return mtus.get(iface) if iface else None


FIELDS: list[tuple[str, str, Callable[[NodeFacts], Any]]] = [
    ("torch", "torch version", _torch("version")),
    ("cuda", "torch's CUDA version", _torch("cuda")),
    ("nccl", "NCCL version", _torch("nccl")),
    ("driver", "NVIDIA driver", _driver),
    ("python", "Python version", _python),
    ("gpu_count", "GPU count", _gpu_count),
    ("mtu", "MTU of the cluster interface", _mtu),
]


def check_clocks(nodes: list[NodeFacts], bound: float = DEFAULT_MAX_CLOCK_OFFSET) -> CheckResult:
    """Clock offsets measured against the control machine must lie within BOUND of each other."""
    offsets = {n.host: n.clock_offset for n in nodes}
    known = {h: o for h, o in offsets.items() if o is not None}
    data: dict[str, Any] = {
        "offsets_s": {h: None if o is None else round(o, 4) for h, o in offsets.items()},
        "bound_s": bound,
    }
    if len(offsets) < 2:
        return CheckResult("consistency.clock", Status.SKIP, "clock offset: one node, nothing to compare", data=data)
    if len(known) < 2:
        return CheckResult("consistency.clock", Status.SKIP, "clock offset: measured on fewer than 2 nodes", data=data)
    centre = median(known.values())
    spread = max(known.values()) - min(known.values())
    data["spread_s"] = round(spread, 4)
    if spread <= bound:
        return CheckResult(
            "consistency.clock",
            Status.PASS,
            f"clocks within {spread:.3f} s of each other (bound {bound} s)",
            data=data,
        )
    off = sorted((h for h, o in known.items() if abs(o - centre) > bound / 2), key=lambda h: -abs(known[h] - centre))
    how = ", ".join(f"{h} is {known[h] - centre:+.3f} s" for h in off) or "the spread"
    return CheckResult(
        "consistency.clock",
        Status.FAIL,
        f"clocks differ by {spread:.3f} s (bound {bound} s): {how} from the median",
        remediation="Synchronize every node to the same NTP servers (chrony) and check `chronyc tracking`.",
        data=data,
    )


def run_consistency(nodes: list[NodeFacts], clock_bound: float = DEFAULT_MAX_CLOCK_OFFSET) -> list[CheckResult]:
    results = [compare(name, {n.host: get(n) for n in nodes}, what) for name, what, get in FIELDS]
    results.append(check_clocks(nodes, clock_bound))
    return results
