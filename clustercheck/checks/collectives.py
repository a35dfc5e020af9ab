"""Judge the collectives worker's per-rank records (pure logic, no I/O): correctness of all_reduce, all_gather and
broadcast with nccl-tests' #wrong count, and the all_reduce bandwidth sweep.

Bandwidth numbers speak nccl-tests: algbw = bytes / time, busbw = algbw * 2(n-1)/n, in GB/s (10^9 bytes per
second), where time is the slowest rank's mean time per all_reduce call. The check compares the peak busbw of the
sweep (in practice the largest messages) with the user's thresholds.

The same worker runs across every node (the collectives stage: allreduce, ...) and across one node's own ranks
(in the core stage: local.allreduce, ...); `evaluate` names its results for either.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustercheck.checks.registry import declare, emit
from clustercheck.checks.spread import Spread
from clustercheck.facts.model import NodeFacts
from clustercheck.model import CheckResult, Metric, Status

GB = 1e9  # busbw_gbps is in GB/s of 10^9 bytes, as nccl-tests reports it
BUSBW = Metric(
    "allreduce_busbw_bytes_per_second",
    "bytes_per_second",
    "all_reduce bus bandwidth (nccl-tests' busbw) by message size; host is empty for the whole cluster.",
)
BUSBW_PEAK = Metric(
    "allreduce_busbw_peak_bytes_per_second", "bytes_per_second", "Highest all_reduce bus bandwidth of the sweep."
)
COLLECTIVES = ("allreduce", "allgather", "broadcast")
LOCAL_PREFIX = "local."
_PROVES = {
    "allreduce": "all_reduce (sum) returns the exact expected values on every rank (#wrong 0)",
    "allgather": "all_gather returns every rank's tensor in its slot on every rank (#wrong 0)",
    "broadcast": "broadcast from the last rank reaches every rank unchanged (#wrong 0)",
}
_FIX = (
    "Look at the worker's output in the run directory; check that torch imports and that the ranks can reach "
    "each other. Wrong values point at faulty hardware or a broken NCCL/driver install."
)
for _name in COLLECTIVES:
    declare(_name, stage="collectives", scope="cluster", proves=_PROVES[_name] + ", across every node", fix=_FIX)
    declare(
        LOCAL_PREFIX + _name,
        stage="core",
        scope="node",
        proves=_PROVES[_name] + ", across one node's own GPUs (or two CPU ranks)",
        fix=_FIX,
    )
declare(
    "allreduce.bandwidth",
    stage="collectives",
    scope="cluster",
    proves="all_reduce bus bandwidth across every node (nccl-tests' busbw), judged against --min-busbw (a job of "
    "one rank moves no data: SKIP)",
    fix="Check that NCCL uses the fast interconnect (NET/IB or NVLink rather than NET/Socket in the NCCL INFO "
    "log), the link speed, the MTU, and NCCL_SOCKET_IFNAME.",
)
declare(
    "allreduce.bandwidth.intra_node",
    stage="collectives",
    scope="node",
    proves="all_reduce bus bandwidth among one node's GPUs, in a multi-node job with several GPUs per node, judged "
    "against --min-busbw, else against the busbw its GPU model's expected values give for a node of that size",
    fix="Check the GPUs' NVLink/PCIe paths (nvidia-smi topo -m) and that peer-to-peer is not blocked (ACS).",
)


def evaluate(records: list[dict], world_size: int, prefix: str = "", host: str | None = None) -> list[CheckResult]:
    """One check per collective: PASS when every rank reported zero wrong elements. PREFIX and HOST name the
    node-local variant (local.allreduce on HOST)."""
    failed = [r for r in records if not r.get("ok")]
    missing = sorted(set(range(world_size)) - {r["rank"] for r in records})
    where = f"{host}: " if host else ""
    results = []
    for name in COLLECTIVES:
        if failed or missing:
            first = failed[0] if failed else None
            cause = (
                f"rank {first['rank']} on {first['host']}: {first.get('error', 'unknown error')}"
                if first
                else f"no result from rank(s) {', '.join(map(str, missing))}"
            )
            results.append(
                emit(
                    name=prefix + name,
                    status=Status.FAIL,
                    message=f"{where}{prefix}{name} did not complete: {cause}",
                    host=host,
                    remediation="Look at the worker's output in the run directory; check that torch imports and "
                    "that the ranks can reach each other.",
                    data={
                        "world_size": world_size,
                        "failed_ranks": [r["rank"] for r in failed],
                        "missing_ranks": missing,
                    },
                )
            )
            continue
        wrong = {r["rank"]: r["checks"][name]["wrong"] for r in records}
        total_wrong = sum(wrong.values())
        elements = records[0]["checks"][name]["elements"]
        data = {
            "world_size": world_size,
            "backend": records[0].get("backend"),
            "elements": elements,
            "wrong": total_wrong,
            "wrong_by_rank": wrong,
        }
        if total_wrong:
            bad = ", ".join(f"rank {r}: {w}" for r, w in sorted(wrong.items()) if w)
            results.append(
                emit(
                    name=prefix + name,
                    status=Status.FAIL,
                    message=f"{where}{name} returned wrong values (#wrong {bad})",
                    host=host,
                    remediation="Wrong results from a collective point at faulty hardware or a broken "
                    "NCCL/driver install; rerun and compare nodes.",
                    data=data,
                )
            )
        else:
            results.append(
                emit(
                    name=prefix + name,
                    status=Status.PASS,
                    message=f"{where}{name} correct on {world_size} ranks ({elements} elements, #wrong 0)",
                    host=host,
                    data=data,
                )
            )
    return results


class ThresholdError(ValueError):
    """A --min-busbw value that cannot be read; printed as one line."""


@dataclass(frozen=True)
class Thresholds:
    fail_below: float | None = None  # GB/s busbw
    warn_below: float | None = None
    origin: str = ""  # where they come from when not from --min-busbw (a model's expected values)

    def judge(self, busbw: float) -> Status:
        if self.fail_below is not None and busbw < self.fail_below:
            return Status.FAIL
        if self.warn_below is not None and busbw < self.warn_below:
            return Status.WARN
        return Status.PASS

    def describe(self) -> str:
        parts = []
        if self.fail_below is not None:
            parts.append(f"FAIL below {self.fail_below:g}")
        if self.warn_below is not None:
            parts.append(f"WARN below {self.warn_below:g}")
        origin = f", {self.origin}" if self.origin else ""
        return ", ".join(parts) + f" GB/s{origin}" if parts else "no threshold"

    @property
    def given(self) -> bool:
        return self.fail_below is not None or self.warn_below is not None


def intra_node_thresholds(facts: NodeFacts, given: Thresholds) -> Thresholds:
    """The threshold of a node's intra-node busbw: --min-busbw (or clustercheck_min_busbw) when given, else the
    busbw its GPU model's expected values give for a node of as many GPUs as this one has, else none."""
    if given.given:
        return given
    match = facts.expected
    figure = match.model.get("intra_node_busbw") if match.model else None
    if figure and facts.gpus_present == figure["gpus"]:
        return Thresholds(warn_below=float(figure["warn_below_gbps"]), origin=match.why)
    return given


