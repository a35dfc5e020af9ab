"""Cross-node consistency: the same versions, GPU count and MTU on every node, clocks in step. Pure logic.

A mismatch names the nodes that differ from the majority, and how.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from statistics import median
from typing import Any

from clustercheck.checks.registry import Finding, cluster_check, fail, passed, skip, warn
from clustercheck.facts.model import NodeFacts
from clustercheck.model import Metric

DEFAULT_MAX_CLOCK_OFFSET = 0.5  # seconds between any two nodes (--max-clock-offset)


def too_few(nodes: list[NodeFacts]) -> str | None:
    """Why a cross-node check has nothing to compare: fewer than two nodes answered (NODES are those whose facts
    were collected). None when there is something to compare."""
    if len(nodes) >= 2:
        return None
    size = nodes[0].cluster_size if nodes else 0
    if size == 1:
        return "one node, nothing to compare"
    if not nodes:
        return "no node reached, nothing to compare"
    return f"{len(nodes)} of {size} nodes reached, nothing to compare"


def majority_of(values: dict[str, Any]) -> tuple[Any, bool, list[str]]:
    """Over host -> value (any hashable, None too): the value most nodes have, whether another is as common (a
    tie: no majority), and the nodes that differ from it (on a tie, every node). The one rule every consistency
    check names the odd nodes by."""
    (majority, top), *rest = Counter(values.values()).most_common()
    tie = bool(rest) and rest[0][1] == top
    return majority, tie, sorted(h for h, v in values.items() if tie or v != majority)


def compare(values: dict[str, Any], what: str) -> Finding:
    """One consistency verdict over host -> value; None means the value could not be collected there."""
    known = {host: v for host, v in values.items() if v is not None}
    missing = sorted(h for h, v in values.items() if v is None)
    data: dict[str, Any] = {"values": values}
    if len(values) < 2:
        return skip(f"{what}: {len(values)} node(s), nothing to compare", **data)
    if len(known) < 2:
        return skip(f"known on {len(known)} of {len(values)} nodes, nothing to compare", **data)
    counts = Counter(known.values())
    if len(counts) == 1:
        value = next(iter(counts))
        note = f" (not known on {', '.join(missing)})" if missing else ""
        return passed(f"{what} {value} on {len(known)} node(s){note}", **data)
    majority, tie, _ = majority_of(known)
    top = counts[majority]
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
    return fail(message, **data)


def _text(value: Any) -> str | None:
    return None if value in (None, "") else str(value)


def _same(name: str, what: str, proves: str, fix: str, get: Callable[[NodeFacts], Any]) -> None:
    @cluster_check(f"consistency.{name}", proves=proves, fix=fix)
    def check(nodes: list[NodeFacts], config: Any) -> Finding:
        values = {n.host: get(n) for n in nodes}
        few = too_few(nodes)
        return skip(few, values=values) if few else compare(values, what)


_same(
    "torch",
    "torch version",
    "every node has the same torch version",
    "Install the same torch on every node (one pinned version; the setup playbook's python role).",
    lambda f: _text(f.torch.version) if f.torch else None,
)
_same(
    "cuda",
    "torch's CUDA version",
    "every node's torch is built for the same CUDA version",
    "Install the same torch build (the same CUDA variant) on every node.",
    lambda f: _text(f.torch.cuda) if f.torch else None,
)
_same(
    "nccl",
    "NCCL version",
    "every node's torch carries the same NCCL",
    "Use the same torch build everywhere; an NCCL mismatch hangs or corrupts collectives.",
    lambda f: _text(f.torch.nccl) if f.torch else None,
)
_same(
    "driver",
    "NVIDIA driver",
    "every node runs the same NVIDIA driver version",
    "Install the same pinned NVIDIA driver on every node and reboot the ones that differ.",
    lambda f: f.smi.driver if f.smi else None,
)
_same(
    "vbios",
    "VBIOS version(s)",
    "every node's GPUs run the same VBIOS versions",
    "Flash the same VBIOS on every GPU (nvflash, or the vendor's firmware bundle); a GPU back from repair often "
    "returns with another VBIOS.",
    lambda f: ", ".join(sorted({g.vbios or "?" for g in f.smi.gpus})) if f.smi and f.smi.gpus else None,
)
_same(
    "python",
    "Python version",
    "every node's environment has the same Python version",
    "Create the environment with the same Python version on every node.",
    lambda f: None if f.python_missing else f.python_version,
)


@cluster_check(
    "consistency.image",
    proves="with --container: every node has the same image (the same image ID)",
    fix="Pull the image by its digest (docker pull NAME@sha256:...) on the nodes that differ, or docker save it on a "
    "node that has the right one and docker load it there; then every node runs the same image.",
)
def image(nodes: list[NodeFacts], config: Any) -> Finding:
    few = too_few(nodes)
    if few:
        return skip(few)
    asked = next((n.image.image for n in nodes if n.image), None)
    if asked is None:
        return skip("no --container image")
    return compare({n.host: n.image.id if n.image else None for n in nodes}, f"image {asked} ID")


_same(
    "gpu_count",
    "GPU count",
    "every node has the same number of GPUs",
    "Find the node with missing GPUs (gpu.count) or fix gpus_per_node.",
    lambda f: len(f.smi.gpus) if f.smi else (0 if not f.gpu_expected else None),
)
_same(
    "mtu",
    "MTU of the cluster interface",
    "the cluster interface has the same MTU on every node",
    "Set the same MTU on the cluster interface of every node (and on the switch ports).",
    lambda f: (f.mtus or {}).get(f.interface) if f.interface else None,
)


@cluster_check(
    "consistency.clock",
    proves="the nodes' clocks, measured from the control machine, lie within --max-clock-offset of each other",
    fix="Synchronize every node to the same NTP servers (chrony) and check `chronyc tracking`.",
)
def clocks(nodes: list[NodeFacts], config: Any) -> Finding:
    finding = _clocks(nodes, config)
    offsets = sorted(finding.data["offsets_s"].items())
    return replace(finding, measures=tuple(m for host, o in offsets for m in CLOCK_OFFSET.of(o, host=host)))


CLOCK_OFFSET = Metric("clock_offset_seconds", "seconds", "A node's clock minus the control machine's clock.")


def _clocks(nodes: list[NodeFacts], config: Any) -> Finding:
    bound = getattr(config, "clock_bound", DEFAULT_MAX_CLOCK_OFFSET)
    offsets = {n.host: n.clock_offset for n in nodes}
    known = {h: o for h, o in offsets.items() if o is not None}
    data: dict[str, Any] = {
        "offsets_s": {h: None if o is None else round(o, 4) for h, o in offsets.items()},
        "bound_s": bound,
    }
    few = too_few(nodes)
    if few:
        return skip(few, **data)
    if len(known) < 2:
        return skip(f"known on {len(known)} of {len(offsets)} nodes, nothing to compare", **data)
    # Each offset is known to within half the round trip it was read over (a slow answer, many srun steps started
    # at once on a busy login node, reads coarser): only a difference beyond that is a difference.
    error = {n.host: n.clock_uncertainty or 0.0 for n in nodes if n.host in known}
    centre = median(known.values())
    spread = max(known.values()) - min(known.values())
    certain = max(o - error[h] for h, o in known.items()) - min(o + error[h] for h, o in known.items())
    data["spread_s"] = round(spread, 4)
    data["error_s"] = round(max(error.values()), 4)
    if spread <= bound:
        return passed(f"clocks within {spread:.3f} s of each other (bound {bound} s)", **data)
    if certain <= bound:
        return passed(
            f"no two clocks known to differ by more than {bound} s: within {spread:.3f} s of each other as "
            f"measured, each to within {max(error.values()):.3f} s (half the time its answer took)",
            **data,
        )
    off = [h for h, o in known.items() if abs(o - centre) - error[h] > bound / 2]
    off.sort(key=lambda h: -abs(known[h] - centre))
    how = ", ".join(f"{h} is {known[h] - centre:+.3f} s" for h in off) or "the spread"
    return fail(f"clocks differ by {spread:.3f} s (bound {bound} s): {how} from the median", **data)


PACKAGE_LIST_LIMIT = 12  # packages named in the message; the data has them all


@cluster_check(
    "consistency.packages",
    proves="every node's environment has the same Python packages (pip) and conda packages at the same versions",
    fix="Install the environment from one lock file on every node (pip install -r requirements.txt with pinned "
    "versions, or conda env create -f environment.yml); the full lists are in the run directory "
    "(hosts/<node>/packages.txt).",
)
def packages(nodes: list[NodeFacts], config: Any) -> Finding:
    lists = {}
    for n in nodes:
        if n.packages is None:
            continue
        entries = {f"pip:{k}": v for k, v in n.packages.pip.items()}
        entries.update({f"conda:{k}": v for k, v in (n.packages.conda or {}).items()})
        lists[n.host] = entries
    unknown = sorted(n.host for n in nodes if n.packages is None)
    data: dict[str, Any] = {"not_collected": unknown}
    few = too_few(nodes)
    if few:
        return skip(few, **data)
    if len(lists) < 2:
        return skip(f"known on {len(lists)} of {len(nodes)} nodes, nothing to compare", **data)
    names = sorted({name for entries in lists.values() for name in entries})
    drift, versions = [], []  # versions: packages every node has, at more than one version
    for name in names:
        values = {host: entries.get(name) for host, entries in lists.items()}
        counts = Counter(values.values())
        if len(counts) == 1:
            continue
        majority, tie, odd = majority_of(values)
        differ = {h: values[h] for h in odd}
        drift.append({"package": name, "majority": None if tie else majority, "tie": tie, "nodes": differ})
        if None not in counts:
            versions.append(drift[-1])
    data["differ"] = drift
    if not drift:
        return passed(f"{len(names)} package(s) at the same versions on {len(lists)} node(s)", **data)
    # A package at another version on some node runs other code on that node's ranks: a failure. A package that
    # some nodes lack (an extra tool, a missing import) is a warning: a missing one fails loudly when imported.
    drift = versions + [d for d in drift if d not in versions]
    shown = [_drift_text(d) for d in drift[:PACKAGE_LIST_LIMIT]]
    more = f"; and {len(drift) - PACKAGE_LIST_LIMIT} more" if len(drift) > PACKAGE_LIST_LIMIT else ""
    message = f"{len(drift)} package(s) differ between nodes: " + "; ".join(shown) + more
    data["differ"] = drift
    return (fail if versions else warn)(message, **data)


def _drift_text(d: dict[str, Any]) -> str:
    name = d["package"].split(":", 1)[1] + (" (conda)" if d["package"].startswith("conda:") else "")
    how = ", ".join(f"{h} has {v or 'none'}" for h, v in sorted(d["nodes"].items()))
    if d["tie"]:
        return f"{name}: {how}, no majority"
    return f"{name}: {how}, the others {d['majority'] or 'none'}"
