"""Prometheus metrics in the text exposition format, for node_exporter's textfile collector.

Write them with `-o <textfile directory>/clustercheck.prom`: the file is replaced atomically, so node_exporter
never reads half of it. Every check gets a status gauge per host; the headline measurements get metrics of their
own, with their unit in the name, wherever a check's data has them. A check this module does not know still gets
its status gauge, so a new check is monitored from its first run.

The textfile collector rejects samples with timestamps and metric families whose series differ in their label
names, so neither appears here: a cluster-wide check has an empty `host` label.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from clustercheck.model import CheckResult, Status
from clustercheck.report import Report

PREFIX = "clustercheck_"
# The status gauge's value: higher is worse, so max() over checks is the worst status.
STATUS_VALUES = {Status.PASS: 0, Status.SKIP: 1, Status.WARN: 2, Status.FAIL: 3, Status.ERROR: 4}
STATUS_HELP = ", ".join(f"{value} {status.value}" for status, value in STATUS_VALUES.items())
GB = 1e9  # busbw_gbps is in GB/s of 10^9 bytes, as nccl-tests reports it


@dataclass
class Family:
    name: str
    help: str
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)

    def add(self, value: float, **labels: str) -> None:
        self.samples.append((labels, value))


def _number(value) -> float | None:
    """VALUE as a float when it is a real number (not a bool, not missing)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _mapping(value) -> dict:
    return value if isinstance(value, dict) else {}


def _rows(value) -> list[dict]:
    return [row for row in value if isinstance(row, dict)] if isinstance(value, list) else []


def _format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1 << 53:
        return str(int(value))
    return repr(value)


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _worst(results: list[CheckResult]) -> dict[tuple[str, str], Status]:
    """One status per check and host: a check that reports several results on one host (network.tcp names each
    unreachable peer) counts with its worst."""
    worst: dict[tuple[str, str], Status] = {}
    for r in results:
        key = (r.name, r.host or "")
        if key not in worst or STATUS_VALUES[r.status] > STATUS_VALUES[worst[key]]:
            worst[key] = r.status
    return worst


def _families(report: Report) -> Iterator[Family]:
    run = Family(
        PREFIX + "run_status",
        f"Overall verdict of the last clustercheck run ({STATUS_HELP}); the status is also a label.",
    )
    run.add(STATUS_VALUES[report.status], status=report.status.value)
    yield run
    if report.started_at is not None:
        started = Family(PREFIX + "run_start_time_seconds", "When the last clustercheck run started (Unix time).")
        started.add(report.started_at)
        yield started
    if report.duration_s is not None:
        duration = Family(PREFIX + "run_duration_seconds", "How long the last clustercheck run took.")
        duration.add(report.duration_s)
        yield duration
    hosts = Family(PREFIX + "run_hosts", "Hosts the last clustercheck run checked.")
    hosts.add(len(report.hosts))
    yield hosts

    status = Family(
        PREFIX + "check_status",
        f"Outcome of a check on a host ({STATUS_HELP}); the status is also a label. "
        "host is empty for a cluster-wide check.",
    )
    for (name, host), value in _worst(report.results).items():
        status.add(STATUS_VALUES[value], check=name, host=host, status=value.value)
    yield status
    counts = Family(PREFIX + "checks", "Checks (per host) with each status in the last run.")
    for value in Status:
        counts.add(sum(1 for r in report.results if r.status is value), status=value.value)
    yield counts

    yield from _measurements(report.results)


def _measurements(results: list[CheckResult]) -> Iterator[Family]:
    busbw = Family(
        PREFIX + "allreduce_busbw_bytes_per_second",
        "all_reduce bus bandwidth (nccl-tests' busbw) by message size; host is empty for the whole cluster.",
    )
    peak = Family(PREFIX + "allreduce_busbw_peak_bytes_per_second", "Highest all_reduce bus bandwidth of the sweep.")
    param = Family(
        PREFIX + "ddp_max_abs_param_diff",
        "Largest absolute difference between the DDP model's parameters and the single-process reference's.",
    )
    efficiency = Family(
        PREFIX + "ddp_scaling_efficiency_ratio",
        "DDP samples per second over world size times the single-process reference's (1 is perfect scaling).",
    )
    clock = Family(PREFIX + "clock_offset_seconds", "A node's clock minus the control machine's clock.")
    mtu = Family(PREFIX + "network_mtu_bytes", "MTU of the node's cluster interface.")
    rtt = Family(PREFIX + "network_rtt_seconds", "TCP round trip time between two nodes (host and peer).")
    throughput = Family(PREFIX + "network_throughput_bytes_per_second", "TCP throughput measured from host to peer.")
    seen: set[tuple] = set()

    def once(family: Family, value, **labels: str) -> None:
        number = _number(value)
        key = (family.name, *sorted(labels.items()))
        if number is not None and key not in seen:
            seen.add(key)
            family.add(number, **labels)

    for r in results:
        data = _mapping(r.data)
        host = r.host or ""
        if r.name.startswith("allreduce.bandwidth"):
            for row in _rows(data.get("sizes")):
                size, gbps = _number(row.get("bytes")), _number(row.get("busbw_gbps"))
                if size is not None and math.isfinite(size) and gbps is not None:
                    once(busbw, gbps * GB, check=r.name, host=host, size_bytes=str(int(size)))
            gbps = _number(data.get("peak_busbw_gbps"))
            once(peak, None if gbps is None else gbps * GB, check=r.name, host=host)
        elif r.name == "ddp_equivalence":
            once(param, data.get("max_abs_param_diff"))
            once(efficiency, data.get("scaling_efficiency"))
        elif r.name == "consistency.clock":
            for node, offset in sorted(_mapping(data.get("offsets_s")).items()):
                once(clock, offset, host=str(node))
        elif r.name == "network.mtu":
            interfaces = _mapping(data.get("interface"))
            for node, value in sorted(_mapping(data.get("mtu")).items()):
                once(mtu, value, host=str(node), interface=str(interfaces.get(node) or ""))
        elif r.name == "network.rtt":
            for pair in _rows(data.get("pairs")):
                a, b = str(pair.get("a") or ""), str(pair.get("b") or "")
                ms = _number(pair.get("rtt_ms"))
                once(rtt, None if ms is None else ms / 1000, host=a, peer=b)
                for sender, receiver, key in ((a, b, "a_to_b"), (b, a, "b_to_a")):
                    mbps = _number(pair.get(key))
                    once(throughput, None if mbps is None else mbps * 1e6 / 8, host=sender, peer=receiver)
    yield from (f for f in (busbw, peak, param, efficiency, clock, mtu, rtt, throughput) if f.samples)


def render(report: Report) -> str:
    lines = []
    for family in _families(report):
        lines.append(f"# HELP {family.name} {_escape_help(family.help)}")
        lines.append(f"# TYPE {family.name} gauge")
        for labels, value in family.samples:
            pairs = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items())
            lines.append(
                f"{family.name}{{{pairs}}} {_format_value(value)}" if pairs else f"{family.name} {_format_value(value)}"
            )
    return "\n".join(lines)