def parse_min_busbw(text: str | float | None, source: str = "--min-busbw") -> Thresholds:
    """`--min-busbw FAIL[:WARN]` in GB/s, e.g. `40` (FAIL under 40) or `40:80` (also WARN under 80).

    The same text is accepted from the inventory variable clustercheck_min_busbw; SOURCE names where it came from
    in the error.
    """
    if text is None or text == "":
        return Thresholds()
    if isinstance(text, int | float):
        return Thresholds(fail_below=float(text))
    fail_text, _, warn_text = str(text).partition(":")
    try:
        fail = float(fail_text) if fail_text.strip() else None
        warn = float(warn_text) if warn_text.strip() else None
    except ValueError:
        raise ThresholdError(f"{source} {text!r}: expected GB/s as FAIL or FAIL:WARN, e.g. 40 or 40:80") from None
    if any(v is not None and v < 0 for v in (fail, warn)):
        raise ThresholdError(f"{source} {text!r}: bandwidth cannot be negative")
    if fail is not None and warn is not None and warn < fail:
        raise ThresholdError(f"{source} {text!r}: the WARN level must not be below the FAIL level")
    return Thresholds(fail_below=fail, warn_below=warn)


def size_text(n: int) -> str:
    """A message size as nccl-tests users read it: 64 KiB, 1 MiB, 1 GiB."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def with_spread(row: dict) -> dict:
    """A sweep's row with the spread of its busbw over the timed repetitions (the worker's rep_time_us, each the
    slowest rank's mean time per call in it), in GB/s: `spread` {median, p25, p75, min, max, n}; as it was when
    the worker timed no repetitions (an older worker)."""
    times = [t for t in row.get("rep_time_us") or [] if isinstance(t, int | float) and t > 0]
    if not times or not row.get("time_us"):
        return row
    scale = row["busbw_gbps"] * row["time_us"]  # busbw is inversely proportional to the time per call
    return {**row, "spread": Spread.of([scale / t for t in times]).to_dict()}


def peak(rows: list[dict]) -> dict:
    return max(rows, key=lambda row: row["busbw_gbps"])


def _check(name: str, host: str | None, scope: str, rows: list[dict], ranks: int, backend, thresholds) -> CheckResult:
    rows = [with_spread(r) for r in rows]
    best = peak(rows)
    status = thresholds.judge(best["busbw_gbps"])
    table = ", ".join(f"{size_text(r['bytes'])}: {r['busbw_gbps']:.3g}" for r in rows)
    message = (
        f"{scope} all_reduce busbw peak {best['busbw_gbps']:.3g} GB/s at {size_text(best['bytes'])} over {ranks} ranks"
        f" ({backend}); busbw by size in GB/s: {table}"
    )
    if status is not Status.PASS:
        message = (
            f"{scope} all_reduce busbw {best['busbw_gbps']:.3g} GB/s is under the threshold ({thresholds.describe()})"
        )
    elif thresholds.origin:
        message += f"; {thresholds.describe()}"
    remediation = ""
    if status is not Status.PASS:
        remediation = (
            "Check that NCCL uses the fast interconnect (NCCL_DEBUG=INFO output in the run directory: look for "
            "NET/IB or NVLink rather than NET/Socket), the link speed (`ethtool`, `ibstat`), the MTU, and that "
            "NCCL_SOCKET_IFNAME names the cluster interface."
        )
    labels = {"check": name, "host": host or ""}
    measures = [m for r in rows for m in BUSBW.of(r["busbw_gbps"] * GB, **labels, size_bytes=str(int(r["bytes"])))]
    return emit(
        name,
        status,
        message,
        host=host,
        remediation=remediation,
        measures=(*measures, *BUSBW_PEAK.of(best["busbw_gbps"] * GB, **labels)),
        data={
            "ranks": ranks,
            "backend": backend,
            "peak_busbw_gbps": best["busbw_gbps"],
            "peak_bytes": best["bytes"],
            "sizes": rows,
            "thresholds": {"fail_below": thresholds.fail_below, "warn_below": thresholds.warn_below},
        },
    )


def evaluate_bandwidth(
    records: list[dict],
    world_size: int,
    thresholds: Thresholds | None = None,
    hosts: list[str] | None = None,
    intra_thresholds: dict[str, Thresholds] | None = None,
) -> list[CheckResult]:
    """`allreduce.bandwidth` for the whole job, and `allreduce.bandwidth.intra_node` for every node of HOSTS:
    measured on multi-GPU nodes of a multi-node job, SKIP elsewhere. INTRA_THRESHOLDS: a node's own threshold
    (intra_node_thresholds) by name, else THRESHOLDS."""
    thresholds = thresholds or Thresholds()
    hosts = hosts or []
    intra_thresholds = intra_thresholds or {}
    first = next((r for r in records if r.get("rank") == 0), None)
    if first is None or not first.get("ok") or "bandwidth" not in first:
        why = "the collectives job did not complete" if first is None or not first.get("ok") else "sweep not run"
        return [emit("allreduce.bandwidth", Status.SKIP, f"no bandwidth results: {why}")] + [
            emit("allreduce.bandwidth.intra_node", Status.SKIP, f"no bandwidth results: {why}", host=h) for h in hosts
        ]
    backend = first.get("backend")
    if world_size < 2:
        # One rank's all_reduce moves nothing: NCCL returns in microseconds whatever the size (an H200 "reached"
        # 64 TB/s), and nccl-tests' bus factor 2(n-1)/n is 0.
        results = [
            emit(
                "allreduce.bandwidth",
                Status.SKIP,
                "one rank: all_reduce moves no data, so there is no bandwidth to measure (a node with several GPUs "
                "runs one rank per GPU)",
            )
        ]
    else:
        results = [
            _check("allreduce.bandwidth", None, "cluster", first["bandwidth"]["world"], world_size, backend, thresholds)
        ]
    measured = set()
    for record in sorted(records, key=lambda r: r["rank"]):
        intra = (record.get("bandwidth") or {}).get("intra_node")
        if not intra or record["rank"] != intra["ranks"][0]:
            continue  # one report per node, from its first rank
        node = record.get("node") or record["host"]
        measured.add(node)
        results.append(
            _check(
                "allreduce.bandwidth.intra_node",
                node,
                f"{node}: intra-node",
                intra["results"],
                len(intra["ranks"]),
                backend,
                intra_thresholds.get(node, thresholds),
            )
        )
    for host in hosts:
        if host not in measured:
            results.append(
                emit(
                    "allreduce.bandwidth.intra_node",
                    Status.SKIP,
                    "measured only on nodes with several GPUs in a multi-node job",
                    host=host,
                )
            )
    return results
