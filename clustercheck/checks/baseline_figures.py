"""The figures a baseline comparison reads from a report document (pure, no I/O): what each figure is, and each
node's or pair's measure of it in a report's checks, with its spread over its repetitions where the report
recorded one (checks/spread.py: the all_reduce sweep's busbw per message size, the DDP step time).
The comparison and its verdict: checks/baseline_compare.py; the checks: checks/baseline.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clustercheck.checks import gpuperf
from clustercheck.checks.collectives import size_text
from clustercheck.checks.netperf import RTT_MARGIN_MS
from clustercheck.checks.spread import Spread

BUSBW_FROM_BYTES = 1 << 20  # busbw is compared from 1 MiB on: below it the run-to-run spread exceeds a regression
GPU_PERF = "gpu_perf"  # each GPU's figures (checks/gpuperf.py), their units theirs
CLUSTER = "cluster"  # how a busbw measured across the whole cluster is named (a node's own: "node1 intra-node")
DDP_STEP = "DDP step"


@dataclass(frozen=True)
class Figure:
    """A measured figure compared with the baseline."""

    name: str  # --baseline-tolerance takes it; its check is baseline.<name>
    what: str  # how a message names it after the node or pair
    higher_is_better: bool
    warn_pct: float  # default tolerance: WARN when worse by more than this many percent
    fail_pct: float | None  # FAIL when worse by more than this (None: never FAIL)
    floor: float = 0.0  # and the change must be larger than this, in the figure's unit (sub-ms round trips jitter)

    @property
    def check(self) -> str:
        return f"baseline.{self.name}"

    def text(self, value: float, key: str) -> str:
        """VALUE of KEY (a node or pair, or a node's GPU figure) with its unit."""
        return gpuperf.shown_in(key, value) if self.name == GPU_PERF else _UNITS[self.name](value)


def _throughput(mbps: float) -> str:
    return f"{mbps / 1000:.1f} Gbit/s" if mbps >= 1000 else f"{mbps:.0f} Mbit/s"


def _seconds(value: float) -> str:
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


_UNITS = {
    "busbw": lambda v: f"{v:.3g} GB/s",
    "rtt": lambda v: f"{v:.2f} ms",
    "throughput": _throughput,
    "fabric": lambda v: f"{v:.3g} GB/s",
    "ddp_step": _seconds,
    "collector": lambda v: f"{v:.1f} s",
}

FIGURES = {
    f.name: f
    for f in (
        Figure("busbw", "", True, 10, 25),
        Figure("rtt", "round trip", False, 50, 200, floor=RTT_MARGIN_MS),
        Figure("throughput", "throughput", True, 20, 50),
        Figure("fabric", "send/recv", True, 20, 50),
        Figure("ddp_step", "", False, 20, 50),
        Figure("collector", "facts collector", False, 50, 200, floor=1.0),
        Figure(GPU_PERF, "", True, 10, 25),
    )
}


def cluster_wide(key: str) -> bool:
    """Whether the figure KEY is of the whole cluster (its all_reduce across every node, its DDP step), not of one
    node or pair: it changes with the nodes it was measured across."""
    return key.startswith(f"{CLUSTER} ") or key == DDP_STEP


@dataclass(frozen=True)
class Measure:
    """One node's or pair's figure in a report: VALUE as it was always reported (nccl-tests' mean busbw over the
    timed calls, the DDP run's mean step), and, where the report recorded the repetitions, their SPREAD (whose
    median a comparison of two such reports compares). SETTING: what makes it noisy by nature ('gloo on CPU')."""

    value: float
    spread: Spread | None = None
    setting: str = ""


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _on_cpu(backend: Any) -> str:
    """The setting of a figure measured over BACKEND: gloo is clustercheck's backend without GPUs, where the ranks
    share the node's cores with whatever else runs there."""
    return "gloo on CPU" if backend == "gloo" else ""


def figures(checks: list[dict]) -> dict[str, dict[str, Measure]]:
    """Figure name -> {node or pair -> Measure} from a report's checks (what the run measured; a SKIP measured
    nothing). Units: busbw GB/s, rtt ms, throughput Mbit/s, fabric GB/s (a node's rail), ddp_step and collector
    seconds; gpu_perf each GPU figure's own, keyed by node, bus id and figure (gpuperf.report_figures)."""
    out: dict[str, dict[str, Measure]] = {name: {} for name in FIGURES}
    for check in checks:
        if check.get("status") == "SKIP":
            continue
        name, host, data = check.get("name"), check.get("host"), check.get("data") or {}
        if name in ("allreduce.bandwidth", "allreduce.bandwidth.intra_node"):
            where = CLUSTER if host is None else f"{host} intra-node"
            for row in data.get("sizes") or []:
                size, busbw = row.get("bytes"), _number(row.get("busbw_gbps"))
                if isinstance(size, int) and size >= BUSBW_FROM_BYTES and busbw is not None:
                    measure = Measure(busbw, Spread.from_dict(row.get("spread")), _on_cpu(data.get("backend")))
                    out["busbw"][f"{where} all_reduce busbw at {size_text(size)}"] = measure
        elif name == "network.rtt":
            for pair in data.get("pairs") or []:
                rtt = _number(pair.get("rtt_ms"))
                if rtt is not None:
                    out["rtt"][" <-> ".join(sorted((pair["a"], pair["b"])))] = Measure(rtt)
        elif name == "network.throughput":
            for flow in data.get("flows") or []:
                rate = _number(flow.get("mbps"))
                if rate is not None:
                    out["throughput"][f"{flow['from']} -> {flow['to']}"] = Measure(rate)
        elif name == "fabric.pairs" and host is not None:
            for row in data.get("rails") or []:
                median = _number(row.get("median_gbps"))
                if median is not None:
                    iface = f" ({row['interface']})" if row.get("interface") else ""
                    setting = _on_cpu(data.get("backend"))
                    out["fabric"][f"{host} rail {row.get('rail')}{iface}"] = Measure(median, None, setting)
        elif name == "ddp_equivalence":
            batch, rate = _number(data.get("global_batch")), _number(data.get("ddp_samples_per_s"))
            if batch and rate:
                steps = Spread.from_dict(data.get("step_seconds"))
                out["ddp_step"][DDP_STEP] = Measure(batch / rate, steps, _on_cpu(data.get("backend")))
        elif name == "facts" and host is not None:
            seconds = _number(data.get("seconds"))
            if seconds is not None:
                out["collector"][host] = Measure(seconds)
    out[GPU_PERF] = {key: Measure(value) for key, value in gpuperf.report_figures(checks).items()}
    return out


def versions(checks: list[dict]) -> dict[str, dict[str, Any]]:
    """What the consistency checks compared: check -> {node -> value} (None where not collected)."""
    out: dict[str, dict[str, Any]] = {}
    for check in checks:
        values = (check.get("data") or {}).get("values")
        if str(check.get("name", "")).startswith("consistency.") and isinstance(values, dict):
            out[check["name"]] = values
    return out
